"""sparkbeam.io: sources and sinks that run natively on sparkbeam.

``WriteToFilesOnCheckpoint`` (``files``): line files that appear only once committed.
``ReadFromKafka`` / ``WriteToKafka`` (``kafka_read``, ``kafka_write``): Kafka over
``confluent-kafka`` (librdkafka), no Java; needs the ``kafka`` extra.
"""

from __future__ import annotations

from sparkbeam.io.files import WriteToFilesOnCheckpoint
from sparkbeam.io.kafka_read import ReadFromKafka
from sparkbeam.io.kafka_write import WriteToKafka

__all__ = ["ReadFromKafka", "WriteToFilesOnCheckpoint", "WriteToKafka"]

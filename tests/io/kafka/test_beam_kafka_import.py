"""A pipeline written with Beam's own (Java) Kafka transforms fails at once on sparkbeam,
with one line naming sparkbeam.io's transform, instead of after fetching the expansion jar."""

from __future__ import annotations

import time

import apache_beam as beam
import pytest
from apache_beam.io.kafka import ReadFromKafka, WriteToKafka
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam._beam_kafka import BeamKafkaOnSparkbeamError
from tests.conftest import spark_test_options


def test_beam_read_from_kafka_names_the_native_transform():
    p = beam.Pipeline(options=PipelineOptions(spark_test_options()))
    started = time.monotonic()
    with pytest.raises(BeamKafkaOnSparkbeamError, match=r"^apache_beam\.io\.kafka\.ReadFromKafka"
                       r" .*`from sparkbeam\.io import ReadFromKafka`"):  # fmt: skip
        _ = p | ReadFromKafka(consumer_config={"bootstrap.servers": "localhost:1"}, topics=["t"])
    assert time.monotonic() - started < 2.0
    assert "\n" not in str(BeamKafkaOnSparkbeamError("ReadFromKafka"))


def test_beam_write_to_kafka_names_the_native_transform():
    p = beam.Pipeline(options=PipelineOptions(spark_test_options()))
    with pytest.raises(
        BeamKafkaOnSparkbeamError, match=r"`from sparkbeam\.io import WriteToKafka`"
    ):
        _ = (
            p
            | beam.Create([(b"k", b"v")])
            | WriteToKafka(producer_config={"bootstrap.servers": "localhost:1"}, topic="t")
        )

"""A partition the broker is slow to fetch from: the read waits longer and keeps reading, or
says at WARNING, on the driver, that it makes no progress and why.

Tansu (the test broker) answers a fetch of a partition of many small record batches with
nothing when ``fetch.wait.max.ms`` is shorter than its scan of them: at 30,000 one-record
batches, 5 ms (the source's starting wait) returns nothing at all, 50 ms reads them all.
"""

from __future__ import annotations

import uuid

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from sparkbeam.io import ReadFromKafka
from sparkbeam.io.errors import KafkaReadStalledWarning
from tests.conftest import spark_test_options

pytestmark = [pytest.mark.spark, pytest.mark.slow]

BATCHES = 30_000


@pytest.fixture(scope="module")
def many_batches(kafka_broker) -> str:
    """A one-partition topic of ``BATCHES`` records, each in its own record batch."""
    from confluent_kafka import Producer

    topic = "batches-" + uuid.uuid4().hex[:8]
    kafka_broker.create_topic(topic, 1)
    one_per_batch = {"linger.ms": "0", "batch.num.messages": "1", "enable.idempotence": "false"}
    producer = Producer(kafka_broker.config(**one_per_batch))
    for i in range(BATCHES):
        while True:
            try:
                producer.produce(topic, value=b"%d" % i, partition=0)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(60) == 0, "records not acknowledged by the test broker"
    return topic


def test_a_partition_of_30000_one_record_batches_is_read_whole_with_default_flags(
    spark, kafka_broker, many_batches
):
    """The read's flags are the defaults; ``max_read_time`` bounds a stalled read, so the
    whole partition is read within a minute of the listing (the code before read nothing in
    that minute: every 5 ms fetch came back empty, and it replaced its consumer and waited;
    now about 25 s on 2 loaded cores, 6 s for the read alone)."""
    config = kafka_broker.config(**{"auto.offset.reset": "earliest"})
    with beam.Pipeline(options=PipelineOptions(spark_test_options())) as p:
        values = (
            p
            | ReadFromKafka(config, [many_batches], max_num_records=BATCHES, max_read_time=60)
            | beam.MapTuple(lambda k, v: int(v))
        )
        count = values | beam.Distinct() | beam.combiners.Count.Globally()
        assert_that(count, equal_to([BATCHES]))
        total = values | "All" >> beam.combiners.Count.Globally()
        assert_that(total, equal_to([BATCHES]), label="once")


def test_a_partition_that_cannot_be_read_is_named_on_the_driver_at_warning(
    spark, kafka_broker, many_batches
):
    """``max_fetch_wait_ms=5`` keeps the wait where Tansu answers nothing: the partition lags
    and makes no progress, so after ``stall_warning_s`` the driver gets one warning naming it,
    its position and end offset, and what the read does."""
    config = kafka_broker.config(**{"auto.offset.reset": "earliest"})
    with pytest.warns(KafkaReadStalledWarning) as caught:
        with beam.Pipeline(options=PipelineOptions(spark_test_options())) as p:
            _ = p | ReadFromKafka(
                config, [many_batches], max_read_time=6, max_fetch_wait_ms=5, stall_warning_s=2
            )
    stalled = [str(w.message) for w in caught if w.category is KafkaReadStalledWarning]
    assert len(stalled) == 1, stalled  # at most one a minute per partition
    assert f"Kafka partition {many_batches}-0 has made no progress for " in stalled[0]
    assert "records wait past its position: position 0, end offset 30000 " in stalled[0]
    assert "every fetch came back empty at fetch.wait.max.ms=5 (max_fetch_wait_ms=5)" in stalled[0]

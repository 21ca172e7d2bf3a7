"""``sparkbeam.io.ReadFromKafka`` in batch pipelines on SparkCheckpointRunner (real broker)."""

from __future__ import annotations

import uuid

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from sparkbeam.io import ReadFromKafka
from tests.conftest import spark_test_options

pytestmark = pytest.mark.spark

BASE_MS = 1_700_000_000_000


def _topic(kafka_broker, partitions: int, per_partition: int) -> str:
    topic = "batch-" + uuid.uuid4().hex[:8]
    kafka_broker.create_topic(topic, partitions)
    for p in range(partitions):
        records = [(b"%d" % p, b"%d-%d" % (p, i), BASE_MS + i) for i in range(per_partition)]
        kafka_broker.produce(topic, records, partition=p)
    return topic


def test_max_num_records_reads_every_record_once(spark, kafka_broker, tmp_path):
    topic = _topic(kafka_broker, 3, 40)
    config = kafka_broker.config(**{"auto.offset.reset": "earliest"})
    options = PipelineOptions(spark_test_options("--parallelism=2"))
    with beam.Pipeline(options=options) as p:
        values = (
            p
            | ReadFromKafka(config, [topic], max_num_records=120)
            | beam.MapTuple(lambda k, v: v.decode())
        )
        expected = [f"{p}-{i}" for p in range(3) for i in range(40)]
        assert_that(values, equal_to(expected))
        # A bounded read is a bounded PCollection: a global combine applies to it.
        count = values | beam.combiners.Count.Globally()
        assert_that(count, equal_to([120]), label="count")


def test_with_metadata_rows_carry_position_time_and_headers(spark, kafka_broker):
    topic = _topic(kafka_broker, 1, 3)
    config = kafka_broker.config(**{"auto.offset.reset": "earliest"})
    options = PipelineOptions(spark_test_options())
    with beam.Pipeline(options=options) as p:
        rows = p | ReadFromKafka(
            config, [topic], max_num_records=3, with_metadata=True,
            timestamp_policy=ReadFromKafka.create_time_policy,
            key_deserializer="org.apache.kafka.common.serialization.StringDeserializer",
        )  # fmt: skip
        got = rows | beam.Map(
            lambda r, ts=beam.DoFn.TimestampParam: (
                r.topic, r.partition, r.offset, r.timestamp, r.timestampTypeName, r.key,
                r.value, ts.micros // 1000,
            )
        )  # fmt: skip
        expected = [
            (topic, 0, i, BASE_MS + i, "CreateTime", "0", b"0-%d" % i, BASE_MS + i)
            for i in range(3)
        ]
        assert_that(got, equal_to(expected))


def test_commit_offset_in_finalize_commits_to_the_group(spark, kafka_broker):
    from confluent_kafka import TopicPartition

    from sparkbeam.io import kafka_client

    topic = _topic(kafka_broker, 2, 10)
    group = "g-" + uuid.uuid4().hex[:8]
    config = kafka_broker.config(**{"auto.offset.reset": "earliest", "group.id": group})
    options = PipelineOptions(spark_test_options())
    with beam.Pipeline(options=options) as p:
        _ = p | ReadFromKafka(config, [topic], max_num_records=20, commit_offset_in_finalize=True)
    client = kafka_client.consumer(kafka_broker.config(**{"group.id": group}))
    committed = client.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
    assert [tp.offset for tp in committed] == [10, 10]


def test_stop_offsets_and_stop_read_time_end_partitions_inside_a_polled_batch(spark, kafka_broker):
    """A partition's stop lies inside the batch one poll returns: the records before it are
    read, none after (a batch is claimed at once, up to the stop)."""
    topic = _topic(kafka_broker, 2, 50)
    config = kafka_broker.config(**{"auto.offset.reset": "earliest"})
    options = PipelineOptions(spark_test_options("--parallelism=2"))
    with beam.Pipeline(options=options) as p:
        by_offset = p | "ByOffset" >> ReadFromKafka(
            config, [topic], stop_offsets={(topic, 0): 17, (topic, 1): 33}
        )
        by_time = p | "ByTime" >> ReadFromKafka(
            config, [topic], stop_read_time=BASE_MS + 21,
            timestamp_policy=ReadFromKafka.create_time_policy,
        )  # fmt: skip
        expected = [f"0-{i}" for i in range(17)] + [f"1-{i}" for i in range(33)]
        assert_that(by_offset | "V1" >> beam.MapTuple(lambda k, v: v.decode()), equal_to(expected))
        expected = [f"{p}-{i}" for p in range(2) for i in range(21)]
        assert_that(
            by_time | "V2" >> beam.MapTuple(lambda k, v: v.decode()),
            equal_to(expected),
            label="by time",
        )


def test_a_batch_claim_stops_at_the_restriction_and_after_a_split():
    """`ClaimUpTo` claims up to the range's stop; a runner's split between two batches moves
    the stop, and the next claim ends there; a range already done claims nothing."""
    from apache_beam.io.restriction_trackers import OffsetRange

    from sparkbeam.io.kafka_restrictions import ClaimUpTo, KafkaOffsetTracker

    tracker = KafkaOffsetTracker(OffsetRange(10, 40))
    first = ClaimUpTo(14)
    assert tracker.try_claim(first) and first.claimed == 14
    primary, residual = tracker.try_split(0.5)  # the remainder's half: [10, 27) and [27, 40)
    assert (primary.stop, residual.start) == (27, 27)
    second = ClaimUpTo(35)
    assert tracker.try_claim(second) and second.claimed == 26
    assert not tracker.try_claim(ClaimUpTo(50))
    tracker.check_done()


def test_max_read_time_bounds_a_read_that_would_never_end(spark, kafka_broker):
    """Beam's ``max_read_time``: an otherwise unbounded read of a topic nobody writes to ends
    about that long after it starts, with every record there was, and is a bounded
    PCollection (a global combine applies)."""
    import time

    topic = _topic(kafka_broker, 2, 10)
    config = kafka_broker.config(**{"auto.offset.reset": "earliest"})
    options = PipelineOptions(spark_test_options("--parallelism=2"))
    started = time.monotonic()
    with beam.Pipeline(options=options) as p:
        values = (
            p
            | ReadFromKafka(config, [topic], max_read_time=2, idle_resume_delay_s=0.5)
            | beam.MapTuple(lambda k, v: v.decode())
        )
        assert_that(values, equal_to([f"{p}-{i}" for p in range(2) for i in range(10)]))
        count = values | beam.combiners.Count.Globally()
        assert_that(count, equal_to([20]), label="count")
    assert 2 <= time.monotonic() - started < 30

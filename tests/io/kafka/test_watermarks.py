"""ReadFromKafka's per-partition watermarks: record times drive event-time windows, and a
partition with no records does not hold them back (its watermark moves on processing time
once it is caught up)."""

from __future__ import annotations

import time
import uuid

import apache_beam as beam
import pytest
from apache_beam.transforms import window

from sparkbeam.io import ReadFromKafka, WriteToFilesOnCheckpoint
from tests.io.kafka.streaming_job import streaming_options, wait_for_exactly

pytestmark = [pytest.mark.spark, pytest.mark.slow]

BASE_MS = 1_700_000_000_000  # a multiple of 10 s: records 0..9 s after it share one window


def test_event_time_window_fires_although_one_partition_is_empty(spark, kafka_broker, tmp_path):
    topic = "wm-" + uuid.uuid4().hex[:8]
    kafka_broker.create_topic(topic, 2)
    records = [(None, b"x", BASE_MS + 1000 * i) for i in range(15)]  # windows [0,10) [10,20)
    kafka_broker.produce(topic, records, partition=0)  # partition 1 stays empty
    p = beam.Pipeline(options=streaming_options(tmp_path))
    config = kafka_broker.config(**{"auto.offset.reset": "earliest"})
    _ = (
        p
        | ReadFromKafka(
            config,
            [topic],
            timestamp_policy=ReadFromKafka.create_time_policy,
            idle_resume_delay_s=0.1,
        )  # fmt: skip
        | beam.WindowInto(window.FixedWindows(10))
        | beam.Map(lambda kv: ("n", 1))
        | beam.CombinePerKey(sum)
        | beam.Map(
            lambda kv, w=beam.DoFn.WindowParam: f"{int(w.start.micros // 1000 - BASE_MS)} {kv[1]}"
        )
        | WriteToFilesOnCheckpoint(str(tmp_path / "out" / "out"))
    )
    run = p.run()
    try:
        wait_for_exactly(str(tmp_path / "out"), ["0 10", "10000 5"], run)
    finally:
        run.cancel()


def test_a_record_stamped_before_the_partition_went_idle_is_on_time_within_max_delay(
    spark, kafka_broker, tmp_path
):
    """A producer stamps a record, then it reaches the broker after the partition was found
    caught up: with ``max_delay_s`` the idle watermark stays that far behind, so the record
    still counts in its 1 s window (without it the window closed with one record)."""
    topic = "wm-late-" + uuid.uuid4().hex[:8]
    kafka_broker.create_topic(topic, 1)
    stamp_ms = int(time.time() * 1000)
    kafka_broker.produce(topic, [(None, b"a", stamp_ms)])
    p = beam.Pipeline(options=streaming_options(tmp_path))
    config = kafka_broker.config(**{"auto.offset.reset": "earliest", "group.id": topic})
    _ = (
        p
        | ReadFromKafka(
            config,
            [topic],
            timestamp_policy=ReadFromKafka.create_time_policy,
            idle_resume_delay_s=0.1,
            max_delay_s=8,
            commit_offset_in_finalize=True,
        )  # fmt: skip
        | beam.WindowInto(window.FixedWindows(1))
        | beam.Map(lambda kv: ("n", 1))
        | beam.CombinePerKey(sum)
        | beam.Map(lambda kv: f"{kv[1]}")
        | WriteToFilesOnCheckpoint(str(tmp_path / "out" / "out"))
    )
    run = p.run()
    try:
        _wait_until_committed(config, topic, 1)  # the first record is read
        time.sleep(2)  # the partition is found caught up, many times over
        kafka_broker.produce(topic, [(None, b"b", stamp_ms)])  # the lagging producer's record
        wait_for_exactly(str(tmp_path / "out"), ["2"], run)
    finally:
        run.cancel()


def _wait_until_committed(config: dict, topic: str, offset: int, timeout_s: float = 60) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(config)
    try:
        deadline = time.monotonic() + timeout_s
        while consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset < offset:
            assert time.monotonic() < deadline, f"{topic} was not read to offset {offset}"
            time.sleep(0.1)
    finally:
        consumer.close()

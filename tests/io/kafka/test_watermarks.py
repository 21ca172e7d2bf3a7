"""ReadFromKafka's per-partition watermarks: record times drive event-time windows, and a
partition with no records does not hold them back (its watermark moves on processing time
once it is caught up)."""

from __future__ import annotations

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

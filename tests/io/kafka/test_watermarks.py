"""ReadFromKafka's per-partition watermarks: record times drive event-time windows, and a
partition with no records does not hold them back (its watermark moves on processing time
once it is caught up)."""

from __future__ import annotations

import time
import uuid
from collections import Counter

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window

from sparkbeam.io import ReadFromKafka, WriteToFilesOnCheckpoint
from tests.conftest import spark_test_options
from tests.io.kafka.kafka_pipeline import visible

pytestmark = [pytest.mark.spark, pytest.mark.slow]

BASE_MS = 1_700_000_000_000  # a multiple of 10 s: records 0..9 s after it share one window


def test_event_time_window_fires_although_one_partition_is_empty(spark, kafka_broker, tmp_path):
    topic = "wm-" + uuid.uuid4().hex[:8]
    kafka_broker.create_topic(topic, 2)
    records = [(None, b"x", BASE_MS + 1000 * i) for i in range(15)]  # windows [0,10) [10,20)
    kafka_broker.produce(topic, records, partition=0)  # partition 1 stays empty
    options = PipelineOptions(
        spark_test_options(
            "--streaming", f"--checkpoint_dir={tmp_path / 'ckpt'}", "--checkpoint_interval_s=0.05"
        )
    )
    p = beam.Pipeline(options=options)
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
        deadline = time.monotonic() + 120
        while visible(str(tmp_path / "out")) != Counter(["0 10", "10000 5"]):
            assert time.monotonic() < deadline, (visible(str(tmp_path / "out")), run.state)
            time.sleep(0.2)
    finally:
        run.cancel()

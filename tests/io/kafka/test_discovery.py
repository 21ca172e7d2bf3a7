"""ReadFromKafka with ``topic_pattern`` and ``dynamic_read_poll_interval_seconds``: a topic
that appears while the job runs is read, every record once, also across a restart (each
partition's "seen" state and offsets are in the checkpoint). Tansu cannot add partitions to a
topic (``CreatePartitions`` is unsupported), so a new topic stands for new partitions: both
are found by the same listing."""

from __future__ import annotations

import re
import time
import uuid
from collections import Counter

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.io import ReadFromKafka, WriteToFilesOnCheckpoint
from tests.conftest import spark_test_options
from tests.io.kafka.kafka_pipeline import visible

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _run(kafka_broker, prefix: str, tmp_path):
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
            config, [], topic_pattern=re.escape(prefix) + r"-\w+",
            dynamic_read_poll_interval_seconds=0.5, idle_resume_delay_s=0.1,
        )
        | beam.MapTuple(lambda _key, value: value.decode())
        | WriteToFilesOnCheckpoint(str(tmp_path / "out" / "out"))
    )  # fmt: skip
    return p.run()


def _produce(kafka_broker, topic: str, partitions: int, first: int, count: int) -> list[str]:
    values = []
    for p in range(partitions):
        batch = [f"{topic}/{p}/{i}" for i in range(first, first + count)]
        kafka_broker.produce(topic, [(None, v.encode(), None) for v in batch], partition=p)
        values += batch
    return values


def _wait_for(tmp_path, expected: list[str], run) -> None:
    deadline = time.monotonic() + 120
    while (seen := visible(str(tmp_path / "out"))) != Counter(expected):
        assert not set(seen) - set(expected) and max(seen.values(), default=1) == 1, seen
        assert time.monotonic() < deadline, (sorted(set(expected) - set(seen)), run.state)
        time.sleep(0.2)


def test_a_topic_that_appears_while_the_job_runs_is_read_once_also_after_a_restart(
    spark, kafka_broker, tmp_path
):
    prefix = "disc-" + uuid.uuid4().hex[:8]
    kafka_broker.create_topic(f"{prefix}-a", 1)
    kafka_broker.create_topic(f"other-{prefix}-a", 1)  # matches no pattern: never read
    _produce(kafka_broker, f"other-{prefix}-a", 1, 0, 3)
    expected = _produce(kafka_broker, f"{prefix}-a", 1, 0, 3)
    run = _run(kafka_broker, prefix, tmp_path)
    try:
        _wait_for(tmp_path, expected, run)
        kafka_broker.create_topic(f"{prefix}-b", 2)
        expected += _produce(kafka_broker, f"{prefix}-b", 2, 0, 4)
        _wait_for(tmp_path, expected, run)
    finally:
        run.cancel()
    # Stopped; records arrive in the known topics and a new one, then the job restarts.
    expected += _produce(kafka_broker, f"{prefix}-a", 1, 3, 2)
    expected += _produce(kafka_broker, f"{prefix}-b", 2, 4, 2)
    kafka_broker.create_topic(f"{prefix}-c", 1)
    expected += _produce(kafka_broker, f"{prefix}-c", 1, 0, 2)
    run = _run(kafka_broker, prefix, tmp_path)
    try:
        _wait_for(tmp_path, expected, run)
    finally:
        run.cancel()

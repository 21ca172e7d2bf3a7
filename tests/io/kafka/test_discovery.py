"""ReadFromKafka with ``topic_pattern`` and ``dynamic_read_poll_interval_seconds``: a topic
that appears while the job runs is read, every record once, also across a restart (each
partition's "seen" state and offsets are in the checkpoint). Tansu cannot add partitions to a
topic (``CreatePartitions`` is unsupported), so a new topic stands for new partitions: both
are found by the same listing."""

from __future__ import annotations

import re
import uuid

import apache_beam as beam
import pytest

from sparkbeam.io import ReadFromKafka, WriteToFilesOnCheckpoint
from tests.io.kafka.streaming_job import streaming_options, wait_for_exactly

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _run(kafka_broker, prefix: str, tmp_path):
    p = beam.Pipeline(options=streaming_options(tmp_path))
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
        wait_for_exactly(str(tmp_path / "out"), expected, run)
        kafka_broker.create_topic(f"{prefix}-b", 2)
        expected += _produce(kafka_broker, f"{prefix}-b", 2, 0, 4)
        wait_for_exactly(str(tmp_path / "out"), expected, run)
    finally:
        run.cancel()
    # Stopped; records arrive in the known topics and a new one, then the job restarts.
    expected += _produce(kafka_broker, f"{prefix}-a", 1, 3, 2)
    expected += _produce(kafka_broker, f"{prefix}-b", 2, 4, 2)
    kafka_broker.create_topic(f"{prefix}-c", 1)
    expected += _produce(kafka_broker, f"{prefix}-c", 1, 0, 2)
    run = _run(kafka_broker, prefix, tmp_path)
    try:
        wait_for_exactly(str(tmp_path / "out"), expected, run)
    finally:
        run.cancel()

"""Per-partition startpoints on ReadFromKafka: offset, timestamp, oldest and upcoming.

A streaming job reads a 4-partition topic and is cancelled; while it is down the operator sets
one startpoint of each kind, one per partition (``--key <topic>-<partition>``), and the log
grows; the restarted job reads from exactly those positions. Tansu answers timestamp lookups
wrongly, so the timestamp kind also checks ``kafka_client.offset_for_time``'s workaround.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState

from sparkbeam.checkpoint import open_store
from sparkbeam.io import ReadFromKafka, WriteToFilesOnCheckpoint
from sparkbeam.runner.cli import main as cli
from tests.conftest import spark_test_options
from tests.io.kafka.kafka_pipeline import visible

pytestmark = [pytest.mark.spark, pytest.mark.slow]

BASE_MS = 1_700_000_000_000
SOURCE, PIPELINE = "Kafka/Read", "pipeline-0"
TIMEOUT_S = 120.0


def _produce(kafka_broker, topic, partition, start, stop):
    records = [(None, b"x", BASE_MS + 1000 * i) for i in range(start, stop)]
    kafka_broker.produce(topic, records, partition=partition)


def _start(kafka_broker, topic, ckpt, out):
    options = PipelineOptions(
        spark_test_options(
            "--streaming",
            f"--checkpoint_dir={ckpt}",
            "--checkpoint_interval_s=0.05",
            "--parallelism=2",
        )  # fmt: skip
    )
    p = beam.Pipeline(options=options)
    config = kafka_broker.config(**{"auto.offset.reset": "earliest"})
    _ = (
        p
        | "Kafka" >> ReadFromKafka(config, [topic], with_metadata=True, idle_resume_delay_s=0.1)
        | beam.Map(lambda r: f"{r.partition} {r.offset}")
        | WriteToFilesOnCheckpoint(out + "/out")
    )
    return p.run()


def _wait_for(condition, what):
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _lines(partition, start, stop) -> Counter:
    return Counter(f"{partition} {i}" for i in range(start, stop))


def test_each_startpoint_kind_per_partition(spark, kafka_broker, tmp_path):
    topic = "sp-" + uuid.uuid4().hex[:8]
    kafka_broker.create_topic(topic, 4)
    for p in range(4):
        _produce(kafka_broker, topic, p, 0, 20)
    ckpt, out1, out2 = str(tmp_path / "ckpt"), str(tmp_path / "out1"), str(tmp_path / "out2")
    run = _start(kafka_broker, topic, ckpt, out1)
    first = sum((_lines(p, 0, 20) for p in range(4)), Counter())
    _wait_for(lambda: visible(out1) == first, "run 1 to read 0..19 of every partition")
    assert run.cancel() == PipelineState.CANCELLED
    for p in range(4):
        _produce(kafka_broker, topic, p, 20, 30)

    def set_startpoint(partition, *args):
        cmd = ["startpoints", "set", "--checkpoint_dir", ckpt, "--pipeline", PIPELINE]
        assert cli([*cmd, "--transform", SOURCE, "--key", f"{topic}-{partition}", *args]) == 0

    set_startpoint(0, "--kind", "offset", "--value", "5")
    set_startpoint(1, "--kind", "timestamp", "--value", str(BASE_MS + 12_000))
    set_startpoint(2, "--kind", "oldest")
    set_startpoint(3, "--kind", "upcoming")
    run = _start(kafka_broker, topic, ckpt, out2)
    second = _lines(0, 5, 30) + _lines(1, 12, 30) + _lines(2, 0, 30)  # 3 skips 20..29
    _wait_for(lambda: visible(out2) == second, "run 2 to read from each startpoint")
    _produce(kafka_broker, topic, 3, 30, 32)  # after upcoming: read
    _wait_for(lambda: visible(out2) == second + _lines(3, 30, 32), "partition 3's new records")
    with open_store(ckpt, read_only=True) as store:
        assert store.startpoints.list() == []  # each consumed by a committed checkpoint
    run.cancel()

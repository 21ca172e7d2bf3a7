"""Kafka -> files across driver kills: SIGKILL the streaming driver at chosen crash points,
run the same command again (also at another --parallelism), and the visible output is
exactly the produced records, each once. Offsets live in the checkpoint, not the broker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections import Counter

import pytest

from tests.conftest import TEST_MASTER
from tests.io.kafka.kafka_pipeline import topic_records, visible

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PARTITIONS, PER_PARTITION = 3, 30


def _run(
    kafka_broker, topic, tmp, parallelism, crash_at=None, output_topic=None
) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable)
    env.pop("SPARKBEAM_CRASH_AT", None)
    if crash_at:
        env["SPARKBEAM_CRASH_AT"] = crash_at
    cmd = [
        sys.executable, "-m", "tests.io.kafka.kafka_pipeline",
        "--bootstrap", kafka_broker.bootstrap, "--topic", topic,
        "--records", str(PARTITIONS * PER_PARTITION), "--output", str(tmp / "out"),
        "--runner=SparkCheckpointRunner", f"--spark_master_url={TEST_MASTER}",
        "--streaming", "--checkpoint_dir", str(tmp / "ckpt"),
        "--checkpoint_interval_s", "0.05", f"--parallelism={parallelism}",
    ]  # fmt: skip
    if output_topic:
        cmd += ["--output-topic", output_topic]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize(
    "crash_at, before, after",
    [
        ("mid-round:3", 2, 2),  # the round's Spark job ran, its checkpoint did not commit
        (
            "after-commit:2",
            1,
            3,
        ),  # committed, sink not yet published; resume at another parallelism
    ],
)
def test_killed_kafka_job_resumes_with_exact_output(
    kafka_broker, tmp_path, crash_at, before, after
):
    topic = "recovery-" + uuid.uuid4().hex[:8]
    kafka_broker.create_topic(topic, PARTITIONS)
    for p in range(PARTITIONS):
        records = [(None, b"v%d-%d" % (p, i), None) for i in range(PER_PARTITION)]
        kafka_broker.produce(topic, records, partition=p)
    expected = Counter(f"{p} {i} v{p}-{i}" for p in range(PARTITIONS) for i in range(PER_PARTITION))
    killed = _run(kafka_broker, topic, tmp_path, before, crash_at=crash_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert visible(str(tmp_path / "out")) != expected  # the kill really interrupted the job
    resumed = _run(kafka_broker, topic, tmp_path, after)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert visible(str(tmp_path / "out")) == expected


def test_write_to_kafka_is_at_least_once_across_a_driver_kill(kafka_broker, tmp_path):
    """Kafka -> WriteToKafka killed after a round's Spark job produced and before its
    checkpoint: the resumed job replays that round, so every record arrives, some twice (the
    guarantee README states; exactly-once would need the broker's transactions)."""
    topic, out = "alo-" + uuid.uuid4().hex[:8], "alo-out-" + uuid.uuid4().hex[:8]
    kafka_broker.create_topic(topic, PARTITIONS)
    kafka_broker.create_topic(out, PARTITIONS)
    for p in range(PARTITIONS):
        records = [(None, b"v%d-%d" % (p, i), None) for i in range(PER_PARTITION)]
        kafka_broker.produce(topic, records, partition=p)
    expected = {f"{p} {i} v{p}-{i}" for p in range(PARTITIONS) for i in range(PER_PARTITION)}
    killed = _run(kafka_broker, topic, tmp_path, 2, crash_at="mid-round:3", output_topic=out)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = _run(kafka_broker, topic, tmp_path, 2, output_topic=out)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    produced = Counter(value for _key, value in topic_records(kafka_broker, out, PARTITIONS))
    assert set(produced) == expected  # nothing lost, nothing else
    assert sum(produced.values()) > len(expected)  # the replayed round produced again

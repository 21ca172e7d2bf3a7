"""Kill-and-restart recovery of a streaming job, bytewax style: SIGKILL the driver at
chosen points, run the same command again, compare with an uninterrupted run's output
(``test_store_faults`` runs the same job uninterrupted, with ``--fresh``, and checks it
against the same expected lines).

One job is killed after a commit and resumed. Another is killed at every other point in turn,
each restart at another parallelism, the last one after its newest manifest was cut: every
restart resumes a store that earlier restarts wrote (one chain: six driver runs fewer than a
job per point, at 20-30 s each when the suite runs).

The job (``streaming_pipelines.main``): two offset SDF sources that behave like
unbounded sources (records arrive in rounds, the watermark advances), a fixed-window
count, a bounded input flattened in, all written through the exactly-once sink.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys

import pytest

from sparkbeam.checkpoint import open_store
from sparkbeam.checkpoint.errors import CheckpointCorruptError
from tests.conftest import TEST_MASTER
from tests.streaming.streaming_pipelines import expected_lines

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCES = "a:120,b:90"


def _run(
    tmp, parallelism: int, crash_at: str | None = None, sources: str = SOURCES
) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable)
    env.pop("SPARKBEAM_CRASH_AT", None)
    if crash_at:
        env["SPARKBEAM_CRASH_AT"] = crash_at
    cmd = [
        sys.executable, "-m", "tests.streaming.streaming_pipelines",
        "--output", str(tmp / "out"), "--sources", sources, "--per_round", "15",
        "--runner=SparkCheckpointRunner", f"--spark_master_url={TEST_MASTER}",
        "--streaming", "--checkpoint_dir", str(tmp / "ckpt"),
        "--checkpoint_interval_s", "0.05", f"--parallelism={parallelism}",
    ]  # fmt: skip
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _visible_lines(tmp) -> list[str]:
    lines = []
    for path in glob.glob(str(tmp / "out" / "out-*")):
        with open(path) as f:
            lines.extend(line.rstrip("\n") for line in f if line.strip())
    return sorted(lines)


def _expected(sources: str = SOURCES) -> list[str]:
    return expected_lines([(s.split(":")[0], int(s.split(":")[1])) for s in sources.split(",")])


def _staged(tmp) -> list[str]:
    return glob.glob(str(tmp / "out" / ".sparkbeam-staging" / "*"))


def test_killed_driver_resumes_with_no_loss_and_no_duplicates(tmp_path):
    """Killed after a checkpoint committed, before its sink files were published."""
    killed = _run(tmp_path, 2, crash_at="after-commit:4")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert _visible_lines(tmp_path) != _expected()  # the kill really interrupted the job
    staged_at_kill = _staged(tmp_path)
    resumed = _run(tmp_path, 2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _visible_lines(tmp_path) == _expected()
    # Files staged by the killed round never became visible, and the restore removed them.
    assert not _staged(tmp_path), staged_at_kill


# (crash point, parallelism of the run it kills, cut the newest manifest after the kill)
CHAIN = [
    ("mid-round:3", 1, False),  # the round's Spark job ran, its checkpoint did not commit
    ("prepared:6", 2, False),  # inside the commit: staged files read, manifest not written
    ("mid-round:9", 3, True),  # then the newest manifest is cut: the restart falls back
]
CHAIN_SOURCES = "a:195,b:150"  # 13 rounds of 15: the third kill comes before the end


def test_a_job_killed_at_each_point_and_restarted_at_another_parallelism_is_exact(tmp_path):
    """Each restart resumes what the killed run committed, at another parallelism (the
    sources' keys move to other partitions); the last restarts from the checkpoint before a
    damaged newest manifest and replays the lost round: the files that round had published
    must not appear twice."""
    want = _expected(CHAIN_SOURCES)
    for crash_at, parallelism, cut in CHAIN:
        killed = _run(tmp_path, parallelism, crash_at, CHAIN_SOURCES)
        assert killed.returncode == -signal.SIGKILL, f"{crash_at}: {killed.stderr[-3000:]}"
        assert _visible_lines(tmp_path) != want, f"{crash_at} came after the job's end"
        if cut:
            damaged = _cut_latest_manifests(str(tmp_path / "ckpt"))
            assert damaged
            _assert_detected_as_damaged(str(tmp_path / "ckpt"), damaged)
    resumed = _run(tmp_path, 2, sources=CHAIN_SOURCES)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    lines = _visible_lines(tmp_path)
    assert not sorted({x for x in lines if lines.count(x) > 1}), "published twice"
    assert lines == want
    assert not _staged(tmp_path)  # what the killed rounds staged never became visible


def _cut_latest_manifests(ckpt) -> list[str]:
    """Cut the newest manifest of every pipeline in half; returns the damaged paths."""
    damaged = []
    for manifests in glob.glob(os.path.join(ckpt, "pipelines", "*", "manifests")):
        names = sorted(glob.glob(os.path.join(manifests, "chk-*.json")))
        if len(names) < 2:
            continue  # nothing to fall back to: this pipeline is not the one under test
        latest = max(names, key=lambda n: int(n.rsplit("chk-", 1)[1].split(".")[0]))
        with open(latest, "rb") as f:
            data = f.read()
        with open(latest, "wb") as f:
            f.write(data[: len(data) // 2])
        damaged.append(latest)
    return damaged


def _assert_detected_as_damaged(ckpt: str, damaged: list[str]) -> None:
    with open_store(ckpt, read_only=True) as store:
        for path in damaged:
            pipeline = os.path.basename(os.path.dirname(os.path.dirname(path)))
            cid = int(path.rsplit("chk-", 1)[1].split(".")[0])
            with pytest.raises(CheckpointCorruptError):
                store.load_manifest(pipeline, cid)

"""Kill-and-restart recovery of a streaming job, bytewax style: SIGKILL the driver at
chosen points, run the same command again, compare with an uninterrupted run's output
(``test_store_faults`` runs the same job uninterrupted, with ``--fresh``, and checks it
against the same expected lines).

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

from tests.conftest import TEST_MASTER
from tests.streaming.streaming_pipelines import expected_lines

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCES = "a:120,b:90"


def _run(tmp, parallelism: int, crash_at: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable)
    env.pop("SPARKBEAM_CRASH_AT", None)
    if crash_at:
        env["SPARKBEAM_CRASH_AT"] = crash_at
    cmd = [
        sys.executable, "-m", "tests.streaming.streaming_pipelines",
        "--output", str(tmp / "out"), "--sources", SOURCES, "--per_round", "15",
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


def _expected() -> list[str]:
    return expected_lines([(s.split(":")[0], int(s.split(":")[1])) for s in SOURCES.split(",")])


@pytest.mark.parametrize(
    "crash_at, before, after",
    [
        ("mid-round:3", 1, 1),  # the round's Spark job ran, its checkpoint did not commit
        ("prepared:5", 2, 2),  # inside the commit: staged files read, manifest not written
        ("after-commit:4", 2, 2),  # committed, sink files not yet published
        ("mid-round:2", 2, 3),  # and restart at another parallelism
    ],
)
def test_killed_driver_resumes_with_no_loss_and_no_duplicates(tmp_path, crash_at, before, after):
    killed = _run(tmp_path, before, crash_at=crash_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    partial = _visible_lines(tmp_path)
    assert partial != _expected()  # the kill really interrupted the job
    staged_at_kill = glob.glob(str(tmp_path / "out" / ".sparkbeam-staging" / "*"))
    resumed = _run(tmp_path, after)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _visible_lines(tmp_path) == _expected()
    # Files staged by the killed round never became visible, and the restore removed them.
    assert not glob.glob(str(tmp_path / "out" / ".sparkbeam-staging" / "*")), staged_at_kill

"""Store faults under a real streaming job (``streaming_pipelines.main`` in a subprocess, as in
``test_recovery``): a damaged changelog segment shared by the newest checkpoints, and rerunning
a job that already finished.

- The driver is killed mid-run (``SPARKBEAM_CRASH_AT``), 8 bytes of a segment that the newest
  checkpoints all name are flipped, the same command runs again: it restores the older
  fallback checkpoint and the output is exact -- every window once, none published twice.
- The job that run left finished, run again, fails, saying to pass ``--fresh``, and writes
  nothing; with ``--fresh`` (and a new output) it runs from the beginning, uninterrupted,
  and writes exactly the lines ``test_recovery``'s killed runs are checked against.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys

import pytest

from sparkbeam.checkpoint import open_store
from sparkbeam.checkpoint.layout import pipeline_dir
from tests.conftest import TEST_MASTER
from tests.streaming.streaming_pipelines import expected_lines

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCES = "a:120,b:90"


def _run(tmp, out: str = "out", crash_at: str | None = None, *extra: str):
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable)
    env.pop("SPARKBEAM_CRASH_AT", None)
    if crash_at:
        env["SPARKBEAM_CRASH_AT"] = crash_at
    cmd = [
        sys.executable, "-m", "tests.streaming.streaming_pipelines",
        "--output", str(tmp / out), "--sources", SOURCES, "--per_round", "15",
        "--runner=SparkCheckpointRunner", f"--spark_master_url={TEST_MASTER}",
        "--streaming", "--checkpoint_dir", str(tmp / "ckpt"),
        "--checkpoint_interval_s", "0.05", "--parallelism=2", *extra,
    ]  # fmt: skip
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _visible_lines(tmp, out: str = "out") -> list[str]:
    lines = []
    for path in glob.glob(str(tmp / out / "out-*")):
        with open(path) as f:
            lines.extend(line.rstrip("\n") for line in f if line.strip())
    return sorted(lines)


def _expected() -> list[str]:
    return expected_lines([(s.split(":")[0], int(s.split(":")[1])) for s in SOURCES.split(",")])


def _damage_shared_segment(ckpt: str) -> tuple[list[int], str]:
    """Flip 8 bytes of a changelog segment the newest three checkpoints all name; returns
    the retained checkpoint ids and the damaged file's name."""
    with open_store(ckpt, read_only=True) as store:
        (pid,) = store.list_pipelines()
        ids = [i.checkpoint_id for i in store.list_checkpoints(pid)]
        named = [{f.name for f in store.load_manifest(pid, c).changelog} for c in ids[-3:]]
        shared = sorted(set.intersection(*named))
        assert shared, f"the newest checkpoints {ids[-3:]} share no segment"
        path = os.path.join(ckpt, pipeline_dir(pid), shared[0])
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        middle = len(data) // 2
        data[middle : middle + 8] = bytes(b ^ 0xFF for b in data[middle : middle + 8])
        f.seek(0)
        f.write(data)
    return ids, shared[0]


@pytest.fixture(scope="module")
def damaged_and_resumed(tmp_path_factory):
    """A run killed mid-run, a shared segment damaged, the same command again (to the end).

    The second test reruns the job this leaves finished, so one store serves both."""
    tmp = tmp_path_factory.mktemp("store-faults")
    # No regular materialization during the run: the newest checkpoints share segments.
    killed = _run(tmp, "out", "mid-round:6", "--materialization_interval_s=600")
    partial = _visible_lines(tmp)
    damage = _damage_shared_segment(str(tmp / "ckpt")) if killed.returncode < 0 else None
    resumed = _run(tmp)
    return tmp, killed, partial, damage, resumed


def test_damaged_shared_segment_resumes_from_an_older_checkpoint_exactly_once(
    damaged_and_resumed,
):
    tmp, killed, partial, damage, resumed = damaged_and_resumed
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert partial and partial != _expected()  # windows were published before the kill
    ids, damaged = damage
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Checkpoint {ids[-1]} of pipeline 'pipeline-0' is unusable" in resumed.stderr
    assert damaged in resumed.stderr
    lines = _visible_lines(tmp)
    duplicated = sorted({x for x in lines if lines.count(x) > 1})
    assert not duplicated, f"republished after the fallback: {duplicated}"
    assert lines == _expected()


def test_rerunning_a_finished_streaming_job_fails_unless_fresh(damaged_and_resumed):
    tmp, *_, done = damaged_and_resumed
    assert done.returncode == 0, done.stderr[-3000:]
    assert _visible_lines(tmp) == _expected()
    again = _run(tmp)
    assert again.returncode != 0
    assert "FinishedJobError: Pipeline 'pipeline-0' already finished" in again.stderr
    assert "pass --fresh (with a new --output)" in again.stderr
    assert _visible_lines(tmp) == _expected()  # nothing written twice
    fresh = _run(tmp, "out2", None, "--fresh")
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert _visible_lines(tmp, "out2") == _expected()
    assert _visible_lines(tmp) == _expected()

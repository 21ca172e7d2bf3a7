"""Ctrl-C stops a streaming job gracefully: the running round commits, one line says so, and
the next run resumes from there with exact output. A second Ctrl-C exits at once.

The signals land while a round surely runs: the source sleeps on every record after touching
a marker file, and the test waits for a fresh marker after the first checkpoint. (Sent between
rounds, the first Ctrl-C stops at once and a second one finds the job already ended.)"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import TEST_MASTER
from tests.streaming.test_recovery import ROOT, SOURCES, _expected, _run, _visible_lines

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _start(tmp) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable)
    env.pop("SPARKBEAM_CRASH_AT", None)
    cmd = [
        sys.executable, "-m", "tests.streaming.streaming_pipelines",
        "--output", str(tmp / "out"), "--sources", SOURCES, "--per_round", "5",
        "--runner=SparkCheckpointRunner", f"--spark_master_url={TEST_MASTER}",
        "--streaming", "--checkpoint_dir", str(tmp / "ckpt"),
        "--checkpoint_interval_s", "0.05", "--parallelism=2",
        "--claim_sleep_s", "0.5", "--running_marker", str(tmp / "running"),
    ]  # fmt: skip
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_for_checkpoint(tmp, proc, timeout_s: float = 400) -> None:
    pattern = str(tmp / "ckpt" / "pipelines" / "*" / "manifests" / "chk-*.json")
    _wait(proc, lambda: glob.glob(pattern), "no checkpoint committed", timeout_s)


def _wait_for_running_round(tmp, proc, timeout_s: float = 120) -> None:
    """A record of a round after the first checkpoint is being read (and sleeps 0.5 s)."""
    marker = tmp / "running"
    marker.unlink(missing_ok=True)
    _wait(proc, marker.exists, "no round ran after the first checkpoint", timeout_s, step=0.02)


def _wait(proc, done, what: str, timeout_s: float, step: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{what} in time"
        time.sleep(step)


def test_sigint_stops_resumably_twice_stops_at_once_and_the_rerun_is_exact(tmp_path):
    """One Ctrl-C: the running round commits and the job exits 0. Run again, two Ctrl-Cs:
    it exits at once (130). The third run resumes what both stopped runs committed."""
    for signals, returncode in ((1, 0), (2, 128 + signal.SIGINT)):
        proc = _start(tmp_path)
        _wait_for_checkpoint(tmp_path, proc)
        _wait_for_running_round(tmp_path, proc)
        for _ in range(signals):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.3)
        _, err = proc.communicate(timeout=300)
        assert "KeyboardInterrupt" not in err, err[-3000:]
        assert err.count("stopping after the running round commits") == 1, err[-3000:]
        assert proc.returncode == returncode, err[-3000:]
        assert ("stopping now" in err) == (signals == 2), err[-3000:]
        assert _visible_lines(tmp_path) != _expected()  # it really stopped early
    resumed = _run(tmp_path, 2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _visible_lines(tmp_path) == _expected()

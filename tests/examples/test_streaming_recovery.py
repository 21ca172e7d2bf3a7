"""examples/streaming_recovery.py in-process on the shared session: stop mid-run, rerun.

The example's README story uses ``kill -9``; the SIGKILL variants of this resume
(mid-round, mid-commit, after commit) are tested in tests/streaming/test_recovery.py.
Here the job is stopped with ``cancel()`` (its current round commits), which keeps the
test in one process and fast, and the rerun must still write every window exactly once.
"""

from __future__ import annotations

import time

import pytest

from examples import streaming_recovery as example
from tests.conftest import spark_test_options

pytestmark = [pytest.mark.spark, pytest.mark.slow]  # ~10-25 s, most of it Spark rounds

SOURCES = [("clicks", 60), ("views", 45)]
FAST = {"window_s": 10, "per_round": 15, "delay_s": 0.0}


def _options(ckpt) -> list[str]:
    return spark_test_options(
        "--streaming", f"--checkpoint_dir={ckpt}", "--checkpoint_interval_s=0.05", "--parallelism=2"
    )


def test_check_names_missing_and_duplicated_windows(tmp_path):
    out = tmp_path / "counts"
    (tmp_path / "counts-a").write_text("clicks 0 10\nclicks 10 10\n")
    (tmp_path / "counts-b").write_text("clicks 10 10\n")
    missing, duplicated = example.check(str(out), [("clicks", 25)])
    assert missing == ["clicks 20 5"]
    assert duplicated == ["clicks 10 10"]


def test_stopped_job_resumes_and_writes_every_window_once(spark, tmp_path):
    out, ckpt = str(tmp_path / "out" / "counts"), tmp_path / "ckpt"
    first = example.start(out, SOURCES, _options(ckpt), **FAST)
    deadline = time.monotonic() + 60
    while not any(loop.rounds_run >= 1 for loop in first.executor.loops):
        assert time.monotonic() < deadline, "no round committed within 60 s"
        time.sleep(0.02)
    first.cancel()
    missing, duplicated = example.check(out, SOURCES)
    assert missing and not duplicated  # stopped mid-run, nothing written twice

    second = example.start(out, SOURCES, _options(ckpt), **FAST)
    assert second.wait_until_finish(60_000) == "DONE"
    assert second.executor.loops[0].round_times[0].round_no > 0  # resumed, not restarted
    assert example.check(out, SOURCES) == ([], [])
    assert example.visible_lines(out) == example.expected_lines(SOURCES)

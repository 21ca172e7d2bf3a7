"""benchmarks/_harness.py: how a failed child is reported, and how runs are chosen."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from _harness import Result, best_of, error_line, failure, run_child  # noqa: E402


def test_error_line_is_the_traceback_headline_not_the_spark_noise(tmp_path):
    log = tmp_path / "child.log"
    log.write_text(
        "26/11/23 22:25:21 WARN NativeCodeLoader: Unable to load native-hadoop library\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        "RuntimeError: inner\n"
        "\nDuring handling of the above exception, another exception occurred:\n\n"
        "apache_beam.testing.util.BeamAssertException: Failed assert: [1] == [2]\n"
        "26/11/23 22:25:22 INFO ShutdownHookManager: Shutdown hook called\n"
    )
    assert error_line(str(log)) == (
        "apache_beam.testing.util.BeamAssertException: Failed assert: [1] == [2]"
    )


def test_error_line_without_a_traceback_is_the_last_line(tmp_path):
    log = tmp_path / "child.log"
    log.write_text("starting\nKilled\n\n")
    assert error_line(str(log)) == "Killed"


def test_a_child_past_its_timeout_is_killed_and_reported(tmp_path):
    log = tmp_path / "child.log"
    child = run_child([sys.executable, "-c", "import time; time.sleep(60)"], str(log), 0.5)
    assert child.returncode is None
    assert child.seconds < 30
    assert failure(child, str(log), 0.5) == f"timed out after 0.5 s, see {log}"


def test_best_of_is_the_fastest_run_unless_one_failed():
    runs = [
        Result("a", 3.0, True, cpu=2.0),
        Result("a", 2.0, True, cpu=1.5, note="n"),
        Result("b", 1.0, True),
        Result("b", 5.0, False, "exit status 1: boom"),
    ]
    a = best_of(runs, "a")
    assert (a.seconds, a.cpu, a.note, a.runs) == (2.0, 1.5, "n", (3.0, 2.0))
    b = best_of(runs, "b")
    assert (b.ok, b.problem, b.runs) == (False, "exit status 1: boom", (1.0, 5.0))


@pytest.mark.parametrize("workload", ["w1", "w2"])
def test_best_of_keeps_workloads_apart(workload):
    runs = [Result("s", 1.0, True, workload="w1"), Result("s", 9.0, True, workload="w2")]
    assert best_of(runs, "s", workload).seconds == {"w1": 1.0, "w2": 9.0}[workload]

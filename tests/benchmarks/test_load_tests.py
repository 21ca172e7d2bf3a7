"""benchmarks/load_tests.py runs Beam's load tests and prints a row per system (tiny: 1000
records, one test), and reports a failing system without stopping the others."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "load_tests.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=900
    )


def _rows(stdout: str) -> dict[tuple[str, str], list[str]]:
    return {tuple(line.split()[:2]): line.split() for line in stdout.splitlines() if line}


@pytest.mark.spark
@pytest.mark.slow
def test_prints_a_row_per_system_with_the_ratio():
    proc = _run("--records", "1000", "--tests", "pardo")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    rows = _rows(proc.stdout)
    # wall s, CPU s, Beam runtime s, wall / direct, status, runs
    assert rows[("pardo", "direct")][6] == "ok"
    sparkbeam = rows[("pardo", "sparkbeam")]
    assert sparkbeam[5].endswith("x") and sparkbeam[6] == "ok", sparkbeam
    assert "1,000 records" in proc.stdout


@pytest.mark.slow  # no Spark, but two Beam processes
def test_a_failing_system_is_reported_and_the_others_run():
    # --records 1 makes sideinput_test's per-element record count 0: Beam's SyntheticSource
    # then fails (on every runner); gbk runs fine after it.
    proc = _run("--records", "1", "--tests", "sideinput,gbk", "--systems", "fnapi")
    rows = _rows(proc.stdout)
    assert rows[("gbk", "fnapi")][6] == "ok", proc.stdout
    assert proc.returncode == 1
    assert rows[("sideinput", "fnapi")][6] == "FAILED", proc.stdout
    assert "FAILED sideinput on fnapi: exit status 1: " in proc.stderr

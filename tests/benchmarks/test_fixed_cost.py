"""benchmarks/fixed_cost.py runs and prints a row per system (tiny: one workload, one run)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "fixed_cost.py"


def _run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.spark
@pytest.mark.slow
def test_prints_a_row_per_system_with_the_ratios():
    proc = _run("--workloads", "trivial", "--repeat", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    rows = {tuple(line.split()[:2]): line.split() for line in proc.stdout.splitlines() if line}
    assert ("bare-pyspark", "bare-pyspark") in rows
    assert ("trivial", "fnapi") in rows
    sparkbeam = rows[("trivial", "sparkbeam")]
    # wall s, CPU s, wall - bare, CPU - bare, wall / fnapi, CPU / fnapi, status, runs
    assert sparkbeam[4].startswith(("+", "-")) and sparkbeam[6].endswith("x"), sparkbeam
    assert sparkbeam[8] == "ok"
    assert "load average" in proc.stdout


def test_the_connect_system_needs_a_url():
    proc = _run("--systems", "sparkbeam-connect", timeout=60)
    assert proc.returncode == 2
    assert "sparkbeam-connect needs --spark_remote" in proc.stderr


def test_an_unknown_workload_is_named():
    proc = _run("--workloads", "trivial,nope", timeout=60)
    assert proc.returncode == 2
    assert "unknown workloads ['nope']; choose from trivial,side_inputs,combiners" in proc.stderr

"""benchmarks/streaming.py latency: sparkbeam and Spark's own Structured Streaming in one run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPT = BENCHMARKS / "streaming.py"
sys.path.insert(0, str(BENCHMARKS))

import streaming as bench  # noqa: E402
import streaming_jobs  # noqa: E402

ARGS = SimpleNamespace(records=10, rate=5.0, keys=2, window_s=5, interval_s=1.0)


def _run(system: str, p50s: list[float]) -> dict:
    """A finished latency run whose rounds have these job + commit times (commit 0.01)."""
    rounds = [{"job_s": t - 0.01, "commit_s": 0.01, "started": i} for i, t in enumerate(p50s)]
    return {
        "system": system, "load": 0.5, "round_times": rounds, "window_lat": [1.0],
        "oldest_lat": [2.0], "event_mean": 1.5, "check": "ok",
    }  # fmt: skip


def test_the_table_is_the_median_run_and_every_runs_p50_is_listed(capsys):
    runs = [_run("streaming", [p50] * 3) for p50 in (0.4, 0.2, 0.3)]
    median = bench._print_latency_runs(runs, ARGS)
    out = capsys.readouterr().out
    assert median == pytest.approx(0.3)
    assert "round (job + commit) p50 of 3 runs: 0.400 0.200 0.300; median 0.300 s" in out
    table = next(line for line in out.splitlines() if line.startswith("round: job + commit"))
    assert table.split()[5] == "0.300"  # p50 column of the median run


def test_a_failed_run_is_counted_and_left_out_of_the_median(capsys):
    runs = [_run("streaming", [0.4] * 3), {"system": "streaming", "load": 1.0, "failed": True}]
    assert bench._print_latency_runs(runs, ARGS) == pytest.approx(0.4)
    assert "1 FAILED" in capsys.readouterr().out


def test_watermark_of_a_structured_streaming_progress():
    progress = SimpleNamespace(eventTime={"watermark": "2026-11-26T08:00:02.262Z"})
    assert streaming_jobs._watermark(progress) == pytest.approx(1795680002.262)
    assert streaming_jobs._watermark(SimpleNamespace(eventTime={})) == 0.0
    assert streaming_jobs._watermark(None) == 0.0


@pytest.mark.spark
@pytest.mark.slow
def test_both_systems_run_exactly_once_and_the_ratio_is_printed():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--workloads", "latency"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    out = proc.stdout
    assert "(a) latency, streaming:" in out and "(a) latency, spark-streaming:" in out
    checks = re.findall(r"\d+ \(key, window\) lines, 0 duplicated, 20000 records", out)
    assert len(checks) == 2, out  # each system: every record counted once
    assert "Spark Structured Streaming" in out and "MISMATCH" not in out

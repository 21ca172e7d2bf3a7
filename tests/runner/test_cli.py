"""The sparkbeam command: plan a script without running it; subcommands exist."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _sparkbeam(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sparkbeam.runner.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


def test_plan_prints_the_wordcount_plan_and_runs_nothing(tmp_path):
    out = tmp_path / "never"
    proc = _sparkbeam("plan", "examples/wordcount.py", "--output", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ExecutionPlan: " in proc.stdout
    assert "group:" in proc.stdout and "Count" in proc.stdout
    assert "SparkContext" not in proc.stderr
    assert not list(tmp_path.iterdir())  # nothing was executed or written


def test_help_lists_every_subcommand():
    proc = _sparkbeam("--help")
    assert proc.returncode == 0
    for sub in ("plan", "checkpoints", "sdf-check"):
        assert sub in proc.stdout


def test_drain_without_a_running_job_is_refused_and_writes_nothing(tmp_path, capsys):
    from sparkbeam.runner import cli

    assert cli.main(["drain", f"--checkpoint_dir={tmp_path}"]) == 2
    assert "No job holds the store" in capsys.readouterr().err
    assert not (tmp_path / "drain-request").exists()

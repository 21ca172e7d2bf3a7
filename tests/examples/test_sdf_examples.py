"""Run the SDF examples end to end on local Spark and check their exact outputs.

Each example runs in its own subprocess (as a user would run it), on
``--spark_master_url=local[2]``.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SPARK = ["--runner=SparkCheckpointRunner", "--spark_master_url=local[2]"]


def _run(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def _lines(prefix: Path) -> list[str]:
    out: list[str] = []
    for shard in sorted(glob.glob(f"{prefix}-*-of-*")):
        out.extend(Path(shard).read_text(encoding="utf-8").splitlines())
    return out


@pytest.mark.parametrize("budget", ["5", "0"], ids=["in-task", "driver-rounds"])
def test_tail_reads_every_appended_line_once(tmp_path, budget):
    out = tmp_path / "tail"
    proc = _run(
        "sdf_resume.py",
        "--demo",
        "--demo_lines=24",
        "--demo_s=3",
        "--poll_s=0.3",
        f"--output={out}",
        f"--residual_budget_s={budget}",
        *SPARK,
        cwd=tmp_path,
    )
    expected = [f"line {i:04d}" for i in range(24)]
    assert sorted(_lines(out)) == expected  # exact: nothing lost, nothing duplicated
    assert len(_lines(out)) == 24
    assert "__END__" not in _lines(out)
    # The writer started once the tailer ran, so the SDF must have resumed itself.
    summary = next(line for line in proc.stdout.splitlines() if line.startswith("read "))
    calls = int(summary.split(" call(s)")[0].rsplit(" ", 1)[1])
    assert calls > 1, summary


def test_offsets_counts_equal_sizes(tmp_path):
    out = tmp_path / "offsets"
    proc = _run(
        "sdf_offsets.py",
        "--names=a=2500,b=1201,c=7",
        "--every=500",  # a and b defer their remainder 4 and 2 times: rounds, not 25 of them
        f"--output={out}",
        *SPARK,
        cwd=tmp_path,
    )
    counts = dict(line.split("\t") for line in _lines(out))
    assert {k: int(v) for k, v in counts.items()} == {"a": 2500, "b": 1201, "c": 7}
    assert "expected" not in proc.stdout

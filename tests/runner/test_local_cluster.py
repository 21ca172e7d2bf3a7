"""Multi-process proof: separate executor JVMs and Python workers (local-cluster)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

HERE = Path(__file__).parent


def test_gbk_side_inputs_and_state_on_local_cluster(tmp_path):
    out = tmp_path / "result.jsonl"
    proc = subprocess.run(
        [sys.executable, str(HERE / "cluster_pipeline.py"), "local-cluster[2,1,1024]", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = sorted(tuple(json.loads(line)) for line in out.read_text().splitlines())
    values = [x + 100 for x in range(60)]
    expected = sorted(
        [("sum", k, sum(v for v in values if (v - 100) % 4 == k)) for k in range(4)]
        + [("total", k, sum(v for v in values if (v - 100) % 4 == k)) for k in range(4)]
    )
    assert rows == [tuple(r) for r in expected]

"""A second job on a locked store is refused before its Spark session starts."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from sparkbeam.checkpoint import open_store
from tests.conftest import TEST_MASTER

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "batch"])
def test_locked_store_refuses_a_second_job_without_starting_spark(tmp_path, streaming):
    ckpt = str(tmp_path / "ckpt")
    cmd = [
        sys.executable, "-m", "tests.streaming.streaming_pipelines",
        "--output", str(tmp_path / "out"), "--sources", "a:20",
        "--runner=SparkCheckpointRunner", f"--spark_master_url={TEST_MASTER}",
        "--checkpoint_dir", ckpt, *(["--streaming"] if streaming else []),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable)
    with open_store(ckpt, job_name="the-first-job"):
        started = time.monotonic()
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        took = time.monotonic() - started
    assert done.returncode != 0
    assert "locked by job 'the-first-job'" in done.stderr, done.stderr[-2000:]
    assert "log4j" not in done.stderr and "SparkContext" not in done.stderr  # Spark never ran
    print(f"refused in {took:.1f}s")

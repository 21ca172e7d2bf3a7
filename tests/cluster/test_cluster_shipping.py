"""A user's code reaches executors that lack it, on the shared standalone cluster (issue 11.3):
a package through the flag that ships it, a package next to the main script by itself; without
such a flag the error says how to ship it.

The pipeline is ``tests/runner/user_code``'s, run from a folder and a PYTHONPATH that lack the
user's modules. The workers' directories and PYTHONPATH do not hold them either, so the
executors can only import them from what sparkbeam ships (Spark's files for the app), never
from the script's own directory: each output line records the module files the executor loaded.
"""

from __future__ import annotations

import json

import pytest

from tests.runner.user_code import run_user_pipeline

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_setup_file_package_runs_on_executors(cluster, tmp_path):
    pkg = tmp_path / "app" / "tinypkg"
    proc, out = run_user_pipeline(
        tmp_path,
        cluster.url,
        f"--setup_file={pkg / 'setup.py'}",
        f"--lib_dir={pkg}",
        "--dofn_module=tinydofns",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["x"], r["y"]) for r in rows) == [(x, 11 * x) for x in range(10)]
    assert all("tinydofns-" in r["module_file"] for r in rows), rows[0]
    assert all(r["leaked"] == [] for r in rows), rows[0]  # the driver's sys.path did not leak
    # The package next to the main script (mylib), shipped without a flag.
    assert sorted((r["x"], r["z"]) for r in rows) == [(x, 7 * x) for x in range(10)]
    app_dir, cluster_dir = str(tmp_path / "app"), str(cluster.base_dir)
    for r in rows:
        assert r["cwd"].startswith(cluster_dir), f"not run by a cluster executor: {r}"
        assert not r["own_file"].startswith(app_dir), (
            f"the executor imported {r['own_file']} from the driver's script directory "
            "(the driver's sys.path leaked to the executors), not from shipped files"
        )


def test_module_missing_on_executors_says_how_to_ship_it(cluster, tmp_path):
    pkg = tmp_path / "app" / "tinypkg"
    # lib_dir is on the driver's sys.path only: it passed when that path leaked to executors.
    retries = "--spark_conf=spark.task.maxFailures=1"  # fail on the first attempt
    proc, _ = run_user_pipeline(
        tmp_path, cluster.url, f"--lib_dir={pkg}", "--dofn_module=tinydofns", retries
    )
    assert proc.returncode != 0
    assert "ModuleNotOnExecutorsError" in proc.stderr, proc.stderr[-4000:]
    assert "module 'tinydofns' is not installed on the executors" in proc.stderr
    assert "--setup_file" in proc.stderr and "spark.submit.pyFiles" in proc.stderr
    assert "fix the user code" not in proc.stderr

"""A Spark Connect server whose master is the standalone cluster (`sparkbeam serve --master
spark://...`): its executors have no ``PYTHONHASHSEED`` (classic PySpark sets it, the server
does not), and a Reshuffle must still run; capped at one core, it leaves the other to other
applications."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sparkbeam.runner.spark.connect_server import start_server
from tests.servers import server_env

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESHUFFLE = """
import sys
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
with beam.Pipeline(options=PipelineOptions(sys.argv[2:])) as p:
    _ = (p | beam.Create(range(40)) | beam.Reshuffle() | beam.Map(lambda x: x * 2)
         | beam.io.WriteToText(sys.argv[1]))
"""


def test_a_reshuffle_runs_on_a_connect_server_whose_master_is_the_cluster(cluster, tmp_path):
    server = start_server(
        cluster.url,
        log_dir=tmp_path / "server",
        extra_conf={"spark.cores.max": "1"},
        env=server_env("connect"),
    )
    try:
        out = tmp_path / "out" / "doubled"
        env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "PYTHONHASHSEED")}
        done = subprocess.run(
            [sys.executable, "-c", RESHUFFLE, str(out), "--runner=SparkCheckpointRunner",
             f"--spark_remote={server.url}", "--parallelism=2"],
            cwd=ROOT, env=dict(env, PYTHONPATH=ROOT), capture_output=True, text=True,
            timeout=900,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        lines = sorted(
            int(line) for shard in out.parent.glob("doubled*") for line in shard.read_text().split()
        )
        assert lines == [x * 2 for x in range(40)]
        apps = [a for a in cluster.status().get("activeapps", []) if a.get("cores") is not None]
        assert apps and all(a["cores"] <= 1 for a in apps), apps  # the cap held
    finally:
        server.stop()

"""The Spark session: reuse the active one (spark-submit), or create one."""

from __future__ import annotations

import os
import re
import sys

from sparkbeam.runner.errors import SparkSessionError
from sparkbeam.runner.options import SparkRunnerOptions

_MASTER_PATTERNS = (
    r"local(\[(\*|\d+)(,\d+)?\])?",
    r"local-cluster\[\d+,\s*\d+,\s*\d+\]",
    r"spark://.+",
    r"yarn",
    r"k8s://.+",
    r"mesos://.+",
)


def check_master_url(master: str) -> None:
    if not any(re.fullmatch(p, master) for p in _MASTER_PATTERNS):
        raise SparkSessionError(
            f"--spark_master_url {master!r} is not a Spark master URL; use local[*], "
            "local[N], spark://host:port, yarn or k8s://https://host:port."
        )


def get_or_create_session(options: SparkRunnerOptions, job_name: str | None = None):
    """Return the active SparkSession, or build one from the options."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    master = options.master_url()
    check_master_url(master)
    conf = options.spark_conf_pairs()
    # Executors' Python must be this interpreter: it has Beam and sparkbeam. The driver's
    # sys.path is not passed on (on a cluster those paths do not exist): the user's own
    # code reaches executors through runner.shipping.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(options.spark_app_name or job_name or "sparkbeam")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(options.shuffle_parallelism() or 8))
        .config("spark.python.worker.reuse", "true")
        .config("spark.python.daemon.module", "sparkbeam.runner.daemon")
        # Streaming runs each independent pipeline's rounds in its own scheduler pool.
        .config("spark.scheduler.mode", "FAIR")
    )
    for key, value in conf:
        builder = builder.config(key, value)
    try:
        return builder.getOrCreate()
    except Exception as e:  # noqa: BLE001 - py4j/JVM startup errors are opaque
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SparkSessionError(
            f"Could not start Spark with master {master!r}: {first}. "
            "Check that Java 17+ is on PATH and the master is reachable."
        ) from None

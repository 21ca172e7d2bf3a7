"""Asks for a local session whose JVM cannot start (``JAVA_HOME`` names no Java) and reports the
error's first line and the zygote processes still running under this process."""

from __future__ import annotations

import os

from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.runner.errors import SparkSessionError
from sparkbeam.runner.options import SparkRunnerOptions
from sparkbeam.runner.spark.session import get_or_create_session


def _zygotes() -> list[int]:
    found = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if parent == os.getpid() and b"sparkbeam.runner.spark.zygote" in f.read():
                    found.append(pid)
        except OSError:
            continue
    return found


if __name__ == "__main__":
    options = PipelineOptions(["--spark_master_url=local[1]"]).view_as(SparkRunnerOptions)
    try:
        get_or_create_session(options)
    except SparkSessionError as e:
        print("ERROR", str(e).splitlines()[0])
    print("ZYGOTES", len(_zygotes()))
    print("ZYGOTE_ENV", os.environ.get("SPARKBEAM_DAEMON_ZYGOTE"))

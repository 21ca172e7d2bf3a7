"""Asks for a local session whose JVM cannot start (``JAVA_HOME`` names no Java) and reports the
error's first line and the zygote processes still running under this process."""

from __future__ import annotations

import os

from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.runner.errors import SparkSessionError
from sparkbeam.runner.options import SparkRunnerOptions
from sparkbeam.runner.spark.session import get_or_create_session
from tests.runner.warm_app import children

if __name__ == "__main__":
    options = PipelineOptions(["--spark_master_url=local[1]"]).view_as(SparkRunnerOptions)
    try:
        get_or_create_session(options)
    except SparkSessionError as e:
        print("ERROR", str(e).splitlines()[0])
    print("ZYGOTES", len(children(os.getpid(), b"sparkbeam.runner.spark.zygote")))
    print("ZYGOTE_ENV", os.environ.get("SPARKBEAM_DAEMON_ZYGOTE"))

"""An app for spark-submit: runs a pipeline, prints the master and app name it ran with.

First with the flags given (e.g. a disagreeing ``--spark_master_url``), printing the
error as ``ERROR: <message>``, then without them; then both again, the session now existing.
"""

from __future__ import annotations

import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to


def run(flags: list[str]) -> None:
    with beam.Pipeline(options=PipelineOptions(["--runner=SparkCheckpointRunner", *flags])) as p:
        assert_that(p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x * 2), equal_to([2, 4, 6]))


if __name__ == "__main__":
    from pyspark import SparkContext

    for _ in range(2):  # before the session exists, and after
        try:
            run(sys.argv[1:])
            print("RAN=ok")
        except Exception as e:  # noqa: BLE001 - the error line is what the test checks
            print(f"ERROR: {type(e).__name__}: {e}")
        run([])
        sc = SparkContext._active_spark_context
        print(f"MASTER={sc.master}")
        print(f"APP_NAME={sc.appName}")
        print(f"DRIVER_JAVA_OPTIONS={sc.getConf().get('spark.driver.extraJavaOptions')}")

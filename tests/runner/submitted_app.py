"""An app for spark-submit: runs a pipeline, prints the master and app name it ran with.

Then runs it again with the extra flags given after ``--`` (e.g. a disagreeing
``--spark_master_url``) and prints the error, if any, as ``ERROR: <message>``.
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

    run([])
    sc = SparkContext._active_spark_context
    print(f"MASTER={sc.master}")
    print(f"APP_NAME={sc.appName}")
    try:
        run(sys.argv[1:])
        print("SECOND=ok")
    except Exception as e:  # noqa: BLE001 - the error line is what the test checks
        print(f"ERROR: {type(e).__name__}: {e}")

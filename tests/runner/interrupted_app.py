"""Break the py4j link the way a test timeout does, then run a pipeline in the same process."""

from __future__ import annotations

import signal
import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to


class Timeout(BaseException):
    """Raised from a signal handler in the middle of a py4j call, like pytest-timeout's."""


def _slow(x):
    import time

    time.sleep(3)
    return x


def _raise(*_):
    raise Timeout()


if __name__ == "__main__":
    from pyspark.sql import SparkSession

    master = sys.argv[1]
    sc = SparkSession.builder.master(master).config("spark.ui.enabled", "false").getOrCreate()
    sc = sc.sparkContext
    signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, 4.0)
    try:
        sc.parallelize(range(4), 2).map(_slow).count()
    except Timeout:
        pass
    try:
        SparkSession.getActiveSession()
        print("NOT BROKEN")
    except Exception as e:  # noqa: BLE001 - the symptom of the issue
        print(f"BROKEN: {type(e).__name__}")
    flags = ["--runner=SparkCheckpointRunner", f"--spark_master_url={master}"]
    with beam.Pipeline(options=PipelineOptions(flags)) as p:
        assert_that(p | beam.Create([1, 2]) | beam.Map(lambda x: x + 1), equal_to([2, 3]))
    print("PIPELINE=ok")

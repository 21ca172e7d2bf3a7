"""User errors name the step and carry the user's traceback; metrics come back."""

from __future__ import annotations

import os
import time

import apache_beam as beam
import pytest
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.testing.util import assert_that, equal_to

from sparkbeam.runner import SparkCheckpointRunner
from sparkbeam.runner.errors import StageFailedError
from tests.conftest import spark_test_options

pytestmark = pytest.mark.spark


def _pipeline():
    return beam.Pipeline(
        runner=SparkCheckpointRunner(), options=PipelineOptions(spark_test_options())
    )


def _explode(x):
    raise ZeroDivisionError(f"user code failed on {x}")


def test_user_exception_names_the_step_and_traceback(spark):
    with pytest.raises(StageFailedError) as info:
        with _pipeline() as p:
            _ = p | beam.Create([1, 2]) | "Explode" >> beam.Map(_explode)
    message = str(info.value)
    assert "Explode" in message
    assert "_explode" in message and "ZeroDivisionError: user code failed on" in message
    assert "py4j" not in message and "at org.apache" not in message


def _fail_on_7(x):
    if x == 7:
        raise ValueError("seven")
    return str(x)


def test_a_failed_run_leaves_no_beam_temp_folder_in_the_output_directory(spark, tmp_path):
    """WriteToText's temporary folder holds the files of the bundles that did write; the run
    fails before the write finalizes, and its folder is removed (another one is left)."""
    other = tmp_path / "beam-temp-out-from-an-earlier-run"
    other.mkdir()
    (other / "part").write_text("kept")
    os.utime(other / "part", (time.time() - 3600, time.time() - 3600))
    with pytest.raises(StageFailedError, match="seven"):
        with _pipeline() as p:
            _ = (
                p
                | beam.Create(range(10))
                | beam.Map(_fail_on_7)
                | beam.io.WriteToText(str(tmp_path / "out"))
            )
    assert sorted(os.listdir(tmp_path)) == [other.name]
    assert (other / "part").read_text() == "kept"


def test_counters_distributions_gauges_are_committed(spark):
    class Measure(beam.DoFn):
        def __init__(self):
            self.count = Metrics.counter("test", "elements")
            self.sizes = Metrics.distribution("test", "sizes")
            self.last = Metrics.gauge("test", "last")

        def process(self, x):
            self.count.inc()
            self.sizes.update(x)
            self.last.set(x)
            yield x

    p = _pipeline()
    out = p | beam.Create([1, 2, 3, 4]) | beam.ParDo(Measure())
    assert_that(out, equal_to([1, 2, 3, 4]))
    result = p.run()
    assert result.wait_until_finish() == PipelineState.DONE
    assert result.cancel() == PipelineState.DONE  # a finished batch run stays DONE
    metrics = result.metrics().query(MetricsFilter().with_namespace("test"))
    (counter,) = metrics["counters"]
    assert counter.committed == 4
    (dist,) = metrics["distributions"]
    assert (dist.committed.sum, dist.committed.count, dist.committed.min, dist.committed.max) == (
        10,
        4,
        1,
        4,
    )
    (gauge,) = metrics["gauges"]
    assert gauge.committed.value in {1, 2, 3, 4}


def test_streaming_without_checkpoint_dir_checkpoints_under_the_job_name(
    spark, caplog, tmp_path, monkeypatch
):
    """--streaming always has a store: ./sparkbeam-checkpoints/<job name>, named in the log."""
    monkeypatch.chdir(tmp_path)
    options = PipelineOptions(spark_test_options("--streaming", "--job_name=my-job"))
    with caplog.at_level("WARNING"):
        p = beam.Pipeline(runner=SparkCheckpointRunner(), options=options)
        counted = p | beam.Create([1, 2]) | beam.Map(_count_and_double)
        assert_that(counted, equal_to([2, 4]))
        result = p.run()
        result.wait_until_finish()
    expected = tmp_path / "sparkbeam-checkpoints" / "my-job"
    assert f"checkpoints go to {expected}" in caplog.text
    assert (expected / "pipelines").is_dir()
    (counter,) = result.metrics().query()["counters"]
    assert counter.committed == 2  # metrics of streaming rounds are merged like batch ones


def _count_and_double(x):
    beam.metrics.Metrics.counter("test", "seen").inc()
    return x * 2


def test_an_executor_python_that_cannot_start_is_reported_as_such(spark, tmp_path):
    """The executors' Python fails at start-up (here: its PYTHONPATH shadows sparkbeam): the
    error names the worker's failure and its PYTHONPATH, not a user transform."""
    from sparkbeam.runner.errors import PythonWorkerStartError

    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['sparkbeam'] = None\n")
    environment = spark.sparkContext.environment  # what PySpark gives every Python worker
    saved = environment.get("PYTHONPATH")
    environment["PYTHONPATH"] = str(tmp_path)  # a new worker daemon, with this path
    try:
        with pytest.raises(PythonWorkerStartError) as info:
            with _pipeline() as p:
                _ = p | beam.Create([1, 2]) | "Inc" >> beam.Map(lambda x: x + 1)
    finally:
        if saved is None:
            environment.pop("PYTHONPATH")
        else:
            environment["PYTHONPATH"] = saved
    first, *rest = str(info.value).splitlines()
    assert "did not start" in first and "No module named 'sparkbeam" in first, first
    assert str(tmp_path) in "\n".join(rest)

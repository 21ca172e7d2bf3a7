"""The error line an operator reads first names the user's exception, even a multi-line one."""

from __future__ import annotations

from sparkbeam.runner.errors import last_error

MULTI_LINE = """Traceback (most recent call last):
  File "/app/check.py", line 1290, in process
    _windowed_value_info_check(actual, data, key)
  File "/app/check.py", line 1053, in _windowed_value_info_check
    raise AssertionError(
AssertionError: Unmatched output for key1: expected
[{'window': [0, 9]}]
 but got
[] [while running 'Check']
"""

CHAINED = """Traceback (most recent call last):
  File "/app/a.py", line 3, in f
    raise ValueError("bad")
ValueError: bad [while running 'M']

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/app/b.py", line 5, in g
    raise KeyError(1)
KeyError: 1
"""


def test_a_multi_line_message_is_named_by_its_first_line():
    assert last_error(MULTI_LINE) == "AssertionError: Unmatched output for key1: expected"


def test_a_chained_error_is_named_by_the_last_exception():
    assert last_error(CHAINED) == "KeyError: 1"


def test_a_bare_message_is_kept():
    assert last_error("RuntimeError: boom [while running 'X']\n") == "RuntimeError: boom"


def test_a_failure_of_a_stage_with_no_known_transforms_still_names_the_stage():
    """A job the server aborted (e.g. its heap ran out) carries no stage tag of ours: the stage
    has no transforms to describe, and the error must say what Spark said, not fail itself."""
    import pytest

    from sparkbeam.runner.errors import StageFailedError, run_guarded

    def aborted():
        raise RuntimeError("Job aborted due to stage failure: java.lang.OutOfMemoryError")

    with pytest.raises(StageFailedError, match="OutOfMemoryError") as failed:
        run_guarded(None, aborted, {}.get)
    assert "<unknown>" in str(failed.value)


# What Spark says when an executor's Python worker cannot even start (trimmed: Java frames).
WORKER_DID_NOT_START = """An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 1.0 failed 1 times, most recent failure: Lost task 0.0 in stage 1.0 (TID 1) (192.0.2.2 executor driver): org.apache.spark.SparkException: 
Error from python worker:
  Fatal Python error: init_import_site: Failed to import the site module
  Python runtime state: initialized
  Traceback (most recent call last):
    File "<frozen site>", line 548, in execsitecustomize
    File "/opt/env/sitecustomize.py", line 2, in <module>
      sys.exit("no beam here")
  SystemExit: no beam here
PYTHONPATH was:
  /opt/spark/python/lib/pyspark.zip:/opt/env
org.apache.spark.SparkException: EOFException occurred while reading the port number from sparkbeam.runner.spark.daemon's stdout.
\tat org.apache.spark.api.python.PythonWorkerFactory.startDaemon(PythonWorkerFactory.scala:300)
"""  # noqa: E501, W291


def test_a_python_worker_that_did_not_start_is_named_as_such_not_as_user_code():
    """Spark's "Error from python worker" block is the worker's own start-up failure: the
    operator reads its last error, where it was raised and the worker's path, and is told to
    fix the executors' Python, not the pipeline's code."""
    import pytest

    from sparkbeam.runner.errors import PythonWorkerStartError, StageFailedError, run_guarded

    def failed():
        raise RuntimeError(WORKER_DID_NOT_START)

    with pytest.raises(PythonWorkerStartError) as info:
        run_guarded("stage-1", failed, {"stage-1": "stage-1: Create/Map"}.get)
    assert isinstance(info.value, StageFailedError)  # what callers already catch
    first, *rest = str(info.value).splitlines()
    assert "Python worker" in first and "did not start" in first
    assert "SystemExit: no beam here" in first
    text = "\n".join(rest)
    assert '/opt/env/sitecustomize.py", line 2' in text
    assert "/opt/spark/python/lib/pyspark.zip:/opt/env" in text
    assert "PYTHONPATH was" not in first and "fix the user code" not in text


# A user's state spec whose coder does not fit its accumulator fails in Beam's commit of the
# stage's state: no frame of the user's code is in the trace (trimmed).
NO_USER_FRAME = """Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/apache_beam/runners/worker/bundle_processor.py", line 1358, in process_bundle
    op.finish()
  File "apache_beam/runners/worker/operations.py", line 988, in apache_beam.runners.worker.operations.DoOperation.finish
  File "/venv/lib/python3.11/site-packages/apache_beam/runners/worker/sdk_worker.py", line 1269, in extend
    coder.encode_to_stream(element, out, True)
  File "apache_beam/coders/coder_impl.py", line 1044, in apache_beam.coders.coder_impl.VarIntCoderImpl.encode_to_stream
TypeError: an integer is required
"""  # noqa: E501


def test_a_failure_with_no_user_frame_does_not_point_at_user_code_above():
    from sparkbeam.runner.errors import StageFailedError

    message = str(StageFailedError("stage-3", NO_USER_FRAME, "stage-3: ParDo + Write"))
    assert "Error: TypeError: an integer is required" in message
    assert "above" not in message  # nothing of the user's is above
    assert "no frame of your code" in message
    assert "coders" in message  # where such an error usually comes from

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

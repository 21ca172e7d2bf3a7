"""Beam's own WindowTest, from the installed apache-beam wheel, on SparkCheckpointRunner.

It exercises sparkbeam's WindowInto operation (``runner/task/window_into.py``) for every
standard WindowFn -- sliding windows with a period longer than the size, offsets, sessions,
re-windowing an element that sits in three windows -- and Beam's own operation for a custom
WindowFn. ``TestPipeline()`` names no runner: the fixture makes sparkbeam the default.
"""

from __future__ import annotations

import pytest
from apache_beam.options.pipeline_options import StandardOptions
from apache_beam.transforms import window_test

from tests.conftest import get_test_session

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module", autouse=True)
def sparkbeam_is_the_default_runner():
    get_test_session()
    previous = StandardOptions.DEFAULT_RUNNER
    StandardOptions.DEFAULT_RUNNER = "sparkbeam.runner.SparkCheckpointRunner"
    yield
    StandardOptions.DEFAULT_RUNNER = previous


class WindowTest(window_test.WindowTest):
    pass

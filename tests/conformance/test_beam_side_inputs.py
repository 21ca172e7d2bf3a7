"""Beam's own SideInputsTest, from the installed apache-beam wheel, on SparkCheckpointRunner.

``TestPipeline()`` names no runner: the fixture makes sparkbeam the default (the shared test
session is the active one, so every run uses it). Every test sparkbeam deliberately answers
otherwise is in DIFFERENCES with its reason. All 22 take about 2-5 min on 2 cores; most are
batch side inputs that FnApiRunnerTest covers too, so CI runs those CI_TESTS and the
DIFFERENCES only (windowed views, an SDF reading a side input, the singleton errors);
SPARKBEAM_FULL_CONFORMANCE=1 runs all.
"""

from __future__ import annotations

import os
import unittest

import pytest
from apache_beam.options.pipeline_options import StandardOptions
from apache_beam.transforms import sideinputs_test

from tests.conftest import get_test_session

pytestmark = [pytest.mark.spark, pytest.mark.slow]

# Deliberate differences: each runs, as xfail(strict=True) (tests/conftest.py), so a change of
# behaviour shows.
DIFFERENCES: dict[str, str] = {
    # Beam 2.77 expects the main element of window [0, 5) to see [100, 0]: the early pane and
    # the on-time pane added up, read once the side input's watermark is at +inf (the Python
    # DirectRunner's rule). sparkbeam follows Beam's programming guide instead: a
    # triggered side input's view is its latest firing, read as soon as the window has a pane
    # (``runner/rounds/side_input_view.py``), so the element sees [100], the only firing then.
    # tests/streaming/test_side_input_firings.py asserts that rule, pane by pane.
    "test_multi_triggered_gbk_side_input": "latest firing (programming guide), not all panes",
}

CI_TESTS = frozenset(
    {
        "test_sliding_windows",
        "test_fixed_global_window",
        "test_windowed_dict",
        "test_multi_valued_singleton_side_input",
        "test_side_input_with_sdf",
    }
)
FULL = bool(os.environ.get("SPARKBEAM_FULL_CONFORMANCE"))


@pytest.fixture(scope="module", autouse=True)
def sparkbeam_is_the_default_runner():
    get_test_session()
    previous = StandardOptions.DEFAULT_RUNNER
    StandardOptions.DEFAULT_RUNNER = "sparkbeam.runner.SparkCheckpointRunner"
    yield
    StandardOptions.DEFAULT_RUNNER = previous


class SideInputsTest(sideinputs_test.SideInputsTest):
    def setUp(self):
        if not FULL and self._testMethodName not in CI_TESTS | DIFFERENCES.keys():
            raise unittest.SkipTest(
                "FnApiRunnerTest covers it: SPARKBEAM_FULL_CONFORMANCE=1 runs it"
            )
        super().setUp()

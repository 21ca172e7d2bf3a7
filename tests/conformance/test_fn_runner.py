"""Beam's own FnApiRunnerTest, run on SparkCheckpointRunner.

Subclassed from the installed apache-beam wheel, never copied. Every test we
do not pass yet is in SKIPS below, with the reason and the issue that closes it.
"""

from __future__ import annotations

import unittest

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import fn_runner_test

from sparkbeam.runner import SparkCheckpointRunner
from tests.conftest import get_test_session, spark_test_options

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SDF_ISSUE = "splittable DoFn residuals with delays/watermarks: issue 4 (SDF residuals)"

SKIPS: dict[str, str] = {}


class SparkCheckpointRunnerConformanceTest(fn_runner_test.FnApiRunnerTest):
    @classmethod
    def setUpClass(cls):
        get_test_session()

    def setUp(self):
        reason = SKIPS.get(self._testMethodName)
        if reason:
            raise unittest.SkipTest(reason)

    def create_pipeline(self, is_drain=False):
        return beam.Pipeline(
            runner=SparkCheckpointRunner(is_drain=is_drain),
            options=PipelineOptions(spark_test_options()),
        )

"""Beam's own FnApiRunnerTest over Spark Connect: the conformance suite on the frames plane.

The same subclass as ``tests/conformance/test_fn_runner.py`` (Beam's tests from the installed
wheel, never copied), with every pipeline sent to the module's local Spark Connect server
(``--spark_remote``) instead of the shared classic session. The server's Python workers get
sparkbeam only as a session artifact, so a pass here also proves shipping.
"""

from __future__ import annotations

import unittest

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import fn_runner_test

from sparkbeam.runner import SparkCheckpointRunner

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.connect]

SKIPS: dict[str, str] = {}


class ConnectConformanceTest(fn_runner_test.FnApiRunnerTest):
    remote: str = ""

    @pytest.fixture(autouse=True)
    def _server(self, connect_server):
        type(self).remote = connect_server.url

    def setUp(self):
        reason = SKIPS.get(self._testMethodName)
        if reason:
            raise unittest.SkipTest(reason)

    def create_pipeline(self, is_drain=False):
        options = ["--runner=SparkCheckpointRunner", f"--spark_remote={self.remote}"]
        return beam.Pipeline(
            runner=SparkCheckpointRunner(is_drain=is_drain), options=PipelineOptions(options)
        )

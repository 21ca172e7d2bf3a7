"""Beam's own TestStream tests, from the installed apache-beam wheel, on SparkCheckpointRunner.

The tests build ``TestPipeline(options=...)`` without naming a runner, so Beam picks
``StandardOptions.DEFAULT_RUNNER``: the fixture below makes that sparkbeam for the duration of
this module (the shared test session is the active one, so every run uses it). Every test we
do not pass is in SKIPS (cannot run here) or DIFFERENCES (runs,
must fail) with its reason.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import unittest

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import StandardOptions
from apache_beam.runners.portability.fn_api_runner import fn_runner_test
from apache_beam.testing import test_stream_test
from apache_beam.transforms import deduplicate_test, trigger_test, userstate_test

from tests.conftest import get_test_session

pytestmark = [pytest.mark.spark, pytest.mark.slow]

RUNNER = "sparkbeam.runner.SparkCheckpointRunner"

SKIPS: dict[str, str] = {
    # Not runner behaviour: the TestStreamService over gRPC and the interactive recorder.
    "test_basic_execution_with_service": "reads events from a TestStreamService endpoint",
}
# Deliberate differences (and tests no portable runner can pass): each runs, as
# xfail(strict=True) (tests/conftest.py), so a change of behaviour shows.
DIFFERENCES: dict[str, str] = {
    # Side-input readiness: the test expects the main input to wait until the side input's
    # watermark is at +inf (the Python DirectRunner's rule). sparkbeam, like Beam's Java
    # SideInputHandler (Flink), releases it once the side input's window has data, which an
    # unbounded global-window side input needs (it never reaches +inf).
    "test_basic_execution_sideinputs": "side input ready at its first data, not at +inf",
    # A WindowedValueHolder element names windows of its own, but the TestStream's output
    # PCollection is globally windowed: its coder (GlobalWindowCoder) cannot carry them across
    # a data channel. Only the Python DirectRunner, which hands over objects, keeps them.
    "test_windowed_values_interpreted_correctly": "windows a GlobalWindowCoder cannot carry",
    # Beam skips it for every runner, and it fails on Beam's DirectRunner too: Deduplicate sets
    # its processing-time timer from Timestamp.now() inside the DoFn (the wall clock), so the
    # TestStream's advance_processing_time never reaches it and k1 at 70 stays a duplicate.
    "test_deduplication_with_processing_time": "timer set from the wall clock in the DoFn",
    # OUTPUT_AT_EARLIEST_TRANSFORMED has no value in the runner API's OutputTime enum
    # ("TODO(robertwb): Add this to the runner API or remove it"), so the pipeline cannot be
    # turned into a portable proto for any portable runner; Beam's BatchTranscriptTest skips
    # it the same way ("Non-fnapi timestamp combiner").
    "test_timestamp_combiner_custom_timestamping_earliest_1": "no runner-API OutputTime for it",
}

# Each trigger transcript is 20-60 TestStream events, one Spark-job round each: about 1-2 min
# per test on 2 cores. CI runs these two of the strict class (a transcript that passes and one
# that must fail); all 42 (strict and weak) run with
# SPARKBEAM_FULL_CONFORMANCE=1. Cheaper rounds are issue 14 (the per-job fixed cost).
CI_TRANSCRIPTS = frozenset({"test_fixed_default", "test_bad_output"})
FULL = bool(os.environ.get("SPARKBEAM_FULL_CONFORMANCE"))


@pytest.fixture(scope="module", autouse=True)
def sparkbeam_is_the_default_runner():
    get_test_session()
    previous = StandardOptions.DEFAULT_RUNNER
    StandardOptions.DEFAULT_RUNNER = RUNNER
    yield
    StandardOptions.DEFAULT_RUNNER = previous


class _Skips:
    def setUp(self):
        reason = SKIPS.get(self._testMethodName)
        if reason:
            raise unittest.SkipTest(reason)
        super().setUp()


class TestStreamTest(_Skips, test_stream_test.TestStreamTest):
    pass


def _unskipped(method):
    """A test Beam skips for every runner ('TestStream not yet supported'), skip dropped."""
    return getattr(method, "__wrapped__", method)


class DeduplicateTest(_Skips, deduplicate_test.DeduplicateTest):
    test_deduplication_with_event_time = _unskipped(
        deduplicate_test.DeduplicateTest.test_deduplication_with_event_time
    )
    test_deduplication_with_processing_time = _unskipped(
        deduplicate_test.DeduplicateTest.test_deduplication_with_processing_time
    )


class _RecordsFile(list):
    """The test's ``all_records``, kept in a file: Spark runs the recording DoFn in Python
    worker processes, where the test class's list is not the test's. Reads see every record."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def _load(self) -> list:
        if not os.path.exists(self.path):
            return []
        with open(self.path, "rb") as f:
            data = f.read()
        records, offset = [], 0
        while offset < len(data):
            size = int.from_bytes(data[offset : offset + 4], "big")
            records.append(pickle.loads(data[offset + 4 : offset + 4 + size]))
            offset += 4 + size
        return records

    def __eq__(self, other):
        return self._load() == list(other)

    def __iter__(self):
        return iter(self._load())

    def __len__(self):
        return len(self._load())

    def __getitem__(self, index):
        return self._load()[index]

    def __repr__(self):
        return repr(self._load())


class _AppendRecord(beam.DoFn):
    def __init__(self, path: str) -> None:
        self.path = path

    def process(self, element):
        blob = pickle.dumps(element)
        with open(self.path, "ab") as f:  # one write per record: whole records only
            f.write(len(blob).to_bytes(4, "big") + blob)


class StatefulDoFnOnDirectRunnerTest(_Skips, userstate_test.StatefulDoFnOnDirectRunnerTest):
    def setUp(self):
        super().setUp()
        handle, path = tempfile.mkstemp(prefix="sparkbeam-records-")
        os.close(handle)
        os.unlink(path)
        self.addCleanup(lambda: os.path.exists(path) and os.unlink(path))
        userstate_test.StatefulDoFnOnDirectRunnerTest.all_records = _RecordsFile(path)

    def record_dofn(self):
        return _AppendRecord(userstate_test.StatefulDoFnOnDirectRunnerTest.all_records.path)


class _Transcripts(_Skips):
    in_ci: frozenset = frozenset()

    def setUp(self):
        if not FULL and self._testMethodName not in self.in_ci:
            raise unittest.SkipTest("1-2 min per transcript: SPARKBEAM_FULL_CONFORMANCE=1 runs it")
        super().setUp()


class TestStreamTranscriptTest(_Transcripts, trigger_test.TestStreamTranscriptTest):
    in_ci = CI_TRANSCRIPTS  # the strict variant: its passing implies the weak one's


class WeakTestStreamTranscriptTest(_Transcripts, trigger_test.WeakTestStreamTranscriptTest):
    pass


class FnApiRunnerTestStreamTest(unittest.TestCase):
    """The TestStream test of Beam's FnApiRunnerTest, which Beam skips for every runner."""

    def create_pipeline(self, is_drain=False):
        from apache_beam.testing.test_pipeline import TestPipeline

        return TestPipeline()

    test_teststream_pardo_timers = _unskipped(
        fn_runner_test.FnApiRunnerTest.test_teststream_pardo_timers
    )

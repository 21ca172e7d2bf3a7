"""Runner-initiated splits: residuals and unread input go back to the driver, nothing lost."""

from __future__ import annotations

import collections
import itertools
import threading
import time

import apache_beam as beam
import pytest
from apache_beam.coders import coders
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.testing.util import BeamAssertException, assert_that
from apache_beam.utils.windowed_value import WindowedValue

from sparkbeam.runner.errors import PipelineOptionsError
from sparkbeam.runner.options import SparkRunnerOptions
from sparkbeam.runner.task.bundle_splits import (
    BundleSplitError,
    BundleSplitter,
    SplitPolicy,
    encoded_elements,
)
from sparkbeam.sdf import OffsetRangeProvider
from tests.conftest import spark_test_options

_CODER = coders.WindowedValueCoder(coders.VarIntCoder()).get_impl()


class PacedRange(beam.DoFn):
    """Claims [0, size) one position at a time, sleeping ``pace_s`` after each claim.

    Emits (name, position, start of the call's restriction): with no deferral, a
    start > 0 means the call processed the residual of a runner-initiated split.
    """

    def __init__(self, pace_s: float) -> None:
        self.pace_s = pace_s

    def process(self, element, tracker=beam.DoFn.RestrictionParam(OffsetRangeProvider())):
        start = pos = tracker.current_restriction().start
        while tracker.try_claim(pos):
            time.sleep(self.pace_s)
            yield element[0], pos, start
            pos += 1


def _encoded(values) -> bytes:
    out = b""
    for v in values:
        out += _CODER.encode_nested(WindowedValue(v, 0, ()))
    return out


def test_options_parse_into_a_split_policy():
    default = SparkRunnerOptions([]).sdf_split_policy()
    assert default == SplitPolicy(2.0, (0.5,)) and default.enabled and not default.every_bundle
    given = SparkRunnerOptions(["--sdf_split_after_s=0.25", "--sdf_split_fractions=0.1,0.9"])
    assert given.sdf_split_policy() == SplitPolicy(0.25, (0.1, 0.9), every_bundle=True)
    assert not SparkRunnerOptions(["--sdf_split_after_s=0"]).sdf_split_policy().enabled
    bad = SparkRunnerOptions(["--sdf_split_fractions=0.5,1.5"])
    with pytest.raises(PipelineOptionsError, match=r"--sdf_split_fractions '0.5,1.5'.*\[0, 1\)"):
        bad.sdf_split_policy()
    with pytest.raises(PipelineOptionsError, match="--sdf_split_fractions 'half'"):
        SparkRunnerOptions(["--sdf_split_fractions=half"]).sdf_split_policy()


def test_only_a_bundle_of_one_element_is_split_unless_every_bundle():
    coders = {"read": _CODER}
    one, two = {"read": [_encoded([7])]}, {"read": [_encoded([7]), _encoded([8])]}
    assert SplitPolicy().applies(coders, one)
    assert not SplitPolicy().applies(coders, two)
    assert not SplitPolicy().applies(coders, {"read": [_encoded([7, 8])]})  # one chunk, two
    assert SplitPolicy(every_bundle=True).applies(coders, two)
    assert not SplitPolicy(0.0).applies(coders, one)


def test_encoded_elements_cuts_a_stream_at_element_boundaries():
    chunks = [_encoded([1, 300]), _encoded([70000])]
    elements = encoded_elements(_CODER, chunks)
    assert elements == [_encoded([1]), _encoded([300]), _encoded([70000])]


class _ScriptedWorker:
    """Answers split requests with scripted responses, then empty ones."""

    def __init__(self, responses, fail: Exception | None = None) -> None:
        self.responses = list(responses)
        self.fail = fail
        self.requests: list = []
        self.answered = threading.Event()

    def do_instruction(self, request):
        self.requests.append(request.process_bundle_split)
        if self.fail:
            self.answered.set()
            raise self.fail
        split = self.responses.pop(0) if self.responses else None
        if not self.responses:
            self.answered.set()
        return beam_fn_api_pb2.InstructionResponse(
            process_bundle_split=split or beam_fn_api_pb2.ProcessBundleSplitResponse()
        )


def _split(first_residual: int, residuals: int = 0):
    response = beam_fn_api_pb2.ProcessBundleSplitResponse(
        channel_splits=[
            beam_fn_api_pb2.ProcessBundleSplitResponse.ChannelSplit(
                transform_id="read",
                last_primary_element=first_residual - 1,
                first_residual_element=first_residual,
            )
        ]
    )
    for _ in range(residuals):
        response.residual_roots.add().application.element = b"rest"
    return response


def _run_splitter(worker) -> BundleSplitter:
    inputs = {"read": [_encoded(range(10))]}
    splitter = BundleSplitter(
        worker,
        "b1",
        inputs,
        {"read": _CODER},
        SplitPolicy(0.001, (0.3, 0.6)),
        itertools.cycle([0.3, 0.6]),
    )
    with splitter:
        assert worker.answered.wait(10)
    return splitter


def test_unread_elements_are_those_after_the_lowest_first_residual_element():
    # Two splits: the second moves the boundary down, and splits element 3 itself.
    # A third response moves nothing (its boundary is past the end): not a split.
    worker = _ScriptedWorker([_split(7), _split(4, residuals=1), _split(10)])
    outcome = _run_splitter(worker).outcome()
    assert outcome.splits == 2
    assert [r.application.element for r in outcome.residual_roots] == [b"rest"]
    assert outcome.unread == {"read": [_encoded([v]) for v in range(4, 10)]}
    first = worker.requests[0].desired_splits["read"]
    assert (first.fraction_of_remainder, first.estimated_input_elements) == (0.3, 10)
    assert worker.requests[1].desired_splits["read"].fraction_of_remainder == 0.6


def test_a_failing_split_request_is_reported_naming_the_bundle():
    worker = _ScriptedWorker([], fail=ValueError("try_split exploded"))
    splitter = _run_splitter(worker)
    with pytest.raises(
        BundleSplitError, match="bundle 'b1' failed: ValueError: try_split exploded"
    ):
        splitter.outcome()


def _exactly_once(expected, from_split: bool | None):
    """Matcher: every (name, position) once; some (True) or no (False) call ran a split
    residual (None: either; a split at an element boundary leaves no residual root)."""

    def match(items):
        got = collections.Counter((name, pos) for name, pos, _ in items)
        if got != collections.Counter(expected):
            raise BeamAssertException(f"lost or duplicated: {got - collections.Counter(expected)}")
        residual_calls = sorted({(name, start) for name, _, start in items if start > 0})
        if from_split is not None and bool(residual_calls) != from_split:
            raise BeamAssertException(f"calls on split residuals: {residual_calls}")

    return match


def _run(elements, *flags, from_split: bool | None = True) -> dict[str, int]:
    """Run PacedRange over ``elements``; returns the ``sparkbeam`` counters."""
    expected = [(name, pos) for name, size in elements for pos in range(size)]
    p = beam.Pipeline(options=PipelineOptions(spark_test_options(*flags)))
    outputs = p | beam.Create(elements) | beam.ParDo(PacedRange(0.005))
    assert_that(outputs, _exactly_once(expected, from_split))
    result = p.run()
    result.wait_until_finish()
    counters = result.metrics().query(MetricsFilter().with_namespace("sparkbeam"))["counters"]
    return {c.key.metric.name: c.committed for c in counters}


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("durable", [False, True], ids=["in-memory", "checkpoint-dir"])
def test_split_residuals_are_processed_in_a_later_round_and_nothing_is_lost(
    spark, tmp_path, durable
):
    elements = [("a", 60), ("b", 40)]
    flags = ["--sdf_split_after_s=0.1", "--sdf_split_fractions=0.5"]
    if durable:
        flags.append(f"--checkpoint_dir={tmp_path / 'ckpt'}")
    counts = _run(elements, *flags)
    assert counts["runner_splits"] >= 2  # each element's bundle runs 0.2-0.3 s
    assert counts["runner_split_residuals"] >= 2
    # Off: the same output, no split, and no call starts past position 0.
    assert _run(elements, "--sdf_split_after_s=0", from_split=False) == {}


@pytest.mark.spark
@pytest.mark.slow
def test_input_elements_a_split_bundle_did_not_read_are_fed_again(spark):
    elements = [(f"e{i}", 3) for i in range(40)]  # one bundle of 40 elements, ~0.6 s
    split = ("--parallelism=1", "--sdf_split_after_s=0.1")
    counts = _run(elements, *split, "--sdf_split_fractions=0.5", from_split=None)
    assert counts["runner_split_unread_elements"] > 0
    # Without the testing knob a bundle of several elements is left whole.
    assert _run(elements, *split, from_split=False) == {}

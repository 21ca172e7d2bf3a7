"""Residuals become keyed state under processing-time timers, fed back after their delay."""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from sparkbeam.sdf import MemoryResiduals, ResidualRecord, StateAndTimerBundleCheckpointHandler
from tests.conftest import spark_test_options
from tests.sdf.sdfs import ChunkedWithDelay


def _handler():
    return StateAndTimerBundleCheckpointHandler(MemoryResiduals(), "stage-1")


def _record(element: bytes, produced_ms: float, delay_ms: float, hold: int = 0) -> ResidualRecord:
    return ResidualRecord("stage-1", "read", element, produced_ms, delay_ms, hold)


def test_handler_keeps_residuals_as_state_and_fires_in_time_order():
    h = _handler()
    h.add([_record(b"b", 1000.0, 500.0, hold=7), _record(b"a", 1000.0, 250.0, hold=5)])
    assert h.pending() == 2
    assert len(list(h.state.items())) == 2  # keyed state, one entry each
    assert h.next_fire_ms() == 1250
    assert h.watermark_hold_micros() == 5
    assert h.pop_due(1249.0) == []  # never before its delay
    (first,) = h.pop_due(1250.0)
    assert (first.element, first.transform, first.hold_micros) == (b"a", "read", 5)
    assert h.watermark_hold_micros() == 7  # the fired residual's hold is released
    (second,) = h.pop_due(10_000.0)
    assert second.element == b"b"
    assert h.pending() == 0 and list(h.state.items()) == []


def test_identical_residuals_are_both_kept():
    h = _handler()
    h.add([_record(b"same", 0.0, 0.0), _record(b"same", 0.0, 0.0)])
    assert len(h.pop_due(1.0)) == 2


def test_timers_are_rebuilt_from_state_after_restore():
    h = _handler()
    h.add([_record(b"x", 100.0, 100.0, hold=3), _record(b"y", 100.0, 300.0, hold=9)])
    again = StateAndTimerBundleCheckpointHandler(h.state, "stage-1")
    assert again.restore() == 2
    assert (again.next_fire_ms(), again.watermark_hold_micros()) == (200, 3)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize(
    "budget, slack",
    [("5", 0.5), ("0", 3.0)],
    ids=["re-fed-by-task", "re-fed-by-the-driver-in-rounds"],
)
def test_defer_remainder_is_honoured_to_the_millisecond(spark, budget, slack):
    delay = 0.25
    options = PipelineOptions(spark_test_options(f"--residual_budget_s={budget}"))
    with beam.Pipeline(options=options) as p:
        out = (
            p
            | beam.Create([("a", 6), ("b", 4)])
            | beam.ParDo(ChunkedWithDelay(per_call=2, delay_s=delay))
        )
        calls = out | beam.Map(lambda t: (t[0], t[2])) | beam.Distinct()
        positions = out | beam.Map(lambda t: (t[0], t[1]))
        assert_that(
            positions, equal_to([("a", i) for i in range(6)] + [("b", i) for i in range(4)])
        )
        gaps = (
            calls
            | beam.GroupByKey()
            | beam.MapTuple(lambda k, ts: [b - a for a, b in zip(sorted(ts), sorted(ts)[1:])])
        )
        assert_that(
            gaps | beam.Map(lambda g: all(x >= delay for x in g) and len(g)),
            equal_to([2, 1]),
            label="never early",
        )
        # Loosely: re-invoked soon after the delay (the driver path pays a Spark job per round).
        assert_that(
            gaps | beam.Map(lambda g, s=slack: all(x < delay + s for x in g)),
            equal_to([True, True]),
            label="not much later",
        )


@pytest.mark.spark
@pytest.mark.slow
def test_100k_pending_residuals_go_through_the_store_and_all_come_back(spark):
    """Every element defers once: 100,000 residuals pending at once (a run without a store:
    the driver keeps them)."""
    n = 100_000
    options = PipelineOptions(spark_test_options("--residual_budget_s=0"))
    with beam.Pipeline(options=options) as p:
        counts = (
            p
            | beam.Create([(f"e{i}", 2) for i in range(n)])
            | beam.ParDo(ChunkedWithDelay(per_call=1, delay_s=0.5))
            | beam.Map(lambda t: t[1])
            | beam.combiners.Count.PerElement()
        )
        assert_that(counts, equal_to([(0, n), (1, n)]))

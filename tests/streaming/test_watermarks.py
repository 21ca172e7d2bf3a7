"""Per-round watermark propagation (pure; no Spark): sources, holds and GroupByKey inputs."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.runner.runner import portable_proto
from sparkbeam.runner.streaming import watermarks
from sparkbeam.translation import translate
from sparkbeam.translation.plan import EdgeKind
from tests.streaming.streaming_pipelines import windowed_counts


def _plan():
    p = beam.Pipeline(options=PipelineOptions())
    windowed_counts(p, [("a", 10)])
    return translate(portable_proto(p, PipelineOptions()))


def _group_buffer(plan):
    (edge,) = [e for e in plan.edges if e.kind == EdgeKind.GROUP]
    return edge.id


def test_impulse_pending_holds_everything_at_minus_infinity():
    plan = _plan()
    marks = watermarks.compute(plan, list(plan.stages), True, {}, {})
    assert set(marks.stage_input.values()) == {watermarks.MIN}


def test_sdf_residual_hold_is_the_group_input_watermark():
    plan = _plan()
    (sdf,) = [s for s in plan.stages if s.is_sdf_process]
    marks = watermarks.compute(plan, list(plan.stages), False, {sdf.id: 7_000_000}, {})
    assert marks.group_input[_group_buffer(plan)] == 7_000_000
    assert marks.source() == 7_000_000


def test_a_group_hold_delays_its_consumers_but_not_its_own_input():
    plan = _plan()
    group = _group_buffer(plan)
    (sdf,) = [s for s in plan.stages if s.is_sdf_process]
    marks = watermarks.compute(plan, list(plan.stages), False, {sdf.id: 9_000_000}, {group: 4})
    assert marks.group_input[group] == 9_000_000  # else the group could never fire
    (consumer,) = [s for s in plan.stages if group in s.input_buffers]
    assert marks.stage_input[consumer.id] == 4


def test_done_sources_reach_plus_infinity():
    plan = _plan()
    marks = watermarks.compute(plan, list(plan.stages), False, {}, {})
    assert marks.group_input[_group_buffer(plan)] == watermarks.MAX

"""The TestStream player alone: events in order, one per idle round, encoded for the readers."""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners import pipeline_context
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils import timestamp

from sparkbeam.runner.streaming.test_stream import MAX, MIN, Position, jump_clock, player_for
from sparkbeam.translation import translate


def _plan(stream):
    p = beam.Pipeline()
    events = p | "Events" >> stream
    if isinstance(events, dict) or hasattr(events, "keys"):
        for tag in ("a", "b"):
            _ = events[tag] | f"Use {tag}" >> beam.Map(str)
    else:
        _ = events | beam.Map(str)
    return translate(p.to_runner_api())


def _decode(plan, buffer, rows):
    components = beam_runner_api_pb2.Components.FromString(plan.components)
    coder = pipeline_context.PipelineContext(components).coders[plan.edge(buffer).read_coder]
    # The readers' wire coder is the safe one: values arrive in the TestStream's element coder.
    element = beam.coders.FastPrimitivesCoder()
    decoded = [coder.get_impl().decode_nested(row) for row in rows]
    return [(element.decode(v.value), v.timestamp) for v in decoded]


def test_events_apply_in_order_one_per_idle_round():
    stream = (
        TestStream()
        .advance_watermark_to(10)
        .add_elements(["a", TimestampedValue("b", 3)])
        .advance_processing_time(3600)
        .advance_watermark_to_infinity()
    )
    plan = _plan(stream)
    player = player_for(plan, [s.id for s in plan.stages])
    (buffer,) = player.buffers.values()
    pos = Position()
    assert player.watermarks(pos) == {buffer: MIN}

    step = player.step(pos, idle=False)  # busy: the event waits
    assert step.elements == {} and step.position == pos

    pos = player.step(pos, idle=True).position
    assert player.watermarks(pos) == {buffer: 10_000_000}
    step = player.step(pos, idle=True)
    assert _decode(plan, buffer, step.elements[buffer]) == [
        ("a", timestamp.Timestamp(10)),
        ("b", timestamp.Timestamp(3)),
    ]
    pos = player.step(step.position, idle=True).position
    assert pos.clock_micros == 3600 * 10**6
    pos = player.step(pos, idle=True).position
    assert player.watermarks(pos) == {buffer: MAX} and not pos.exhausted
    pos = player.step(pos, idle=True).position
    assert pos.exhausted and player.step(pos, idle=True).position == pos
    assert Position.from_dict(pos.to_dict()) == pos


def test_tagged_outputs_get_their_own_watermarks_and_elements():
    stream = (
        TestStream(output_tags={"a", "b"})
        .advance_watermark_to(5, tag="a")
        .add_elements([1], tag="b")
    )
    plan = _plan(stream)
    player = player_for(plan, [s.id for s in plan.stages])
    a, b = player.buffers["a"], player.buffers["b"]
    pos = player.step(Position(), idle=True).position
    assert player.watermarks(pos) == {a: 5_000_000, b: MIN}
    step = player.step(pos, idle=True)
    assert list(step.elements) == [b]
    assert [v for v, _ in _decode(plan, b, step.elements[b])] == [1]


def test_the_clock_jumps_only_forward_to_the_next_timer():
    pos = Position(next_event=3, clock_micros=5, exhausted=True)
    assert jump_clock(pos, None) == pos
    assert jump_clock(pos, 2) == pos
    assert jump_clock(pos, 7_000).clock_micros == 7_000


def test_two_test_streams_in_one_pipeline_are_refused_by_name():
    p = beam.Pipeline()
    one = p | "One" >> TestStream().add_elements([1])
    two = p | "Two" >> TestStream().add_elements([2])
    _ = (one, two) | beam.Flatten() | beam.Map(str)
    plan = translate(p.to_runner_api())
    with pytest.raises(ValueError, match=r"several TestStreams \('One', 'Two'\)"):
        player_for(plan, [s.id for s in plan.stages])

"""Playing a TestStream: one event per round, each applied only when the pipeline is idle.

Idle: no watermark would move and no timer or residual is due at the current (virtual) time.
An element event feeds the round; a watermark event moves one output's watermark before the
round's watermarks are computed; a processing-time event moves the virtual clock the round's
tasks read (starting at 0, the epoch, as Beam's ``TestClock``). After the last event every
output is at +inf and the clock jumps to the next pending timer, so a 1-hour resume delay costs
one round. The position is in each round's checkpoint, so the pipeline resumes where it stopped.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners import pipeline_context
from apache_beam.testing.test_stream import WindowedValueHolder
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils import timestamp, windowed_value

from sparkbeam.runner.streaming.watermarks import MAX, MIN
from sparkbeam.translation.plan import BufferId, ExecutionPlan
from sparkbeam.translation.test_stream import TestStreamSource


@dataclass(frozen=True)
class Position:
    """Where the TestStream is: the next event to apply, its clock and output watermarks."""

    next_event: int = 0
    clock_micros: int = 0
    watermarks: dict[str, int] = field(default_factory=dict)  # buffer -> micros
    exhausted: bool = False  # every event applied, every output at +inf

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> Position:
        if not data:
            return cls()
        return cls(
            int(data["next_event"]),
            int(data["clock_micros"]),
            {k: int(v) for k, v in data["watermarks"].items()},
            bool(data["exhausted"]),
        )


@dataclass(frozen=True)
class Step:
    """What one round gets from the TestStream: its elements by buffer, and the new position."""

    elements: dict[str, list[bytes]]
    position: Position


class TestStreamPlayer:
    """The events of one pipeline's TestStream, encoded for the buffers its readers read."""

    __test__ = False  # not a pytest test class

    def __init__(self, plan: ExecutionPlan, source: TestStreamSource) -> None:
        self.source = source
        payload = beam_runner_api_pb2.TestStreamPayload.FromString(source.payload)
        self.events = list(payload.events)
        self.buffers = {tag: buffer for tag, buffer in source.outputs}
        components = beam_runner_api_pb2.Components.FromString(plan.components)
        context = pipeline_context.PipelineContext(components)
        element_coder = context.coders[payload.coder_id]
        self._encoders = {
            buffer: _Encoder(element_coder, context.coders[plan.edge(buffer).write_coder])
            for buffer in self.buffers.values()
        }

    def watermarks(self, position: Position) -> dict[str, int]:
        """The output watermark of every buffer of this TestStream (-inf until advanced)."""
        if position.exhausted:
            return dict.fromkeys(self.buffers.values(), MAX)
        return {b: position.watermarks.get(b, MIN) for b in self.buffers.values()}

    def step(self, position: Position, idle: bool) -> Step:
        """Apply the next event if the pipeline is ``idle``; otherwise apply nothing."""
        if not idle or position.exhausted:
            return Step({}, position)
        if position.next_event >= len(self.events):
            return Step({}, replace(position, exhausted=True))
        event = self.events[position.next_event]
        position = replace(position, next_event=position.next_event + 1)
        kind = event.WhichOneof("event")
        if kind == "element_event":
            buffer = self._buffer(event.element_event.tag)
            encode = self._encoders[buffer]
            rows = [encode(e.encoded_element, e.timestamp) for e in event.element_event.elements]
            return Step({buffer: rows}, position)
        if kind == "watermark_event":
            buffer = self._buffer(event.watermark_event.tag)
            micros = min(MAX, event.watermark_event.new_watermark * 1000)
            micros = max(micros, position.watermarks.get(buffer, MIN))  # never backwards
            marks = {**position.watermarks, buffer: micros}
            return Step({}, replace(position, watermarks=marks))
        advance = event.processing_time_event.advance_duration * 1000
        return Step({}, replace(position, clock_micros=position.clock_micros + advance))

    def _buffer(self, tag: str) -> BufferId:
        if tag in self.buffers:
            return self.buffers[tag]
        if not tag and len(self.buffers) == 1:
            return next(iter(self.buffers.values()))
        raise ValueError(
            f"TestStream {self.source.transform!r} has an event for output tag {tag!r}, "
            f"but its outputs are {sorted(self.buffers)}; add the tag to the TestStream's "
            "output_tags."
        )


class TestStreamClock:
    """A pipeline's TestStream as its rounds see it: the position, the round's events, the
    virtual clock, the output watermarks, and when the TestStream lets the pipeline end."""

    __test__ = False  # not a pytest test class

    def __init__(self, player: TestStreamPlayer) -> None:
        self.player = player
        self.position = Position()
        self.played_out = False  # played to the end, and nothing is scheduled any more

    def restore(self, data: dict | None) -> None:
        """The position of the restored checkpoint (from the start without one)."""
        self.position, self.played_out = Position.from_dict(data), False

    def now_ms(self) -> float:
        return self.position.clock_micros / 1000.0

    def play(self, idle: bool, next_timer_ms: float | None) -> dict[str, list[bytes]]:
        """The next event if the pipeline is ``idle``: its elements by buffer. Played out
        and idle, the clock jumps to the next timer; with none, the TestStream is over."""
        step = self.player.step(self.position, idle)
        if idle and self.position.exhausted and step.position == self.position:
            micros = None if next_timer_ms is None else next_timer_ms * 1000.0
            self.played_out = next_timer_ms is None
            self.position = jump_clock(self.position, micros)
        else:
            self.position = step.position
        return step.elements

    def watermarks(self, draining: bool) -> dict[str, int]:
        """Its outputs' watermarks (all at +inf when draining)."""
        ended = replace(self.position, exhausted=True) if draining else self.position
        return self.player.watermarks(ended)

    def finished(self, otherwise_finished: bool) -> bool:
        """A TestStream pipeline ends once played out, and with nothing left to do."""
        return (otherwise_finished and self.position.exhausted) or self.played_out


def jump_clock(position: Position, next_timer_micros: float | None) -> Position:
    """After the last event: move the clock to the next pending timer, if it is later."""
    if next_timer_micros is None or next_timer_micros <= position.clock_micros:
        return position
    return replace(position, clock_micros=int(next_timer_micros))


class _Encoder:
    """An element event's element (TestStream's coder) -> a windowed value in the readers'
    SDK coder. A ``WindowedValueHolder`` element keeps its own timestamp, windows and pane."""

    def __init__(self, element_coder, wire_coder) -> None:
        self.element_coder = element_coder
        self.wire = wire_coder.get_impl()

    def __call__(self, encoded: bytes, millis: int) -> bytes:
        value = self.element_coder.decode(encoded)
        if isinstance(value, WindowedValueHolder):
            windowed = value.windowed_value  # type: ignore[attr-defined]  # a beam.Row field
        else:
            ts = timestamp.Timestamp(micros=millis * 1000)
            windowed = windowed_value.WindowedValue(value, ts, (GlobalWindow(),))
        # Nested: a data channel's elements follow one another in one stream.
        return self.wire.encode_nested(windowed)


def player_for(plan: ExecutionPlan, stage_ids) -> TestStreamPlayer | None:
    """The TestStream read by the given stages (one pipeline), or None if none is."""
    ids = set(stage_ids)
    read = {b for s in plan.stages if s.id in ids for b in s.input_buffers}
    mine = [s for s in plan.test_streams if any(b in read for _, b in s.outputs)]
    if not mine:
        return None
    if len(mine) > 1:
        names = ", ".join(repr(s.transform) for s in mine)
        raise ValueError(
            f"One pipeline reads several TestStreams ({names}); Beam allows one per pipeline: "
            "use one TestStream with several output tags."
        )
    return TestStreamPlayer(plan, mine[0])

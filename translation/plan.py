"""The execution plan: plain, frozen, picklable data that says what to run.

Built by ``sparkbeam.translation.translate`` from a Beam pipeline proto; read by
``sparkbeam.runner`` to build Spark jobs. Holds protos only as serialized
bytes so that the plan prints, pickles and compares without Beam objects.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NewType

if TYPE_CHECKING:
    from sparkbeam.translation.test_stream import TestStreamSource
    from sparkbeam.translation.text_reads import TextRead

StageId = NewType("StageId", str)
"""Identifies one fused executable stage (a ProcessBundleDescriptor id)."""

BufferId = NewType("BufferId", str)
"""Identifies one edge between stages: Beam's ``kind:name`` buffer id."""

PipelineId = NewType("PipelineId", str)
"""Identifies one independent pipeline (a connected component of stages)."""

IMPULSE_BUFFER = BufferId("impulse")


class EdgeKind(enum.Enum):
    """How data moves along an edge between two stages."""

    IMPULSE = "impulse"  # the single empty-bytes element that starts a pipeline
    MATERIALIZE = "materialize"  # pass-through; several writers make a Flatten
    GROUP = "group"  # GroupByKey: shuffle by encoded key, then window/trigger
    RESHUFFLE = "reshuffle"  # repartition elements; the SDF fusion break
    TEST_STREAM = "teststream"  # one output of a TestStream: the runner plays its events
    TEXT = "text"  # the lines of a ReadFromText: the runner reads its files


@dataclass(frozen=True)
class Edge:
    """One buffer: written by some stages' outputs, read by others' inputs."""

    id: BufferId
    kind: EdgeKind
    pcollection: str
    # Coder ids (in ExecutionPlan.components) of the encoded windowed values. A TestStream
    # edge's write coder is its readers' SDK coder: the runner encodes its events with it.
    write_coder: str = ""
    read_coder: str = ""
    windowing_strategy: str = ""  # for GROUP edges: the windowing strategy id


@dataclass(frozen=True)
class SideInput:
    """A PCollection a stage reads through the state API as a side input."""

    transform: str
    tag: str
    buffer: BufferId
    access_pattern_urn: str
    coder: str  # safe windowed-value coder of the side-input buffer
    # The PCollection's windowing has a trigger of its own (not the default one): each
    # window's view is its latest firing (``runner.rounds.side_input_view``), not every pane.
    triggered: bool = False


@dataclass(frozen=True)
class TimerFamily:
    """A timer family a stage sets and receives (batch: fired in the same task)."""

    transform: str
    family: str
    time_domain: int
    coder: str


@dataclass(frozen=True)
class StagePlan:
    """One fused executable stage, run as a ``mapPartitions`` over its inputs."""

    id: StageId
    name: str
    pipeline: PipelineId
    descriptor: bytes  # serialized beam_fn_api_pb2.ProcessBundleDescriptor
    inputs: tuple[tuple[str, BufferId], ...]  # (data-input transform, buffer)
    outputs: tuple[tuple[str, BufferId], ...]  # (data-output transform, buffer)
    input_coders: tuple[tuple[str, str], ...] = ()  # (data-input transform, coder)
    side_inputs: tuple[SideInput, ...] = ()
    timers: tuple[TimerFamily, ...] = ()
    stateful: bool = False
    is_sdf_process: bool = False
    transforms: tuple[str, ...] = ()  # user-visible transform names, for errors

    @property
    def input_buffers(self) -> tuple[BufferId, ...]:
        return tuple(b for _, b in self.inputs)

    @property
    def output_buffers(self) -> tuple[BufferId, ...]:
        return tuple(b for _, b in self.outputs)


@dataclass(frozen=True)
class PipelinePlan:
    """An independent pipeline: stages that share no edge with any other."""

    id: PipelineId
    stages: tuple[StageId, ...]


@dataclass(frozen=True)
class ExecutionPlan:
    """Everything the runner needs: stages in topological order, edges, coders."""

    stages: tuple[StagePlan, ...]
    edges: tuple[Edge, ...]
    pipelines: tuple[PipelinePlan, ...]
    components: bytes  # serialized beam_runner_api_pb2.Components
    requirements: tuple[str, ...] = ()
    fingerprint: str = ""
    test_streams: tuple[TestStreamSource, ...] = ()
    text_reads: tuple[TextRead, ...] = ()
    _edge_index: dict = field(default_factory=dict, compare=False, repr=False)

    def edge(self, buffer: BufferId) -> Edge:
        if not self._edge_index:
            self._edge_index.update({e.id: e for e in self.edges})
        return self._edge_index[buffer]

    def text_read(self, buffer: BufferId) -> TextRead:
        return next(r for r in self.text_reads if r.buffer == buffer)

    def stage(self, stage_id: StageId) -> StagePlan:
        for s in self.stages:
            if s.id == stage_id:
                return s
        raise KeyError(stage_id)

    def consumers(self, buffer: BufferId) -> tuple[StagePlan, ...]:
        return tuple(
            s
            for s in self.stages
            if buffer in s.input_buffers or any(si.buffer == buffer for si in s.side_inputs)
        )

    def upstream(self, buffers) -> set[StageId]:
        """The stages whose output reaches any of ``buffers`` (directly or through others)."""
        writers: dict[BufferId, list[StagePlan]] = {}
        for s in self.stages:
            for b in s.output_buffers:
                writers.setdefault(b, []).append(s)
        found: set[StageId] = set()
        todo = list(buffers)
        while todo:
            for s in writers.get(todo.pop(), ()):
                if s.id not in found:
                    found.add(s.id)
                    todo.extend(s.input_buffers)
                    todo.extend(si.buffer for si in s.side_inputs)
        return found

    def describe(self) -> str:
        """A readable multi-line rendering, for ``sparkbeam plan``."""
        lines = [f"ExecutionPlan: {len(self.stages)} stages, {len(self.pipelines)} pipeline(s)"]
        for p in self.pipelines:
            lines.append(f"pipeline {p.id}:")
            for sid in p.stages:
                s = self.stage(sid)
                flags = [f for f, on in (("stateful", s.stateful), ("sdf", s.is_sdf_process)) if on]
                lines.append(f"  stage {s.id}{' [' + ', '.join(flags) + ']' if flags else ''}")
                lines += [f"      {name}" for name in s.transforms]
                lines += [f"    <- {b} ({self.edge(b).kind.value})" for _, b in s.inputs]
                for si in s.side_inputs:
                    lines.append(f"    <~ {si.buffer} (side input {si.tag!r} of {si.transform!r})")
                lines += [f"    -> {b} ({self.edge(b).kind.value})" for _, b in s.outputs]
                lines += [f"    timer {t.transform}/{t.family}" for t in s.timers]
        return "\n".join(lines)

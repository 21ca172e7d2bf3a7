"""One streaming round as one Spark job, with as few Python tasks as the plan allows.

``RoundBuilder`` turns a round's live stages into RDDs: the Impulse until its round committed,
an SDF stage as one task per subtask that feeds its due residuals and keeps the new ones
(``task.residual_state``), a GroupByKey or a stateful stage as a key-group shuffle into tasks
that load and stage their keys' state (``group``, ``stateful``). Each task's reports ride with
the data to one consumer (``rounds.carry``) until a stage that feeds nobody hands them to the
round's ``collect``: a chain of stages is one Python task per partition, and only a stage read
more than once (several consumers, or a side input) is persisted.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from apache_beam.runners.common import ENCODED_IMPULSE_VALUE

from sparkbeam.runner.rounds.carry import plan_carriers, select
from sparkbeam.runner.rounds.context import RunContext
from sparkbeam.runner.rounds.edges import keyed_by, reshuffled, tag_input
from sparkbeam.runner.rounds.task_body import TaskBody
from sparkbeam.runner.spark.labels import stage_label
from sparkbeam.runner.streaming import group as streaming_group
from sparkbeam.runner.streaming import watermarks
from sparkbeam.runner.streaming.group import GroupRound
from sparkbeam.runner.streaming.pushback import hold_rows, ready, take
from sparkbeam.runner.streaming.stateful import StatefulRound, keyed_rows, run_stateful
from sparkbeam.runner.task import grouping
from sparkbeam.runner.task.bundle_executor import StageTask
from sparkbeam.runner.task.records import is_report
from sparkbeam.runner.task.residual_state import ResidualRound, residual_limit
from sparkbeam.runner.task.staged_state import StateRound
from sparkbeam.translation.plan import BufferId, EdgeKind


@dataclass(frozen=True)
class RoundInputs:
    """What one round of one pipeline is built from: the loop's state when the round starts."""

    ctx: RunContext  # the run's data plane, plan, store url and settings
    pipeline: str
    stages: list  # the live stages of this round, in topological order
    tasks: dict[str, tuple[StageTask, Any]]  # stage -> its task and components broadcast
    parallelism: int  # of its keyed stages (at most its state's key groups)
    checkpoint_id: int | None
    round_no: int
    impulse_done: bool
    marks: watermarks.RoundWatermarks
    due: dict  # stage -> its ``feed.Due`` (None: nothing due)
    clock_ms: float  # the feed's clock: SDF tasks feed the residuals due by then
    previous: dict[str, int]  # GroupByKey -> input watermark of the last round
    side_values: dict  # side input buffer -> what tasks load (``side_input_store``)
    pushed_back: set[str]  # stages with main input held in the store
    state: Any  # the PipelineStore: a round that takes pushed-back rows drops their handles
    startpoints: Any  # the StartpointSession, or None
    fed: dict[str, list[bytes]]  # TestStream buffer -> the elements its event feeds this round
    clock_micros: int | None  # a TestStream's virtual processing time; None: the wall clock


def live_stages(
    plan, stages, due: dict, impulse_done: bool, group_keys: dict, stateful: dict, pushed_back,
    fed=(),
) -> set[str]:  # fmt: skip
    """Stages that may see data this round: downstream of the Impulse (first round), of the
    TestStream buffers ``fed``, of due residuals, or of a GroupByKey that holds state."""
    live: set[str] = set()
    producers_live: set[str] = set()  # buffers a live stage writes
    for stage in stages:
        for buffer in stage.input_buffers + tuple(si.buffer for si in stage.side_inputs):
            kind = plan.edge(buffer).kind
            if (
                (kind == EdgeKind.IMPULSE and not impulse_done)
                or buffer in fed
                or buffer in producers_live
                or (kind == EdgeKind.GROUP and group_keys.get(buffer))
            ):
                live.add(stage.id)
        if due.get(stage.id) or stateful.get(stage.id, {}).get("timers") or stage.id in pushed_back:
            live.add(stage.id)
        if stage.id in live:
            producers_live.update(stage.output_buffers)
    return live


class RoundBuilder:
    """Builds one round of one pipeline; ``build()`` returns the dataset of all its reports."""

    def __init__(self, inputs: RoundInputs) -> None:
        self.inp, self.ctx, self.plan = inputs, inputs.ctx, inputs.ctx.plan
        self.plane, self.marks, self.due = inputs.ctx.plane, inputs.marks, inputs.due
        self.par, self.stages = inputs.parallelism, inputs.stages
        self.persisted: list = []
        self.broadcasts: list = []
        self.side_inputs_read: set[BufferId] = set()
        self.held: set[str] = set()  # stages whose main input waits for their side inputs
        self._outs: dict[str, Any] = {}  # stage -> its output RDD
        self._groups: dict[BufferId, Any] = {}
        self._readers: dict[BufferId, list[tuple[str, str]]] = {}  # -> (consumer, transform)
        for stage in self.stages:
            for transform, buffer in stage.inputs:
                self._readers.setdefault(buffer, []).append((stage.id, transform))
        side = {si.buffer for s in self.stages for si in s.side_inputs}
        self._cache_all = bool(side)  # a side input is read by its own job: keep everything
        self.carriers = plan_carriers(self.stages, lambda *_: True, lambda b: int(b in side))
        self.partitioner = grouping.partitioner(self.par, inputs.state.max_key_groups)

    # --- the round -----------------------------------------------------------------

    def build(self, side_inputs) -> object:
        """Every live stage's RDD; the union of the reports nothing carries further."""
        finals = []
        for stage in self.stages:
            side_bc = self.plane.broadcast(side_inputs(stage, self))
            self.broadcasts.append(side_bc)
            with self.plane.call_site(f"round {self.inp.round_no}: {stage_label(stage)}"):
                out = self._stage(stage, side_bc)  # its Spark stages are named after it
            if self._cache_all or self.carriers.cache(stage.id):
                out = self.plane.persist(out, f"{stage.id} (round {self.inp.round_no})")
                self.persisted.append(out)
            self._outs[stage.id] = out
            if stage.id not in self.carriers.carrier:
                finals.append(out.filter(is_report))
        for buffer, grouped in self._groups.items():
            if not self._readers.get(buffer):  # read as a side input only
                finals.append(grouped.filter(is_report))
        return self.plane.union(finals)

    def _stage(self, stage, side_bc):
        inp = self.inp
        task, components = inp.tasks[stage.id]
        if stage.stateful:
            spec = StatefulRound(
                **self._state_fields(),
                input_watermark=self.marks.stage_input[stage.id],
                clock_micros=inp.clock_micros,
            )
            body = TaskBody(task, components, side_bc, inp.round_no)
            run = functools.partial(run_stateful, body, spec)
            return self._keyed_input(stage).mapPartitionsWithIndex(run)
        inputs = [
            source.map(functools.partial(tag_input, transform))
            for transform, buffer in stage.inputs
            if (source := self.source(buffer, stage.id, transform)) is not None
        ]
        due = self.due.get(stage.id)
        rows = list(due.rows) if due else []  # the driver's (its tasks keep them: none)
        if rows:
            inputs.append(self.plane.parallelize(rows, min(self.par, len(rows))))
        held = stage.side_inputs and not ready(stage, inp.side_values, self.marks)
        if not held and stage.id in inp.pushed_back:  # its side inputs are ready now
            inputs.append(take(self.plane, inp.state, self.state_round(), stage.id))
        assignment = inp.startpoints and inp.startpoints.assignment(stage.id)
        if not held and not (stage.is_sdf_process and self.ctx.durable):
            body = TaskBody(task, components, side_bc, inp.round_no, assignment)
            return self.plane.union(inputs).mapPartitions(body)
        subtasks = self.plane.as_subtasks(self.plane.union(inputs) if inputs else None, self.par)
        if held:  # side inputs not ready: keep the main input for a later round
            self.held.add(stage.id)  # (its tasks keep their due residuals meanwhile)
            hold = functools.partial(hold_rows, self.state_round(), stage.id)
            return subtasks.mapPartitionsWithIndex(hold)
        spec = ResidualRound(
            **self._state_fields(),
            clock_ms=due.clock_ms if due else inp.clock_ms,
            limit=residual_limit(self.par),
        )
        body = TaskBody(task, components, side_bc, inp.round_no, assignment, residuals=spec)
        return subtasks.mapPartitionsWithIndex(body.by_subtask)

    def _state_fields(self) -> dict:
        """What every task of this round needs to read and stage its task-owned state."""
        inp = self.inp
        return self.ctx.state_fields(
            inp.pipeline, inp.state, inp.checkpoint_id, inp.round_no, self.par
        )

    def state_round(self) -> StateRound:
        return StateRound(**self._state_fields())

    # --- edges -----------------------------------------------------------------------

    def source(self, buffer: BufferId, consumer: str | None, transform: str | None = None):
        """What ``consumer``'s input ``transform`` reads from ``buffer``: data chunks and the
        reports it carries (``consumer=None``: a side input, data only); None when nothing can
        be read this round, so no empty dataset costs the driver Spark calls."""
        edge = self.plan.edge(buffer)
        if edge.kind == EdgeKind.IMPULSE:
            if self.inp.impulse_done:
                return None
            return self.plane.parallelize([ENCODED_IMPULSE_VALUE], 1)
        if edge.kind == EdgeKind.TEST_STREAM:
            rows = self.inp.fed.get(buffer)
            return self.plane.parallelize(rows, 1) if rows else None
        if edge.kind == EdgeKind.GROUP:
            grouped = self._group(edge)
            first = self._readers.get(buffer, [None])[0]  # its reports go to the first reader
            carry = consumer is not None and first == (consumer, transform)
            return grouped.mapPartitions(functools.partial(select, buffer, carry))
        carries = self.carriers.carries
        writers = self._written(buffer, lambda s: carries(s, buffer, consumer, transform))
        if not writers:
            return None
        source = self.plane.union(writers)
        if edge.kind == EdgeKind.MATERIALIZE:
            return source
        if edge.kind == EdgeKind.RESHUFFLE:
            return reshuffled(source, edge, self.ctx.components, self.ctx.plan_key, self.par)
        raise NotImplementedError(f"edge kind {edge.kind} in streaming")

    def _group(self, edge):
        """The GroupByKey of one round, shuffled by key group (one RDD per edge)."""
        if edge.id in self._groups:
            return self._groups[edge.id]
        inp = self.inp
        task = GroupRound(
            **self._state_fields(),
            plan_key=self.ctx.plan_key,
            edge=edge,
            input_watermark=self.marks.group_input.get(edge.id, watermarks.MAX),
            previous_watermark=inp.previous.get(edge.id, watermarks.MIN),
            clock_micros=inp.clock_micros,
        )
        writers = self._written(edge.id, lambda s: self.carriers.into(s) == edge.id)
        comps = self.ctx.components
        grouped = keyed_by(
            self.plane.union(writers),
            comps,
            self.ctx.plan_key,
            edge.write_coder,
            self.par,
            self.partitioner,
        ).mapPartitionsWithIndex(
            lambda i, pairs: streaming_group.group_round(task, comps.value, i, pairs)
        )
        if len(self._readers.get(edge.id, [])) > 1 or self._cache_all:
            grouped = self.plane.persist(grouped, f"{edge.id} (round {inp.round_no})")
            self.persisted.append(grouped)
        self._groups[edge.id] = grouped
        return grouped

    def _written(self, buffer: BufferId, carries) -> list:
        """What the round's stages that write ``buffer`` wrote to it, each with its reports
        when ``carries(stage id)``."""
        return [
            self._outs[s.id].mapPartitions(functools.partial(select, buffer, carries(s.id)))
            for s in self.stages
            if buffer in s.output_buffers and s.id in self._outs
        ]

    def _keyed_input(self, stage):
        """A stateful stage's inputs, keyed and shuffled together so partition ``p`` holds
        subtask ``p``'s keys."""
        key, comps = self.ctx.plan_key, self.ctx.components
        keyed = [
            source.mapPartitionsWithIndex(
                functools.partial(keyed_rows, comps, key, stage, transform)
            )
            for transform, buffer in stage.inputs
            if self.plan.edge(buffer).kind != EdgeKind.IMPULSE
            and (source := self.source(buffer, stage.id, transform)) is not None
        ]
        return self.plane.union(keyed).partitionBy(self.par, self.partitioner)

    def cleanup(self) -> None:
        for rdd in self.persisted:
            rdd.unpersist(blocking=False)
        for bc in self.broadcasts:
            self.plane.release(bc)

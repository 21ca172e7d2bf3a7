"""One streaming round as one Spark job, with as few Python tasks as the plan allows.

``RoundBuilder`` turns the live stages of a round into RDDs: the Impulse only
until its round committed, due residuals into their SDF stage, every
GroupByKey a key-group-partitioned shuffle into ``streaming_group.group_round``
over the previous checkpoint's state, every stateful stage a key-group
shuffle into a task that loads and stages its keys' state.

Each task's reports (commit messages, residuals, metrics, ...) are *carried*
downstream with the data to one consumer — through narrow stages and through
shuffles alike — until a stage that feeds nobody hands them to the round's
final ``collect``. So a stage read once needs no cache and no second Python
pass to extract its reports: a chain of stages is one Python task per
partition. A stage read more than once (several consumers, or a side input)
is persisted and carries its reports on exactly one path.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import Any

from apache_beam.runners.common import ENCODED_IMPULSE_VALUE
from pyspark import StorageLevel
from sparkbeam.runner.rounds import sink_files
from sparkbeam.runner.rounds.edges import _keyed, _reencode, _spread
from sparkbeam.runner.rounds.startpoints import with_startpoints
from sparkbeam.runner.streaming import group as streaming_group
from sparkbeam.runner.streaming import watermarks
from sparkbeam.runner.streaming.group import GroupRound
from sparkbeam.runner.streaming.pushback import hold_rows, ready, take
from sparkbeam.runner.streaming.stateful import KeyedState, StatefulRound, sdk_keyed
from sparkbeam.runner.task import grouping
from sparkbeam.runner.task.bundle_executor import StageTask, run_stage_partition
from sparkbeam.runner.task.records import OutputRecord, ReportKey, is_report
from sparkbeam.runner.task.worker_context import register_plan
from sparkbeam.translation.plan import BufferId, EdgeKind


class RoundBuilder:
    """Builds one round of one pipeline; ``build()`` returns the RDD of all its reports."""

    def __init__(self, loop, marks: watermarks.RoundWatermarks, due: dict, live: set) -> None:
        self.loop, self.ex, self.plan = loop, loop.ex, loop.plan
        self.sc, self.marks, self.due = loop.ex.sc, marks, due
        self.par = loop.ex.parallelism
        self.stages = [s for s in loop.stages if s.id in live]
        self.persisted: list = []
        self.broadcasts: list = []
        self.side_inputs_read: set[BufferId] = set()
        self.held: set[str] = set()  # stages whose main input waits for their side inputs
        self._outs: dict[str, Any] = {}  # stage -> its output RDD
        self._groups: dict[BufferId, Any] = {}
        self._carrier: dict[str, tuple] = {}  # producer -> (buffer, consumer) carrying reports
        readers: dict[BufferId, list[str]] = {}
        for stage in self.stages:
            for buffer in stage.input_buffers:
                readers.setdefault(buffer, []).append(stage.id)
        self._readers = readers
        side = {si.buffer for s in self.stages for si in s.side_inputs}
        self._cache_all = bool(side)  # a side input is read by its own job: keep everything
        self._reads: dict[str, int] = {}
        for stage in self.stages:
            targets = [
                (b, c) for b in dict.fromkeys(stage.output_buffers) for c in readers.get(b, ())
            ]
            self._reads[stage.id] = len(targets) + sum(b in side for b in stage.output_buffers)
            if targets:
                self._carrier[stage.id] = targets[0]

    # --- the round -----------------------------------------------------------------

    def build(self, side_inputs) -> object:
        """Every live stage's RDD; the union of the reports nothing carries further."""
        finals = []
        for stage in self.stages:
            side_bc = self.sc.broadcast(side_inputs(stage, self))
            self.broadcasts.append(side_bc)
            out = self._stage(stage, side_bc)
            if self._cache_all or self._reads[stage.id] > 1:
                out = out.persist(StorageLevel.MEMORY_AND_DISK)
                self.persisted.append(out)
            self._outs[stage.id] = out
            if stage.id not in self._carrier:
                finals.append(out.filter(is_report))
        for buffer, grouped in self._groups.items():
            if not self._readers.get(buffer):  # read as a side input only
                finals.append(grouped.filter(is_report))
        if not finals:
            return self.sc.emptyRDD()
        return finals[0] if len(finals) == 1 else self.sc.union(finals)

    def _stage(self, stage, side_bc):
        loop = self.loop
        task, components = loop.stage_task(stage)
        if stage.stateful:
            spec = StatefulRound(
                pipeline=loop.pipeline.id,
                url=self.ex.url,
                checkpoint_id=loop.checkpoint_id,
                round_no=loop.round_no,
                parallelism=self.par,
                max_key_groups=loop.state.max_key_groups,
                input_watermark=self.marks.stage_input[stage.id],
            )
            run = functools.partial(run_stateful, task, spec, components, side_bc)
            return self._keyed_input(stage, spec).mapPartitionsWithIndex(run)
        inputs = [
            self.read(buffer, stage.id).map(functools.partial(_tag, transform))
            for transform, buffer in stage.inputs
        ]
        rows = [(d.transform, d.element) for d in self.due.get(stage.id, ())]
        held = stage.side_inputs and not ready(stage, loop.side_values, self.marks)
        if not held and stage.id in loop.pushed_back:
            rows += take(loop.state, stage.id)  # its side inputs are ready now
        if rows:
            inputs.append(self.sc.parallelize(rows, max(1, min(self.par, len(rows)))))
        if held:  # side inputs not ready: keep the main input for a later round
            self.held.add(stage.id)
            url, pipeline, kgs = self.ex.url, loop.pipeline.id, loop.state.max_key_groups
            hold = functools.partial(hold_rows, url, pipeline, stage.id, loop.round_no, kgs)
            return self._union(inputs).mapPartitions(hold)
        assignment = loop.startpoints and loop.startpoints.assignment(stage.id)
        run = functools.partial(
            run_stage, task, loop.round_no, components, side_bc, assignment=assignment
        )
        return self._union(inputs).mapPartitions(run)

    # --- edges -----------------------------------------------------------------------

    def read(self, buffer: BufferId, consumer: str | None):
        """What ``consumer`` reads from ``buffer``: data chunks, plus the reports it carries.

        ``consumer=None``: a side input (data only)."""
        edge = self.plan.edge(buffer)
        if edge.kind == EdgeKind.IMPULSE:
            if self.loop.impulse_done:
                return self.sc.emptyRDD()
            return self.sc.parallelize([ENCODED_IMPULSE_VALUE], 1)
        if edge.kind == EdgeKind.GROUP:
            grouped = self._group(edge)
            return grouped.mapPartitions(
                functools.partial(_select, buffer, self._carries_group(buffer, consumer))
            )
        writers = [
            self._outs[s.id].mapPartitions(
                functools.partial(_select, buffer, self._carrier.get(s.id) == (buffer, consumer))
            )
            for s in self.stages
            if buffer in s.output_buffers and s.id in self._outs
        ]
        source = self._union(writers)
        if edge.kind == EdgeKind.MATERIALIZE or not writers:
            return source
        if edge.kind == EdgeKind.RESHUFFLE:
            key, comps = self.ex.plan_key, self.ex.components
            read_coder = edge.read_coder or edge.write_coder
            return (
                source.mapPartitionsWithIndex(
                    lambda i, items: _carrying_pairs(
                        items,
                        i,
                        lambda blobs: _spread(comps.value, key, edge.write_coder, i, blobs),
                    )
                )
                .partitionBy(self.par)
                .values()
                .mapPartitions(lambda items: _carrying(items, grouping.chunk))
                .mapPartitions(
                    lambda items: _carrying(
                        items,
                        lambda blobs: _reencode(
                            comps.value, key, edge.write_coder, read_coder, blobs
                        ),
                    )
                )
            )
        raise NotImplementedError(f"edge kind {edge.kind} in streaming")

    def _carries_group(self, buffer: BufferId, consumer: str | None) -> bool:
        readers = self._readers.get(buffer, [])
        return consumer is not None and bool(readers) and readers[0] == consumer

    def _group(self, edge):
        """The GroupByKey of one round, shuffled by key group (one RDD per edge)."""
        if edge.id in self._groups:
            return self._groups[edge.id]
        loop, par = self.loop, self.par
        max_kg = loop.state.max_key_groups
        task = GroupRound(
            plan_key=self.ex.plan_key,
            edge=edge,
            pipeline=loop.pipeline.id,
            url=self.ex.url,
            checkpoint_id=loop.checkpoint_id,
            round_no=loop.round_no,
            parallelism=par,
            max_key_groups=max_kg,
            input_watermark=self.marks.group_input.get(edge.id, watermarks.MAX),
            previous_watermark=loop.previous.get(edge.id, watermarks.MIN),
        )
        writers = [
            self._outs[s.id].mapPartitions(
                functools.partial(_select, edge.id, self._carrier.get(s.id, (None,))[0] == edge.id)
            )
            for s in self.stages
            if edge.id in s.output_buffers and s.id in self._outs
        ]
        key, comps = self.ex.plan_key, self.ex.components
        partitioner = functools.partial(
            grouping.partition_for_key, parallelism=par, max_key_groups=max_kg
        )
        grouped = (
            self._union(writers)
            .mapPartitionsWithIndex(
                lambda i, items: _carrying_pairs(
                    items,
                    ReportKey(i),
                    lambda blobs: _keyed(comps.value, key, edge.write_coder, blobs),
                )
            )
            .partitionBy(par, partitioner)
            .mapPartitionsWithIndex(
                lambda i, pairs: streaming_group.group_round(task, comps.value, i, pairs)
            )
        )
        if len(self._readers.get(edge.id, [])) > 1 or self._cache_all:
            grouped = grouped.persist(StorageLevel.MEMORY_AND_DISK)
            self.persisted.append(grouped)
        self._groups[edge.id] = grouped
        return grouped

    def _keyed_input(self, stage, spec: StatefulRound):
        """A stateful stage's input, partitioned so partition ``p`` holds subtask ``p``'s keys.

        All inputs are keyed first and shuffled together: partition index = subtask."""
        key, comps = self.ex.plan_key, self.ex.components
        keyed = [
            self.read(buffer, stage.id).mapPartitionsWithIndex(
                functools.partial(_keyed_rows, comps, key, stage, transform)
            )
            for transform, buffer in stage.inputs
            if self.plan.edge(buffer).kind != EdgeKind.IMPULSE
        ]
        partitioner = functools.partial(
            grouping.partition_for_key,
            parallelism=spec.parallelism,
            max_key_groups=spec.max_key_groups,
        )
        return self._union(keyed).partitionBy(spec.parallelism, partitioner)

    def _union(self, rdds: list):
        if not rdds:
            return self.sc.emptyRDD()
        return rdds[0] if len(rdds) == 1 else self.sc.union(rdds)

    def cleanup(self) -> None:
        for rdd in self.persisted:
            rdd.unpersist(blocking=False)
        for bc in self.broadcasts:
            bc.unpersist(blocking=False)


# --- task side: small, picklable by reference ------------------------------------------


def _tag(transform: str, item):
    return (transform, item) if isinstance(item, bytes) else item


def _select(buffer: str, carry: bool, records: Iterable) -> Iterator:
    """A buffer's data chunks from a stage's records, plus its reports if this path carries."""
    for record in records:
        if isinstance(record, OutputRecord):
            if record.buffer == buffer:
                yield record.data
        elif carry:
            yield record


def _carrying(items: Iterable, fn) -> Iterator:
    """``fn`` over the data chunks of ``items``; carried reports pass through after."""
    reports: list = []

    def data():
        for item in items:
            if is_report(item):
                reports.append(item)
            else:
                yield item

    yield from fn(data())
    yield from reports


def _carrying_pairs(items: Iterable, report_key, fn) -> Iterator:
    """Like ``_carrying`` for a shuffle: reports travel as ``(report_key, report)`` pairs."""
    for out in _carrying(items, fn):
        yield (report_key, out) if is_report(out) else out


def _keyed_rows(components, plan_key: str, stage, transform: str, index: int, items):
    """(SDK state key, (transform, element)) per element; carried reports pass as pairs."""
    register_plan(plan_key, components.value)

    def keyed(blobs):
        for key, element in sdk_keyed(plan_key, stage, transform, blobs):
            yield key, (transform, element)

    return _carrying_pairs(items, ReportKey(index), keyed)


def _split_carried(rows: Iterable, carried: list) -> Iterator:
    for row in rows:
        if is_report(row):
            carried.append(row)
        else:
            yield row


def run_stateful(task: StageTask, spec: StatefulRound, components, side_bc, index: int, pairs):
    carried: list = []
    keyed = KeyedState(spec, task.plan_key, task.stage, index)
    rows = _split_carried((row for _, row in pairs), carried)
    records = run_stage_partition(task, components.value, side_bc.value, rows, keyed_state=keyed)
    yield from sink_files.collect_sink_files(records, task.stage.id, spec.round_no)
    yield from carried


def run_stage(task: StageTask, round_no: int, components, side_bc, rows, assignment=None):
    carried: list = []
    records = with_startpoints(
        task.stage, components.value, assignment, _split_carried(rows, carried),
        lambda rows: run_stage_partition(task, components.value, side_bc.value, rows),
    )  # fmt: skip
    yield from sink_files.collect_sink_files(records, task.stage.id, round_no)
    yield from carried

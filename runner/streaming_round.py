"""One streaming round's Spark operations: edges over stored state, and task bodies.

``RoundEdges`` builds what each buffer carries in one round of one pipeline:
the Impulse only until its round committed, nothing (no tasks) for an edge no
live stage wrote to, and a GroupByKey as a key-group-partitioned shuffle into
``streaming_group.group_round`` over the state of the previous checkpoint. The
functions below it are the bodies of the round's Spark tasks.
"""

from __future__ import annotations

import functools

from pyspark import StorageLevel
from sparkbeam.runner import sink_files, streaming_group, watermarks
from sparkbeam.runner.bundle_executor import StageTask, run_stage_partition
from sparkbeam.runner.edges import EdgeBuilder, _keyed
from sparkbeam.runner.executor import _data, _is_output
from sparkbeam.runner.records import (
    OutputRecord,
)
from sparkbeam.runner.startpoint_rounds import (
    with_startpoints,
)
from sparkbeam.runner.streaming_group import GroupRound, partition_for_key
from sparkbeam.runner.streaming_stateful import (
    KeyedState,
    StatefulRound,
    sdk_keyed,
)
from sparkbeam.runner.worker_context import register_plan
from sparkbeam.translation.plan import BufferId, EdgeKind


class RoundEdges(EdgeBuilder):
    """The edges of one round: Impulse only in the first, GroupByKey over stored state."""

    def __init__(self, loop, marks: watermarks.RoundWatermarks) -> None:
        ex = loop.ex
        super().__init__(ex.sc, ex.plan, ex.plan_key, ex.components, ex.parallelism)
        self.loop = loop
        self.marks = marks
        self.group_reports: list = []
        self.persisted: list = []
        self._groups: dict[BufferId, object] = {}

    def union(self, rdds: list):
        if not rdds:
            return self.sc.emptyRDD()
        return rdds[0] if len(rdds) == 1 else self.sc.union(rdds)

    def keyed_input(self, stage, spec: StatefulRound):
        """A stateful stage's input, partitioned so partition ``p`` holds subtask ``p``'s keys.

        All inputs are keyed first and shuffled together: partition index = subtask."""
        key, comps = self.plan_key, self.components
        keyed = [
            self.read(buffer).mapPartitions(
                functools.partial(_keyed_rows, comps, key, stage, transform)
            )
            for transform, buffer in stage.inputs
            if self.plan.edge(buffer).kind != EdgeKind.IMPULSE
        ]
        partitioner = functools.partial(
            partition_for_key, parallelism=spec.parallelism, max_key_groups=spec.max_key_groups
        )
        return self.union(keyed).partitionBy(spec.parallelism, partitioner)

    def read(self, buffer: BufferId):
        edge = self.plan.edge(buffer)
        if edge.kind == EdgeKind.IMPULSE:
            if self.loop.impulse_done:
                return self.sc.emptyRDD()
            return super().read(buffer)
        if edge.kind != EdgeKind.GROUP:
            if not self.writers.get(buffer):
                return self.sc.emptyRDD()  # no tasks for an edge nothing wrote to
            return super().read(buffer)
        if buffer not in self._groups:
            self._groups[buffer] = self._group(edge)
        return self._groups[buffer]

    def _group(self, edge):
        loop, par = self.loop, self.parallelism
        max_kg = loop.state.max_key_groups
        current = self.marks.group_input.get(edge.id, watermarks.MAX)
        task = GroupRound(
            plan_key=self.plan_key,
            edge=edge,
            pipeline=loop.pipeline.id,
            url=loop.ex.url,
            checkpoint_id=loop.checkpoint_id,
            round_no=loop.round_no,
            parallelism=par,
            max_key_groups=max_kg,
            input_watermark=current,
            previous_watermark=loop.previous.get(edge.id, watermarks.MIN),
        )
        writers = self.writers.get(edge.id, [])
        key, comps = self.plan_key, self.components
        grouped = (
            self.union(writers)
            .mapPartitions(lambda blobs: _keyed(comps.value, key, edge.write_coder, blobs))
            .partitionBy(
                par, functools.partial(partition_for_key, parallelism=par, max_key_groups=max_kg)
            )
            .mapPartitionsWithIndex(
                lambda i, pairs: streaming_group.group_round(task, comps.value, i, pairs)
            )
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        self.persisted.append(grouped)
        self.group_reports.append(grouped.filter(is_report))
        return grouped.filter(functools.partial(_is_output, edge.id)).map(_data)


def _keyed_rows(components, plan_key: str, stage, transform: str, blobs):
    register_plan(plan_key, components.value)
    for key, element in sdk_keyed(plan_key, stage, transform, blobs):
        yield key, (transform, element)


def run_stateful(task: StageTask, spec: StatefulRound, components, side_bc, index: int, pairs):
    keyed = KeyedState(spec, task.plan_key, task.stage, index)
    rows = (row for _, row in pairs)
    records = run_stage_partition(task, components.value, side_bc.value, rows, keyed_state=keyed)
    return sink_files.collect_sink_files(records, task.stage.id, spec.round_no)


def run_stage(task: StageTask, round_no: int, components, side_bc, rows, assignment=None):
    records = with_startpoints(
        task.stage, components.value, assignment, rows,
        lambda rows: run_stage_partition(task, components.value, side_bc.value, rows),
    )  # fmt: skip
    return sink_files.collect_sink_files(records, task.stage.id, round_no)


def is_report(record) -> bool:
    return not isinstance(record, (OutputRecord, bytes))

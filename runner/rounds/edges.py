"""Edges between stages as Spark operations: what each buffer kind becomes.

Impulse is a one-element dataset, a materialized buffer is the union of its
writers (a Flatten when there are several), GroupByKey is a ``partitionBy``
on the key group of the encoded key (``grouping.partition_for_key``) followed by Beam's grouping,
Reshuffle a repartition, and a stateful stage's input a ``partitionBy`` on its
key. The functions at the bottom run on executors; they receive the plan's
components as bytes (a broadcast), never driver objects.
"""

from __future__ import annotations

import functools
from collections import defaultdict

from apache_beam.runners.common import ENCODED_IMPULSE_VALUE

from sparkbeam.runner.spark.labels import shuffle_label, stage_label
from sparkbeam.runner.task import grouping
from sparkbeam.runner.task.worker_context import register_plan
from sparkbeam.translation.plan import BufferId, EdgeKind, ExecutionPlan, StagePlan


class EdgeBuilder:
    """Builds the dataset (an RDD or ``Frames``, ``runner.plane``) flowing along each buffer."""

    def __init__(
        self,
        plane,
        plan: ExecutionPlan,
        plan_key: str,
        components,
        parallelism: int,
        max_key_groups: int,
    ):
        self.plane = plane
        self.plan = plan
        self.plan_key = plan_key
        self.components = components  # a broadcast of the serialized Components
        self.parallelism = parallelism
        # Who owns a key: its key group's subtask, the function state restores use too.
        self.partition = functools.partial(
            grouping.partition_for_key, parallelism=parallelism, max_key_groups=max_key_groups
        )
        self.writers: dict[BufferId, list] = defaultdict(list)  # buffer -> writer RDDs

    def add_writer(self, buffer: BufferId, rdd) -> None:
        self.writers[buffer].append(rdd)

    def stage_input(self, stage: StagePlan):
        """The union of a stage's inputs, tagged with their data-input transform."""
        inputs = [
            self._input(stage, transform, buffer).map(functools.partial(_tag, transform))
            for transform, buffer in stage.inputs
        ]
        return self.plane.union(inputs)

    def _input(self, stage: StagePlan, transform: str, buffer: BufferId):
        rdd = self.read(buffer)
        if stage.stateful and self.plan.edge(buffer).kind != EdgeKind.IMPULSE:
            # All elements of a key meet in one partition: its user state and timers.
            coder = dict(stage.input_coders)[transform]
            with self.plane.call_site(f"keyed input of {stage_label(stage)}"):
                rdd = self._keyed_by(rdd, coder)
        return rdd

    def _keyed_by(self, rdd, coder: str):
        key, comps = self.plan_key, self.components
        return (
            rdd.mapPartitions(lambda blobs: _keyed(comps.value, key, coder, blobs))
            .partitionBy(self.parallelism, self.partition)
            .values()
            .mapPartitions(grouping.chunk)
        )

    def read(self, buffer: BufferId):
        edge = self.plan.edge(buffer)
        if edge.kind == EdgeKind.IMPULSE:
            return self.plane.parallelize([ENCODED_IMPULSE_VALUE], 1)
        source = self.plane.union(self.writers.get(buffer, []))
        if edge.kind == EdgeKind.MATERIALIZE:
            return source
        if edge.kind in (EdgeKind.GROUP, EdgeKind.RESHUFFLE):
            with self.plane.call_site(shuffle_label(self.plan, buffer)):
                return self._shuffle(edge, source)
        raise NotImplementedError(f"edge kind {edge.kind}")

    def _shuffle(self, edge, source):
        key, comps = self.plan_key, self.components
        if edge.kind == EdgeKind.GROUP:
            return (
                source.mapPartitions(
                    lambda blobs: _keyed(comps.value, key, edge.write_coder, blobs)
                )
                .partitionBy(self.parallelism, self.partition)
                .mapPartitions(lambda pairs: _grouped(comps.value, key, edge, pairs))
            )
        if edge.kind == EdgeKind.RESHUFFLE:
            read_coder = edge.read_coder or edge.write_coder
            return (
                source.mapPartitionsWithIndex(
                    lambda i, blobs: _spread(comps.value, key, edge.write_coder, i, blobs)
                )
                .partitionBy(self.parallelism)
                .values()
                .mapPartitions(grouping.chunk)
                .mapPartitions(
                    lambda blobs: _reencode(comps.value, key, edge.write_coder, read_coder, blobs)
                )
            )
        raise NotImplementedError(f"edge kind {edge.kind}")


def _tag(transform: str, data: bytes) -> tuple[str, bytes]:
    return transform, data


def _keyed(components: bytes, plan_key: str, coder: str, blobs):
    register_plan(plan_key, components)
    return grouping.keyed_elements(blobs, plan_key, coder)


def _grouped(components: bytes, plan_key: str, edge, pairs):
    register_plan(plan_key, components)
    return grouping.group_partition(pairs, plan_key, edge)


def _spread(components: bytes, plan_key: str, coder: str, index: int, blobs):
    register_plan(plan_key, components)
    return grouping.reshuffle_elements(index, blobs, plan_key, coder)


def _reencode(components: bytes, plan_key: str, src: str, dst: str, blobs):
    register_plan(plan_key, components)
    return grouping.reencode(blobs, plan_key, src, dst)

"""Edges between stages as Spark operations: what each buffer kind becomes.

Impulse is a one-element dataset, a ``ReadFromText`` a partition per range of its files
(``text_ranges``), a materialized buffer the union of its writers, GroupByKey and a stateful
stage's input a ``partitionBy`` on the key's key group (``grouping.partition_for_key``),
Reshuffle a repartition. Reports ride along to each writer's carrier (``carry``), through a
shuffle as ``ReportKey`` pairs. The functions at the bottom run on executors and get the
plan's components as a broadcast, never driver objects.
"""

from __future__ import annotations

import functools
import itertools
from collections import defaultdict

from apache_beam.runners.common import ENCODED_IMPULSE_VALUE

from sparkbeam.runner.rounds.carry import Carriers, carrying, carrying_pairs, select
from sparkbeam.runner.rounds.text_ranges import text_partitions
from sparkbeam.runner.spark.labels import shuffle_label, stage_label
from sparkbeam.runner.task import grouping, text_lines
from sparkbeam.runner.task.records import ReportKey, is_report_key
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
        self.partition = grouping.partitioner(parallelism, max_key_groups)
        self.writers: dict[BufferId, list] = defaultdict(list)  # buffer -> (stage, records)
        self.carriers = Carriers({}, {})  # nobody carries until the executor plans it

    def add_writer(self, buffer: BufferId, stage: str, records) -> None:
        """``stage``'s records (its data for every buffer, and its reports) write ``buffer``."""
        self.writers[buffer].append((stage, records))

    def stage_input(self, stage: StagePlan):
        """The union of a stage's inputs, tagged with their data-input transform."""
        inputs = [
            self._input(stage, transform, buffer).map(functools.partial(tag_input, transform))
            for transform, buffer in stage.inputs
        ]
        return self.plane.union(inputs)

    def _input(self, stage: StagePlan, transform: str, buffer: BufferId):
        rdd = self.read(buffer, stage.id, transform)
        if stage.stateful and self.plan.edge(buffer).kind != EdgeKind.IMPULSE:
            # All elements of a key meet in one partition: its user state and timers.
            coder = dict(stage.input_coders)[transform]
            with self.plane.call_site(f"keyed input of {stage_label(stage)}"):
                keyed = self._keyed_by(rdd, coder).values()
                rdd = keyed.mapPartitions(lambda items: carrying(items, grouping.chunk))
        return rdd

    def _keyed_by(self, rdd, coder: str):
        comps, key = self.components, self.plan_key
        return keyed_by(rdd, comps, key, coder, self.parallelism, self.partition)

    def read(self, buffer: BufferId, consumer: str | None = None, transform: str | None = None):
        """What ``consumer``'s input ``transform`` reads from ``buffer``: the data, plus the
        reports of the writers it carries (``consumer`` None: a side input, data only)."""
        edge = self.plan.edge(buffer)
        if edge.kind == EdgeKind.IMPULSE:
            return self.plane.parallelize([ENCODED_IMPULSE_VALUE], 1)
        if edge.kind == EdgeKind.TEXT:
            return self._text(edge)
        carries = self.carriers.carries
        source = self.plane.union(
            [
                records.mapPartitions(
                    functools.partial(select, buffer, carries(stage, buffer, consumer, transform))
                )
                for stage, records in self.writers.get(buffer, [])
            ]
        )
        if edge.kind == EdgeKind.MATERIALIZE:
            return source
        if edge.kind in (EdgeKind.GROUP, EdgeKind.RESHUFFLE):
            with self.plane.call_site(shuffle_label(self.plan, buffer)):
                return self._shuffle(edge, source)
        raise NotImplementedError(f"edge kind {edge.kind}")

    def _text(self, edge):
        """The lines of a ``ReadFromText``, a partition per range of its files."""
        read = self.plan.text_read(edge.id)
        partitions = text_partitions(read, self.plane.default_parallelism())
        if not partitions:
            return self.plane.empty()
        return self.plane.parallelize(partitions, len(partitions)).mapPartitions(
            lambda parts: text_lines.read_ranges(itertools.chain(*parts))
        )

    def _shuffle(self, edge, source):
        """A GroupByKey's shuffle by key group, or a Reshuffle's spread (``read`` tells)."""
        key, comps = self.plan_key, self.components
        if edge.kind == EdgeKind.GROUP:
            return self._keyed_by(source, edge.write_coder).mapPartitions(
                lambda pairs: _grouped(comps.value, key, edge, pairs)
            )
        return reshuffled(source, edge, comps, key, self.parallelism)


def reshuffled(source, edge, components, plan_key: str, parallelism: int):
    """A Reshuffle's spread over ``parallelism`` partitions (batch and streaming rounds alike):
    each chunk's elements dealt out, re-chunked, and re-encoded when the reader's coder is not
    the writer's; the reports carried along. ``components``: the broadcast Components."""
    write_coder = edge.write_coder
    read_coder = edge.read_coder or write_coder
    shuffled = (
        source.mapPartitionsWithIndex(
            lambda i, items: carrying_pairs(
                items, i, lambda blobs: _spread(components.value, plan_key, write_coder, i, blobs)
            )
        )
        .partitionBy(parallelism)
        .values()
        .mapPartitions(lambda items: carrying(items, grouping.chunk))
    )
    if read_coder == write_coder:  # the translation settles most on one coder
        return shuffled
    return shuffled.mapPartitions(
        lambda items: carrying(
            items,
            lambda blobs: _reencode(components.value, plan_key, write_coder, read_coder, blobs),
        )
    )


def tag_input(transform: str, item):
    """A data chunk as (its data-input transform, chunk); a carried report as it is."""
    return (transform, item) if isinstance(item, bytes) else item


def keyed_by(rdd, components, plan_key: str, coder: str, parallelism: int, partition):
    """(encoded key, element) pairs, each in its key group's partition (``partition``, from
    ``grouping.partitioner``; the reports ride as `ReportKey` pairs): a GroupByKey's and a
    stateful stage's input, batch and streaming. ``components``: the broadcast Components."""

    def keyed(blobs):
        register_plan(plan_key, components.value)
        return grouping.keyed_elements(blobs, plan_key, coder)

    return rdd.mapPartitionsWithIndex(
        lambda i, items: carrying_pairs(items, ReportKey(i), keyed)
    ).partitionBy(parallelism, partition)


def _grouped(components: bytes, plan_key: str, edge, pairs):
    register_plan(plan_key, components)
    unkeyed = (pair[1] if is_report_key(pair[0]) else pair for pair in pairs)
    yield from carrying(unkeyed, lambda data: grouping.group_partition(data, plan_key, edge))


def _spread(components: bytes, plan_key: str, coder: str, index: int, blobs):
    register_plan(plan_key, components)
    return grouping.reshuffle_elements(index, blobs, plan_key, coder)


def _reencode(components: bytes, plan_key: str, src: str, dst: str, blobs):
    register_plan(plan_key, components)
    return grouping.reencode(blobs, plan_key, src, dst)

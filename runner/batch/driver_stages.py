"""Small stages that only feed side inputs run on the driver of a local master: no Spark job.

A side input is read by a Spark job before its reader is built (``build_order``); when its
producer starts at an Impulse (``WriteToText``'s initialization, ``Create``) that job is one
tiny task on the critical path (0.8 s in a word count). On a local master the driver shares the
executor's host, interpreter and files, and collects the side input's value anyway, so such a
stage runs here through the task body a Spark task runs (``stage_rdd.StageRdds.task_body``).

A stage qualifies when it leads to a side input through qualifying stages only, is neither
an SDF nor a stateful stage, reads no side input, and each of its inputs is an Impulse or a
materialized or reshuffled buffer every writer of which ran here (a reshuffle between two of
them only re-encodes: one process holds all its elements).
"""

from __future__ import annotations

from apache_beam.runners.common import ENCODED_IMPULSE_VALUE

from sparkbeam.runner.task import grouping
from sparkbeam.runner.task.records import OutputRecord
from sparkbeam.translation.plan import BufferId, EdgeKind, ExecutionPlan, StagePlan

_CHAINED = (EdgeKind.MATERIALIZE, EdgeKind.RESHUFFLE)  # what a driver stage may read


class DriverStages:
    """Which stages of a batch plan run on the driver, and the chunks they wrote."""

    def __init__(self, plan: ExecutionPlan, enabled: bool) -> None:
        self.plan = plan
        self.candidates = side_input_feeders(plan) if enabled else frozenset()
        self.chunks: dict[BufferId, list[bytes]] = {}  # buffer -> chunks its writers wrote here
        self._on_spark: set[BufferId] = set()  # buffers a stage built on Spark writes

    def applies(self, stage: StagePlan) -> bool:
        """Whether ``stage`` runs here (its input writers are built: ``build_order``)."""
        return stage.id in self.candidates and all(map(self._here, stage.input_buffers))

    def has(self, buffer: BufferId) -> bool:
        """Whether every writer of ``buffer`` ran here (its chunks are ``chunks[buffer]``)."""
        return buffer in self.chunks and buffer not in self._on_spark

    def built_on_spark(self, stage: StagePlan) -> None:
        self._on_spark.update(stage.output_buffers)

    def rows(self, stage: StagePlan, plan_key: str) -> list[tuple[str, bytes]]:
        """The stage's input rows, as ``edges.EdgeBuilder.stage_input`` tags them."""
        rows: list[tuple[str, bytes]] = []
        for transform, buffer in stage.inputs:
            edge = self.plan.edge(buffer)
            if edge.kind == EdgeKind.IMPULSE:
                chunks = [ENCODED_IMPULSE_VALUE]
            elif edge.kind == EdgeKind.RESHUFFLE:
                coders = edge.write_coder, edge.read_coder or edge.write_coder
                chunks = grouping.reencode(self.chunks[buffer], plan_key, *coders)
            else:
                chunks = self.chunks[buffer]
            rows.extend((transform, chunk) for chunk in chunks)
        return rows

    def keep(self, stage: StagePlan, records: list) -> tuple[list[OutputRecord], list]:
        """File a run's output chunks under their buffers; (its data records, its reports)."""
        for buffer in stage.output_buffers:
            self.chunks.setdefault(buffer, [])
        data, reports = [], []
        for record in records:
            if isinstance(record, OutputRecord):
                self.chunks[record.buffer].append(record.data)
                data.append(record)
            else:
                reports.append(record)
        return data, reports

    def _here(self, buffer: BufferId) -> bool:
        kind = self.plan.edge(buffer).kind
        return kind == EdgeKind.IMPULSE or (kind in _CHAINED and self.has(buffer))


def side_input_feeders(plan: ExecutionPlan) -> frozenset[str]:
    """The stages whose kind and inputs let them run on the driver, leading to a side input
    through such stages only (whether their inputs' writers ran there is known once built)."""

    def allowed(stage: StagePlan) -> bool:
        return (
            not stage.is_sdf_process
            and not stage.stateful
            and not stage.side_inputs
            and all(plan.edge(b).kind in (EdgeKind.IMPULSE, *_CHAINED) for b in stage.input_buffers)
        )

    wanted = {si.buffer for s in plan.stages for si in s.side_inputs}
    feeders: set[str] = set()
    grew = True
    while grew:
        grew = False
        for stage in plan.stages:
            if stage.id in feeders or not allowed(stage):
                continue
            if wanted.intersection(stage.output_buffers):
                feeders.add(stage.id)
                wanted.update(stage.input_buffers)
                grew = True
    return frozenset(feeders)

"""Driver side: walk an ExecutionPlan and run each stage as Spark jobs.

Stages run one Spark job each, in topological order (the job description in
the Spark UI names the stage). A stage is ``mapPartitions`` over the union of
its input edges; its output is persisted until every consumer has run. Edges
become Spark operations: Impulse a one-element RDD, Flatten a union, GroupByKey
a ``partitionBy`` on encoded keys + Beam's grouping, Reshuffle a repartition,
stateful inputs a ``partitionBy`` on the key. Side inputs are collected once
and broadcast. Bytes and Arrow cross process boundaries; nothing else.
"""

from __future__ import annotations

import functools
import importlib
import logging
import uuid
import warnings
from collections import defaultdict

from apache_beam.metrics import monitoring_infos
from apache_beam.portability.api import metrics_pb2
from apache_beam.runners.common import ENCODED_IMPULSE_VALUE
from pyspark import StorageLevel
from sparkbeam.checkpoint import MemoryStorage, open_store
from sparkbeam.runner import grouping
from sparkbeam.runner.bundle_executor import StageTask, run_stage_partition
from sparkbeam.runner.durability import (
    FINISHED,
    input_marker,
    restored_outputs,
    stage_outputs_durably,
)
from sparkbeam.runner.errors import StageFailedError
from sparkbeam.runner.records import CommitRecord, MetricsRecord, OutputRecord, WarningRecord
from sparkbeam.runner.stage_rounds import StageRounds
from sparkbeam.sdf import ResidualRecord, StateAndTimerBundleCheckpointHandler
from sparkbeam.translation.plan import BufferId, EdgeKind, ExecutionPlan, StagePlan

_LOG = logging.getLogger(__name__)


class PlanExecutor:
    """Runs one ExecutionPlan on a SparkContext, collecting metrics by stage."""

    def __init__(
        self,
        spark,
        plan: ExecutionPlan,
        parallelism: int | None = None,
        store=None,
        checkpoint_url: str | None = None,
        residual_budget_s: float = 5.0,
    ) -> None:
        self.sc = spark.sparkContext
        self.plan = plan
        self.plan_key = f"{plan.fingerprint}-{uuid.uuid4().hex[:8]}"
        self.parallelism = parallelism or self.sc.defaultParallelism
        self.components = self.sc.broadcast(plan.components)
        self._outputs: dict[BufferId, list] = defaultdict(list)  # buffer -> writer RDDs
        self._stage_rdds: dict[str, object] = {}
        self._remaining_consumers: dict[str, int] = {}
        self._broadcasts: list = [self.components]
        self.monitoring_infos_by_stage: dict[str, list] = {}
        self.cancelled = False
        # Residual state lives in a checkpoint store; in memory unless one is given.
        self.store = store or open_store(MemoryStorage(), materialization_interval_s=None)
        self._pipeline_states: dict = {}
        self._rounds: dict[str, StageRounds] = {}
        self.checkpoint_url = checkpoint_url
        self.residual_budget_s = residual_budget_s
        self._round_commits: list = []
        self.resumed: dict[str, int] = {}  # stage -> pending residuals restored

    def run(self) -> None:
        try:
            if self.checkpoint_url:
                self._restore()
            for stage in self.plan.stages:
                if self.cancelled:
                    break
                self._run_stage(stage)
            if self.checkpoint_url and not self.cancelled:
                for pipeline in self.plan.pipelines:
                    self._checkpoint(pipeline.id, {FINISHED: True})
        finally:
            self._cleanup()

    def _restore(self) -> None:
        """Load each pipeline's latest checkpoint, unless its job had finished."""
        for pipeline in self.plan.pipelines:
            probe = self.store.pipeline(pipeline.id)
            info = probe.restore(fingerprint=self.plan.fingerprint)
            if info is None:
                continue
            manifest = self.store.load_manifest(pipeline.id, info.checkpoint_id)
            if manifest.metadata.get(FINISHED):
                probe.close()
                continue  # a finished batch job: run again from scratch
            self._pipeline_states[pipeline.id] = probe
            _LOG.info("Restored %s from checkpoint %s", pipeline.id, info.checkpoint_id)

    def _checkpoint(self, pipeline: str, metadata: dict, commits=()) -> None:
        state = self._pipeline_states.get(pipeline) or self._state_for(pipeline)
        state.checkpoint(
            fingerprint=self.plan.fingerprint,
            parallelism=self.parallelism,
            metadata=metadata,
            commit_messages=list(commits),
        )

    # --- stages -----------------------------------------------------------

    def _run_stage(self, stage: StagePlan) -> None:
        state = self._state(stage)
        completed = state.completed() if self.checkpoint_url else frozenset()
        consumers = {c.id for b in stage.output_buffers for c in self.plan.consumers(b)}
        if consumers and all(input_marker(c) in completed for c in consumers):
            # Completed work is not redeployed: every consumer already took this output.
            self._stage_rdds[stage.id] = []
            self._remaining_consumers[stage.id] = len(consumers)
            return
        side_inputs = {si.buffer: self._read(si.buffer).collect() for si in stage.side_inputs}
        side_bc = self.sc.broadcast(side_inputs)
        self._broadcasts.append(side_bc)
        inputs = [
            self._stage_input(stage, transform, buffer).map(functools.partial(_tag, transform))
            for transform, buffer in stage.inputs
        ]
        rdd = inputs[0] if len(inputs) == 1 else self.sc.union(inputs)
        handler = StateAndTimerBundleCheckpointHandler(state, stage.id)
        infos: list = []
        rounds = StageRounds(
            self.sc,
            stage,
            handler,
            self.parallelism,
            lambda rdd, n: self._launch(stage, rdd, side_bc, handler, infos, n),
            on_round_end=lambda n: self._end_round(stage, handler, n),
        )
        self._rounds[stage.id] = rounds
        prior = []
        if input_marker(stage.id) in completed:
            self.resumed[stage.id] = handler.restore()
            chunks = restored_outputs(state, stage.id)
            if chunks:
                prior.append(
                    self.sc.parallelize([OutputRecord(b, d) for b, d in chunks], self.parallelism)
                )
            first = int(state.source_positions().get(f"{stage.id}:round", b"0")) + 1
            rdds = prior + rounds.run(None, first_round=first)
        else:
            rdds = rounds.run(rdd)
        self.monitoring_infos_by_stage[stage.name] = monitoring_infos.consolidate(infos)
        self._stage_rdds[stage.id] = rdds
        consumers = {c.id for b in stage.output_buffers for c in self.plan.consumers(b)}
        self._remaining_consumers[stage.id] = len(consumers)
        for buffer in dict.fromkeys(stage.output_buffers):
            for round_rdd in rdds:
                self._outputs[buffer].append(
                    round_rdd.filter(functools.partial(_is_output, buffer)).map(_data)
                )
        for producer in self._producers_of(stage):
            self._remaining_consumers[producer] -= 1
            if self._remaining_consumers[producer] <= 0:
                _unpersist(self._stage_rdds.pop(producer))
        if not consumers:
            _unpersist(self._stage_rdds.pop(stage.id))

    def _durable(self, stage: StagePlan) -> bool:
        return bool(self.checkpoint_url) and stage.is_sdf_process

    def _launch(self, stage: StagePlan, rdd, side_bc, handler, infos: list, round_no: int = 0):
        """One Spark job over ``rdd``: run the stage, gather reports and residuals."""
        budget = 0.0 if self.checkpoint_url else self.residual_budget_s
        task = StageTask(self.plan_key, stage, residual_budget_s=budget)
        components = self.components
        durable = self._durable(stage)
        url, kgroups = self.checkpoint_url, self.store.max_key_groups

        def run(rows):
            records = run_stage_partition(task, components.value, side_bc.value, rows)
            if durable:
                records = stage_outputs_durably(
                    records, url, stage.pipeline, stage.id, round_no, kgroups
                )
            return records

        rdd = rdd.mapPartitions(run).persist(StorageLevel.MEMORY_AND_DISK)
        self.sc.setJobDescription(f"sparkbeam {stage.id}: {', '.join(stage.transforms)[:200]}")
        try:
            reports = rdd.filter(_is_report).collect()
        except Exception as e:  # noqa: BLE001 - rewrapped with the stage named
            raise StageFailedError(stage.id, (), _user_traceback(e)) from None
        _reissue_warnings(r for r in reports if isinstance(r, WarningRecord))
        self._round_commits = [r.message for r in reports if isinstance(r, CommitRecord)]
        handler.add(r for r in reports if isinstance(r, ResidualRecord))
        infos.extend(
            metrics_pb2.MonitoringInfo.FromString(b)
            for rec in reports
            if isinstance(rec, MetricsRecord)
            for b in rec.monitoring_infos
        )
        return rdd

    def _end_round(self, stage: StagePlan, handler, round_no: int) -> None:
        """The round barrier: with a checkpoint store, commit the pipeline's state."""
        if not self._durable(stage):
            return
        state = self._state(stage)
        state.mark_completed(input_marker(stage.id))
        state.set_source_position(f"{stage.id}:round", str(round_no).encode())
        self._checkpoint(
            stage.pipeline,
            {
                "stage": stage.id,
                "round": round_no,
                "pending_residuals": handler.pending(),
                "next_timer_ms": handler.next_fire_ms(),
                "watermark_hold_micros": handler.watermark_hold_micros(),
            },
            self._round_commits,
        )
        self._round_commits = []

    def _state(self, stage: StagePlan):
        return self._state_for(stage.pipeline)

    def _state_for(self, pipeline: str):
        if pipeline not in self._pipeline_states:
            self._pipeline_states[pipeline] = self.store.pipeline(pipeline)
        return self._pipeline_states[pipeline]

    def _producers_of(self, stage: StagePlan) -> set[str]:
        read = set(stage.input_buffers) | {si.buffer for si in stage.side_inputs}
        return {
            s.id
            for s in self.plan.stages
            if s.id in self._stage_rdds and s.id != stage.id and read & set(s.output_buffers)
        }

    # --- edges ------------------------------------------------------------

    def _stage_input(self, stage: StagePlan, transform: str, buffer: BufferId):
        rdd = self._read(buffer)
        if stage.stateful and self.plan.edge(buffer).kind != EdgeKind.IMPULSE:
            coder = dict(stage.input_coders)[transform]
            key = self.plan_key
            comps = self.components
            rdd = (
                rdd.mapPartitions(lambda blobs: _keyed(comps.value, key, coder, blobs))
                .partitionBy(self.parallelism, grouping.stable_partition)
                .values()
                .mapPartitions(grouping.chunk)
            )
        return rdd

    def _read(self, buffer: BufferId):
        edge = self.plan.edge(buffer)
        if edge.kind == EdgeKind.IMPULSE:
            return self.sc.parallelize([ENCODED_IMPULSE_VALUE], 1)
        writers = self._outputs.get(buffer, [])
        if not writers:
            source = self.sc.emptyRDD()
        elif len(writers) == 1:
            source = writers[0]
        else:
            source = self.sc.union(writers)
        key = self.plan_key
        comps = self.components
        if edge.kind == EdgeKind.MATERIALIZE:
            return source
        if edge.kind == EdgeKind.GROUP:
            return (
                source.mapPartitions(
                    lambda blobs: _keyed(comps.value, key, edge.write_coder, blobs)
                )
                .partitionBy(self.parallelism, grouping.stable_partition)
                .mapPartitions(lambda pairs: _grouped(comps.value, key, edge, pairs))
            )
        if edge.kind == EdgeKind.RESHUFFLE:
            read_coder = edge.read_coder or edge.write_coder
            return (
                source.mapPartitions(
                    lambda blobs: _spread(comps.value, key, edge.write_coder, blobs)
                )
                .partitionBy(self.parallelism)
                .values()
                .mapPartitions(grouping.chunk)
                .mapPartitions(
                    lambda blobs: _reencode(comps.value, key, edge.write_coder, read_coder, blobs)
                )
            )
        raise NotImplementedError(f"edge kind {edge.kind}")

    def _cleanup(self) -> None:
        for rdds in self._stage_rdds.values():
            _unpersist(rdds)
        self._stage_rdds.clear()
        for bc in self._broadcasts:
            try:
                bc.unpersist(blocking=False)
            except Exception:  # noqa: BLE001 - best effort on shutdown
                pass


# Module-level helpers: small, picklable by reference, run on executors.


def _tag(transform: str, data: bytes) -> tuple[str, bytes]:
    return transform, data


def _is_report(record) -> bool:
    return isinstance(record, (MetricsRecord, WarningRecord, ResidualRecord, CommitRecord))


def _unpersist(rdds) -> None:
    for rdd in rdds:
        rdd.unpersist(blocking=False)


def _reissue_warnings(records) -> None:
    """Re-issue each distinct worker warning on the driver, where users see it."""
    for record in dict.fromkeys(records):
        module, _, name = record.category.partition(":")
        try:
            category = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            category = RuntimeWarning
        warnings.warn(f"[{record.stage}] {record.message}", category, stacklevel=2)


def _is_output(buffer: str, record) -> bool:
    return isinstance(record, OutputRecord) and record.buffer == buffer


def _data(record) -> bytes:
    return record.data


def _keyed(components: bytes, plan_key: str, coder: str, blobs):
    from sparkbeam.runner.worker_context import register_plan

    register_plan(plan_key, components)
    return grouping.keyed_elements(blobs, plan_key, coder)


def _grouped(components: bytes, plan_key: str, edge, pairs):
    from sparkbeam.runner.worker_context import register_plan

    register_plan(plan_key, components)
    return grouping.group_partition(pairs, plan_key, edge)


def _spread(components: bytes, plan_key: str, coder: str, blobs):
    from sparkbeam.runner.worker_context import register_plan

    register_plan(plan_key, components)
    return grouping.reshuffle_elements(blobs, plan_key, coder)


def _reencode(components: bytes, plan_key: str, src: str, dst: str, blobs):
    from sparkbeam.runner.worker_context import register_plan

    register_plan(plan_key, components)
    return grouping.reencode(blobs, plan_key, src, dst)


def _user_traceback(error: Exception) -> str:
    """The Python worker's traceback from a Spark failure, without JVM frames."""
    text = str(error)
    marker = "UserCodeError: "
    if marker in text:
        text = text[text.rindex(marker) + len(marker) :]
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("at ")]
    return "\n".join(lines).strip()

"""Driver side: walk an ExecutionPlan and run its stages as Spark jobs.

Stages are built lazily, in topological order: each is a persisted
``mapPartitions`` over its input edges (``sparkbeam.runner.rounds.edges``). Spark
runs them when something needs their data — a side input (collected once and
broadcast), a splittable-DoFn stage (which runs in rounds, see
``stage_rounds``), or the final job that drives every remaining stage and
gathers the typed reports (metrics, warnings) their tasks returned. So a
chain of ordinary stages is one Spark job, not one job per stage.
"""

from __future__ import annotations

import functools
import importlib
import logging
import uuid
import warnings
from collections import defaultdict
from typing import Any

from apache_beam.portability.api import metrics_pb2
from pyspark import StorageLevel
from sparkbeam.checkpoint import MemoryStorage, open_store, state_layout
from sparkbeam.runner import progress
from sparkbeam.runner.batch.durability import (
    FINISHED,
    input_marker,
    restored_outputs,
    stage_outputs_durably,
)
from sparkbeam.runner.batch.stage_rounds import StageRounds
from sparkbeam.runner.errors import run_guarded
from sparkbeam.runner.metrics import merge_monitoring_infos
from sparkbeam.runner.rounds.compatibility import RestoreGuard
from sparkbeam.runner.rounds.edges import EdgeBuilder
from sparkbeam.runner.rounds.sink_files import (
    collect_sink_files,
    discard_staging,
    finalize,
    finalize_pending,
    record_pending,
    staging_dirs,
)
from sparkbeam.runner.rounds.startpoints import (
    StartpointOutcome,
    check_startpoints,
    commit_round,
    open_session,
    outcomes,
    record_failure,
    with_startpoints,
)
from sparkbeam.runner.spark.labels import (
    call_site,
    describe_job,
    job_group,
    name_rdd,
    stage_label,
)
from sparkbeam.runner.task.bundle_executor import StageTask, run_stage_partition
from sparkbeam.runner.task.bundle_splits import SplitPolicy
from sparkbeam.runner.task.records import (
    CommitRecord,
    MetricsRecord,
    OutputRecord,
    SinkFilesRecord,
    WarningRecord,
)
from sparkbeam.sdf import ResidualRecord, StateAndTimerBundleCheckpointHandler
from sparkbeam.sdf.startpoints.errors import StartpointFailedError
from sparkbeam.sdf.startpoints.session import StartpointSession
from sparkbeam.translation.plan import ExecutionPlan, StagePlan

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
        residual_budget_s: float = 30.0,
        split_policy: SplitPolicy | None = None,
        startpoint_max_age_s: float | None = None,
    ) -> None:
        self.sc = spark.sparkContext
        self.plan = plan
        self.plan_key = f"{plan.fingerprint}-{uuid.uuid4().hex[:8]}"
        self.parallelism = parallelism or self.sc.defaultParallelism
        self.components = self.sc.broadcast(plan.components)
        self.edges = EdgeBuilder(self.sc, plan, self.plan_key, self.components, self.parallelism)
        self.group = job_group(plan)  # the Spark job group of every job of this run
        self._labels = {s.id: stage_label(s) for s in plan.stages}
        self._broadcasts: list = [self.components]
        self._persisted: list = []
        self._lazy: list[tuple[StagePlan, Any]] = []  # stages whose reports are pending
        self._infos: dict[str, list] = defaultdict(list)
        self.monitoring_infos_by_stage: dict[str, list] = {}
        # Residual state lives in a checkpoint store; in memory unless one is given.
        self.store = store or open_store(MemoryStorage(), materialization_interval_s=None)
        self.checkpoint_url = checkpoint_url
        self.residual_budget_s = residual_budget_s
        self.split_policy = split_policy or SplitPolicy()
        self._pipeline_states: dict = {}
        self._round_commits: list = []
        self.resumed: dict[str, int] = {}  # stage -> pending residuals restored
        # (staged, final) files of committed task attempts, renamed when the run succeeds.
        self.sink_files: list[tuple[str, str]] = []
        self._round_sink_files: list[tuple[str, str]] = []
        # Startpoints (with a checkpoint store only): one session per pipeline.
        self.startpoint_max_age_s = startpoint_max_age_s
        self.startpoints: dict[str, StartpointSession] = {}
        self._restored_metadata: dict[str, dict] = {}
        self._round_outcomes: list[StartpointOutcome] = []

    def run(self) -> None:
        try:
            if self.checkpoint_url:
                self._restore()
                self._open_startpoints()
            for stage in self.plan.stages:
                self._run_stage(stage)
            self._run_remaining()
            self.monitoring_infos_by_stage = {
                s.name: merge_monitoring_infos(self._infos[s.id]) for s in self.plan.stages
            }
            self._finalize_sink_files()
            if self.checkpoint_url:
                for pipeline in self.plan.pipelines:
                    self._checkpoint(pipeline.id, {FINISHED: True})
        finally:
            self._cleanup()

    # --- checkpoints --------------------------------------------------------

    def _restore(self) -> None:
        """Load each pipeline's latest checkpoint, unless its job had finished."""
        for pipeline in self.plan.pipelines:
            probe = self.store.pipeline(pipeline.id)
            info = self._guard.restore(probe, self.store)  # refuses incompatible changes
            if info is None:
                continue
            manifest = self.store.load_manifest(pipeline.id, info.checkpoint_id)
            self._restored_metadata[pipeline.id] = manifest.metadata
            if manifest.metadata.get(FINISHED):
                probe.close()
                continue  # a finished batch job: run again from scratch
            self._pipeline_states[pipeline.id] = probe
            progress.batch_resumed(pipeline.id, info.checkpoint_id)

    def _open_startpoints(self) -> None:
        """Before any stage runs: fan each pipeline's startpoints out from its checkpoint."""
        check_startpoints(self.store.startpoints, self.plan)
        for pipeline in self.plan.pipelines:
            self.startpoints[pipeline.id] = open_session(
                self.store.startpoints,
                self.plan,
                pipeline.id,
                self._restored_metadata.get(pipeline.id),  # a finished run's: only its tokens
                self._pipeline_states.get(pipeline.id),
                self.startpoint_max_age_s,
            )

    def _finalize_sink_files(self) -> None:
        """Make committed sink files visible (incl. rounds of a killed run), drop the rest."""
        finalize(self.sink_files)
        if self.checkpoint_url:
            for pipeline in self.plan.pipelines:
                finalize_pending(self._state_for(pipeline.id))
        for directory in staging_dirs(self.sink_files):
            discard_staging(directory, keep=())

    def _checkpoint(self, pipeline: str, metadata: dict, commits=()) -> None:
        self._state_for(pipeline).checkpoint(
            fingerprint=self.plan.fingerprint,
            parallelism=self.parallelism,
            metadata={**metadata, **self._guard.metadata(pipeline)},
            commit_messages=list(commits),
        )

    @functools.cached_property
    def _guard(self) -> RestoreGuard:
        """What each checkpoint records of the plan, and the check on restore."""
        return RestoreGuard(self.plan)

    def _state_for(self, pipeline: str):
        if pipeline not in self._pipeline_states:
            self._pipeline_states[pipeline] = self.store.pipeline(pipeline)
        return self._pipeline_states[pipeline]

    def _durable(self, stage: StagePlan) -> bool:
        return bool(self.checkpoint_url) and stage.is_sdf_process

    # --- stages -------------------------------------------------------------

    def _run_stage(self, stage: StagePlan) -> None:
        state = self._state_for(stage.pipeline)
        completed = state.completed() if self.checkpoint_url else frozenset()
        consumers = {c.id for b in stage.output_buffers for c in self.plan.consumers(b)}
        if consumers and all(input_marker(c) in completed for c in consumers):
            return  # completed work is not redeployed: every consumer took this output
        side_bc = self._side_inputs(stage)
        if stage.is_sdf_process:
            rdds = self._run_in_rounds(stage, side_bc, state, completed)
        else:
            with call_site(self.sc, self._labels[stage.id]):
                rdd = self._stage_rdd(stage, self.edges.stage_input(stage), side_bc, 0)
            self._lazy.append((stage, rdd))
            rdds = [rdd]
        for buffer in dict.fromkeys(stage.output_buffers):
            for rdd in rdds:
                self.edges.add_writer(
                    buffer, rdd.filter(functools.partial(_is_output, buffer)).map(_data)
                )

    def _side_inputs(self, stage: StagePlan):
        values = {}
        for si in stage.side_inputs:
            label = f"{self._labels[stage.id]} (side input {si.tag})"
            describe_job(self.sc, self.group, label)
            with call_site(self.sc, label):
                values[si.buffer] = self._guarded(stage, self.edges.read(si.buffer).collect)
        side_bc = self.sc.broadcast(values)
        self._broadcasts.append(side_bc)
        return side_bc

    def _stage_rdd(self, stage: StagePlan, input_rdd, side_bc, round_no: int):
        """The persisted (lazy) RDD of one run of the stage over ``input_rdd``."""
        budget = 0.0 if self.checkpoint_url else self.residual_budget_s
        task = StageTask(self.plan_key, stage, residual_budget_s=budget, splits=self.split_policy)
        components = self.components
        durable = self._durable(stage)
        url, kgroups = self.checkpoint_url, self.store.max_key_groups
        session = self.startpoints.get(stage.pipeline)
        assignment = session.assignment(stage.id) if session is not None else None

        def run(rows):
            records = with_startpoints(
                stage, components.value, assignment, rows,
                lambda rows: run_stage_partition(task, components.value, side_bc.value, rows),
            )  # fmt: skip
            records = collect_sink_files(records, stage.id, round_no)
            if durable:
                records = stage_outputs_durably(
                    records, url, stage.pipeline, stage.id, round_no, kgroups
                )
            return records

        rdd = input_rdd.mapPartitions(run).persist(StorageLevel.MEMORY_AND_DISK)
        name_rdd(rdd, f"{self._labels[stage.id]} (round {round_no})")
        self._persisted.append(rdd)
        return rdd

    def _run_in_rounds(self, stage: StagePlan, side_bc, state, completed) -> list:
        handler = StateAndTimerBundleCheckpointHandler(state, stage.id)

        def launch(rdd, round_no):
            label = f"{self._labels[stage.id]} (round {round_no})"
            describe_job(self.sc, self.group, label)
            with call_site(self.sc, label):
                rdd = self._stage_rdd(stage, rdd, side_bc, round_no)
                reports = self._guarded(stage, rdd.filter(_is_report).collect)
            self._take_reports(stage, reports, handler)
            return rdd

        rounds = StageRounds(
            self.sc,
            stage,
            handler,
            self.parallelism,
            launch,
            on_round_end=lambda n: self._end_round(stage, handler, n),
        )
        if input_marker(stage.id) not in completed:
            return rounds.run(self.edges.stage_input(stage))
        # Resume: committed outputs, pending residuals, and the next round number.
        self.resumed[stage.id] = handler.restore()
        chunks = restored_outputs(state, stage.id)
        prior = []
        if chunks:
            rows = [OutputRecord(b, d) for b, d in chunks]
            prior.append(self.sc.parallelize(rows, self.parallelism))
        first = (
            int(state.source_positions().get(state_layout.stage_round_position(stage.id), b"0")) + 1
        )
        return prior + rounds.run(None, first_round=first)

    def _end_round(self, stage: StagePlan, handler, round_no: int) -> None:
        """The round barrier: with a checkpoint store, commit the pipeline's state."""
        if not self._durable(stage):
            return
        state = self._state_for(stage.pipeline)
        state.mark_completed(input_marker(stage.id))
        state.set_source_position(
            state_layout.stage_round_position(stage.id), str(round_no).encode()
        )
        record_pending(state, self._round_sink_files)  # renamed at the end, even after a kill
        metadata = {
            "stage": stage.id,
            "round": round_no,
            "pending_residuals": handler.pending(),
            "next_timer_ms": handler.next_fire_ms(),
            "watermark_hold_micros": handler.watermark_hold_micros(),
        }
        commit_round(
            self.startpoints.get(stage.pipeline),
            self._round_outcomes,
            lambda consumed: self._checkpoint(
                stage.pipeline, {**metadata, **consumed}, self._round_commits
            ),
        )
        self._round_commits, self._round_outcomes = [], []

    def _run_remaining(self) -> None:
        """One Spark job that runs every stage not run yet and gathers all reports."""
        if not self._lazy:
            return
        label = "; ".join(self._labels[stage.id] for stage, _ in self._lazy)
        describe_job(self.sc, self.group, label)
        with call_site(self.sc, label):
            union = self.sc.union([rdd.filter(_is_report) for _, rdd in self._lazy])
            reports = self._guarded(None, union.collect)
        by_stage: dict[str, list] = defaultdict(list)
        for r in reports:
            by_stage[r.stage].append(r)
        for stage, _ in self._lazy:
            self._take_reports(stage, by_stage.get(stage.id, []), None)

    def _take_reports(self, stage: StagePlan, reports: list, handler) -> None:
        _reissue_warnings(r for r in reports if isinstance(r, WarningRecord))
        self._round_commits = [r.message for r in reports if isinstance(r, CommitRecord)]
        self._round_sink_files = [
            p for r in reports if isinstance(r, SinkFilesRecord) for p in r.pairs
        ]
        self.sink_files.extend(self._round_sink_files)
        self._round_outcomes = outcomes(reports)
        residuals = [r for r in reports if isinstance(r, ResidualRecord)]
        if residuals and handler is None:
            raise NotImplementedError(
                f"Stage {stage.id} returned {len(residuals)} residual(s) but is not a "
                "splittable-DoFn stage; this is a sparkbeam bug, please report it."
            )
        if handler is not None:
            handler.add(residuals)
        self._infos[stage.id].extend(
            metrics_pb2.MonitoringInfo.FromString(b)
            for rec in reports
            if isinstance(rec, MetricsRecord)
            for b in rec.monitoring_infos
        )

    def _guarded(self, stage: StagePlan | None, action):
        """Run a Spark action; a task failure becomes StageFailedError naming the stage."""
        try:
            return run_guarded(stage.id if stage else None, action, self._labels.get)
        except StartpointFailedError as e:  # every later start refuses it at once
            record_failure(self.store and self.store.startpoints, e)
            raise

    def _cleanup(self) -> None:
        for rdd in self._persisted:
            rdd.unpersist(blocking=False)
        self._persisted.clear()
        for bc in self._broadcasts:
            try:
                bc.unpersist(blocking=False)
            except Exception:  # noqa: BLE001 - best effort on shutdown
                pass


# Module-level helpers: small, picklable by reference, run on executors.


def _is_output(buffer: str, record) -> bool:
    return isinstance(record, OutputRecord) and record.buffer == buffer


def _data(record) -> bytes:
    return record.data


_REPORTS = (MetricsRecord, WarningRecord, ResidualRecord, CommitRecord, SinkFilesRecord)


def _is_report(record) -> bool:
    return isinstance(record, (*_REPORTS, StartpointOutcome))


def _reissue_warnings(records) -> None:
    """Re-issue each distinct worker warning on the driver, where users see it."""
    for record in dict.fromkeys(records):
        module, _, name = record.category.partition(":")
        try:
            category = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            category = RuntimeWarning
        warnings.warn(f"[{record.stage}] {record.message}", category, stacklevel=2)

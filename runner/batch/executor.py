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
import logging
import uuid
from collections import defaultdict
from typing import Any

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
from sparkbeam.runner.rounds.ledger import RoundLedger, RoundMetadata
from sparkbeam.runner.rounds.sink_files import (
    collect_sink_files,
    discard_staging,
    finalize,
    finalize_pending,
    staging_dirs,
)
from sparkbeam.runner.rounds.startpoints import (
    check_startpoints,
    open_session,
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
    OutputRecord,
    is_report,
)
from sparkbeam.sdf import StateAndTimerBundleCheckpointHandler
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
        self.group = job_group(plan)  # the Spark job group of every job of this run
        self._labels = {s.id: stage_label(s) for s in plan.stages}
        self._broadcasts: list = [self.components]
        self._persisted: list = []
        self._lazy: list[tuple[StagePlan, Any]] = []  # stages whose reports are pending
        self._infos: dict[str, list] = defaultdict(list)
        self.monitoring_infos_by_stage: dict[str, list] = {}
        # Residual state lives in a checkpoint store; in memory unless one is given.
        self.store = store or open_store(MemoryStorage(), materialization_interval_s=None)
        self.edges = EdgeBuilder(
            self.sc,
            plan,
            self.plan_key,
            self.components,
            self.parallelism,
            # Batch shuffles restore no state: one key group per partition keeps them balanced
            # at any parallelism (streaming's follow the store's key groups: its state does).
            max_key_groups=self.parallelism,
        )
        self.checkpoint_url = checkpoint_url
        self.residual_budget_s = residual_budget_s
        self.split_policy = split_policy or SplitPolicy()
        self._pipeline_states: dict = {}
        self.resumed: dict[str, int] = {}  # stage -> pending residuals restored
        # (staged, final) files of committed task attempts, renamed when the run succeeds.
        self.sink_files: list[tuple[str, str]] = []
        # Startpoints (with a checkpoint store only): one session per pipeline.
        self.startpoint_max_age_s = startpoint_max_age_s
        self.startpoints: dict[str, StartpointSession] = {}
        self._restored_metadata: dict[str, dict] = {}

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

    def _checkpoint(self, pipeline: str, metadata: dict) -> None:
        self._state_for(pipeline).checkpoint(
            fingerprint=self.plan.fingerprint,
            parallelism=self.parallelism,
            metadata={**metadata, **self._guard.metadata(pipeline)},
            commit_messages=[],
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
        """The batch round loop: run a round while input is new or residuals are pending."""
        handler = StateAndTimerBundleCheckpointHandler(state, stage.id)
        rdds, first = [], 0
        input_rdd = self.edges.stage_input(stage)
        if input_marker(stage.id) in completed:
            # Resume: committed outputs, pending residuals, and the next round number.
            input_rdd = None
            self.resumed[stage.id] = handler.restore()
            chunks = restored_outputs(state, stage.id)
            if chunks:
                rows = [OutputRecord(b, d) for b, d in chunks]
                rdds.append(self.sc.parallelize(rows, self.parallelism))
            position = state_layout.stage_round_position(stage.id)
            first = int(state.source_positions().get(position, b"0")) + 1
        rounds = StageRounds(stage, handler, first)
        while input_rdd is not None or rounds.pending():
            if input_rdd is None:
                rows = rounds.due_rows()
                if not rows:
                    continue
                input_rdd = self.sc.parallelize(rows, max(1, min(self.parallelism, len(rows))))
            rdds.append(self._run_round(stage, side_bc, handler, input_rdd, rounds.round_no))
            rounds.round_no += 1
            input_rdd = None
        return rdds

    def _run_round(self, stage: StagePlan, side_bc, handler, input_rdd, round_no: int):
        """One round: one Spark job, its reports into one ledger, one checkpoint."""
        label = f"{self._labels[stage.id]} (round {round_no})"
        describe_job(self.sc, self.group, label)
        with call_site(self.sc, label):
            rdd = self._stage_rdd(stage, input_rdd, side_bc, round_no)
            reports = self._guarded(stage, rdd.filter(is_report).collect)
        ledger = self._absorb(stage, reports, handler)
        if self._durable(stage):
            self._commit_round(stage, handler, ledger, round_no)
        return rdd

    def _commit_round(self, stage: StagePlan, handler, ledger: RoundLedger, round_no: int):
        """The round barrier: with a checkpoint store, commit the pipeline's state."""
        state = self._state_for(stage.pipeline)
        state.mark_completed(input_marker(stage.id))
        state.set_source_position(
            state_layout.stage_round_position(stage.id), str(round_no).encode()
        )
        metadata = RoundMetadata(
            round_no=round_no,
            pending_residuals=handler.pending(),
            next_timer_ms=handler.next_fire_ms(),
            stage=stage.id,
            watermark_hold_micros=handler.watermark_hold_micros(),
        )
        ledger.commit(  # sink files renamed at the end of the run, even after a kill
            state,
            self.startpoints.get(stage.pipeline),
            metadata,
            fingerprint=self.plan.fingerprint,
            parallelism=self.parallelism,
            plan_metadata=self._guard.metadata(stage.pipeline),
        )

    def _run_remaining(self) -> None:
        """One Spark job that runs every stage not run yet and gathers all reports."""
        if not self._lazy:
            return
        label = "; ".join(self._labels[stage.id] for stage, _ in self._lazy)
        describe_job(self.sc, self.group, label)
        with call_site(self.sc, label):
            union = self.sc.union([rdd.filter(is_report) for _, rdd in self._lazy])
            reports = self._guarded(None, union.collect)
        by_stage: dict[str, list] = defaultdict(list)
        for r in reports:
            by_stage[r.stage].append(r)
        for stage, _ in self._lazy:
            self._absorb(stage, by_stage.get(stage.id, []), None)

    def _absorb(self, stage: StagePlan, reports: list, handler) -> RoundLedger:
        """A round's reports into its ledger; residuals to the stage's handler."""
        ledger = RoundLedger().absorb(reports)
        self.sink_files.extend(ledger.sink_files)
        residuals = ledger.residuals.get(stage.id, [])
        if ledger.residual_count() and handler is None:
            raise NotImplementedError(
                f"Stage {stage.id} returned {ledger.residual_count()} residual(s) but is not a "
                "splittable-DoFn stage; this is a sparkbeam bug, please report it."
            )
        if handler is not None:
            handler.add(residuals)
        for infos in ledger.metrics.values():
            self._infos[stage.id].extend(infos)
        return ledger

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

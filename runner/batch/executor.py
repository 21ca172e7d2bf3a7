"""Driver side: walk an ExecutionPlan and run its stages as Spark jobs.

Stages are built lazily, in waves (``build_order``), each a ``stage_rdd`` over its input edges
(``rounds.edges``). Spark runs them when something needs their data: a side input (collected
once and broadcast), an SDF stage (in rounds: ``stage_rounds``), or the final job that drives
every remaining stage and gathers their reports. Reports travel with the data to one ordinary
consumer (``rounds.carry``), so a chain of ordinary stages is one Spark job and one Python
task per partition.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from sparkbeam.checkpoint import open_working_store, restore, state_layout
from sparkbeam.runner import progress
from sparkbeam.runner.batch.build_order import build_waves
from sparkbeam.runner.batch.driver_stages import DriverStages
from sparkbeam.runner.batch.stage_rdd import StageRdds
from sparkbeam.runner.batch.stage_rounds import StageRounds
from sparkbeam.runner.errors import DamagedStateError, run_guarded
from sparkbeam.runner.rounds.carry import plan_carriers
from sparkbeam.runner.rounds.compatibility import restore_latest
from sparkbeam.runner.rounds.context import RunContext
from sparkbeam.runner.rounds.edges import EdgeBuilder
from sparkbeam.runner.rounds.ledger import RoundLedger
from sparkbeam.runner.rounds.loop import RoundLoop
from sparkbeam.runner.rounds.side_inputs import read_together
from sparkbeam.runner.rounds.sink_files import (
    discard_staging,
    finalize,
    finalize_pending,
    staging_dirs,
)
from sparkbeam.runner.rounds.startpoints import check_startpoints, open_session, record_failure
from sparkbeam.runner.task.bundle_splits import SplitPolicy
from sparkbeam.runner.task.records import is_report
from sparkbeam.runner.task.staged_state import DEFAULT_MEMORY_BYTES
from sparkbeam.sdf.startpoints.errors import StartpointFailedError
from sparkbeam.translation.plan import ExecutionPlan, StagePlan


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
        data_plane: str | None = None,
        filesystem_options: str = "{}",
        fresh: bool = False,
        max_key_groups: int | None = None,
        state_memory_bytes: int = DEFAULT_MEMORY_BYTES,
    ) -> None:
        # Residual state lives in a checkpoint store; in memory unless one is given.
        store = store or open_working_store()
        self.ctx = ctx = RunContext.create(
            spark, plan, store, checkpoint_url, parallelism,
            startpoint_max_age_s=startpoint_max_age_s, data_plane=data_plane,
            filesystem_options=filesystem_options, fresh=fresh, max_key_groups=max_key_groups,
            state_memory_bytes=state_memory_bytes,
        )  # fmt: skip
        self.plane, self.plan, self.store = ctx.plane, plan, store
        self.elements = progress.ElementCounter(spark, {e.pcollection for e in plan.edges})
        self._rdd_options = (residual_budget_s, split_policy or SplitPolicy())
        self._start()

    def _start(self) -> None:
        """What one run of the plan builds: a fresh one after a fallback (`_fall_back`)."""
        ctx, plan = self.ctx, self.plan
        self.rdds = StageRdds(ctx, *self._rdd_options, self.elements)
        self._labels = self.rdds.labels
        self._broadcasts: list = []  # this build's side inputs, released with it
        self._lazy: list[tuple[StagePlan, Any]] = []  # stages whose reports are pending
        self._ran: set[str] = set()  # lazy stages an earlier job computed (their RDD is cached)
        self._completed: frozenset[str] = frozenset()  # stages a resumed run skips
        self.monitoring_infos_by_stage: dict[str, list] = {}
        self.edges = EdgeBuilder(
            ctx.plane,
            plan,
            ctx.plan_key,
            ctx.components,
            ctx.parallelism,
            # Batch shuffles restore no state: one key group per partition keeps them balanced
            # at any parallelism (streaming's follow the store's key groups: its state does).
            max_key_groups=ctx.parallelism,
        )
        self._pipeline_states: dict = {}
        self.resumed: dict[str, int] = {}  # stage -> pending residuals restored
        # (staged, final) files of committed task attempts, renamed when the run succeeds.
        self.sink_files: list[tuple[str, str]] = []
        self._restored_metadata: dict[str, dict] = {}
        # Stages that only feed side inputs run on a local master's driver: no Spark job.
        self.driver = DriverStages(plan, enabled=ctx.plane.local_master)

    def run(self) -> None:
        try:
            while True:
                try:
                    return self._run()
                except DamagedStateError as e:
                    if not self._fall_back(e):
                        raise
        finally:
            self._cleanup()

    def _fall_back(self, e: DamagedStateError) -> bool:
        """A task found a checkpoint's file damaged: set the damaged checkpoints aside
        (`restore.fall_back`) and build the run again from the sound ones. False when every
        newest checkpoint is sound (the file was unreadable for a while): the run fails."""
        if not self.ctx.durable:
            return False
        cause = f"{e.cause} -- batch stage {e.stage}"
        sound = [restore.fall_back(self.store, p.id, cause) for p in self.plan.pipelines]
        if all(cid is None for cid in sound):
            return False
        self._cleanup()
        self._start()
        return True

    def _run(self) -> None:
        if self.ctx.durable:
            self._restore()
            self._open_startpoints()
        self._completed = self._completed_stages()
        self.edges.carriers = self._plan_carriers()
        for wave in build_waves(self.plan):
            self._run_wave(wave)
        self._run_remaining()
        self.monitoring_infos_by_stage = self.ctx.metrics.by_name(self.plan)
        self._finalize_sink_files()
        if self.ctx.durable:
            for pipeline in self.plan.pipelines:
                self._state_for(pipeline.id).checkpoint(
                    fingerprint=self.plan.fingerprint,
                    parallelism=self.ctx.parallelism,
                    metadata={state_layout.FINISHED: True, **self.ctx.guard.metadata(pipeline.id)},
                    commit_messages=[],
                )

    # --- checkpoints --------------------------------------------------------

    def _restore(self) -> None:
        """Load each pipeline's latest checkpoint, unless its job had finished."""
        for pipeline in self.plan.pipelines:
            latest = restore_latest(self.ctx, pipeline.id)
            if latest.metadata is not None:  # a finished job's too: its startpoint tokens
                self._restored_metadata[pipeline.id] = latest.metadata
            if latest.info is not None:  # else no checkpoint, or --fresh after a finished job
                self._pipeline_states[pipeline.id] = latest.state
                progress.batch_resumed(pipeline.id, latest.info.checkpoint_id)

    def _open_startpoints(self) -> None:
        """Before any stage runs: fan each pipeline's startpoints out from its checkpoint."""
        check_startpoints(self.store.startpoints, self.plan)
        for pipeline in self.plan.pipelines:
            self.rdds.startpoints[pipeline.id] = open_session(
                self.store.startpoints,
                self.plan,
                pipeline.id,
                self._restored_metadata.get(pipeline.id),  # a finished run's: only its tokens
                self._pipeline_states.get(pipeline.id),
                self.ctx.startpoint_max_age_s,
            )

    def _finalize_sink_files(self) -> None:
        """Make committed sink files visible (incl. rounds of a killed run), drop the rest."""
        finalize(self.sink_files)
        if self.ctx.durable:
            for pipeline in self.plan.pipelines:
                finalize_pending(self._state_for(pipeline.id))
        for directory in staging_dirs(self.sink_files):
            discard_staging(directory, keep=())

    def _state_for(self, pipeline: str):
        if pipeline not in self._pipeline_states:
            self._pipeline_states[pipeline] = self.store.pipeline(pipeline)
        return self._pipeline_states[pipeline]

    # --- stages -------------------------------------------------------------

    def _plan_carriers(self):
        """Each stage's reports ride to its first consumer that will run and passes them on:
        an ordinary stage (an SDF stage collects its own reports, round by round)."""
        stages, skipped = self.plan.stages, self._completed
        side_reads = Counter(b for s in stages for b in {si.buffer for si in s.side_inputs})

        def ordinary(stage: StagePlan, *_) -> bool:
            return not stage.is_sdf_process and stage.id not in skipped

        return plan_carriers(
            stages,
            can_carry=ordinary,
            side_reads=side_reads.__getitem__,
            writers=[s.id for s in stages if ordinary(s)],
        )

    def _run_wave(self, wave: tuple[StagePlan, ...]) -> None:
        """Build the wave's stages; the side inputs of all of them are read in one job."""
        stages = [s for s in wave if s.id not in self._completed]
        values = self._side_inputs(stages)
        for stage in stages:
            side_bc = self.plane.broadcast(
                {si.buffer: values[si.buffer] for si in stage.side_inputs}
            )
            self._broadcasts.append(side_bc)
            self._run_stage(stage, side_bc)

    def _completed_stages(self) -> frozenset[str]:
        """Completed work is not redeployed: stages every consumer of which took their output.
        Decided before any stage runs: an SDF stage marks its input taken when its first round
        commits, and by then every stage upstream of it was built."""
        if not self.ctx.durable:
            return frozenset()
        done = set()
        for stage in self.plan.stages:
            completed = self._state_for(stage.pipeline).completed()
            consumers = {c.id for b in stage.output_buffers for c in self.plan.consumers(b)}
            if consumers and all(state_layout.input_marker(c) in completed for c in consumers):
                done.add(stage.id)
        return frozenset(done)

    def _run_stage(self, stage: StagePlan, side_bc) -> None:
        if self.driver.applies(stage):
            rdds = [self._run_on_driver(stage, side_bc)]
        else:
            self.driver.built_on_spark(stage)
            rdds = self._build_on_spark(stage, side_bc)
        for buffer in dict.fromkeys(stage.output_buffers):
            for rdd in rdds:
                self.edges.add_writer(buffer, stage.id, rdd)

    def _build_on_spark(self, stage: StagePlan, side_bc) -> list:
        """An ordinary stage's lazy RDD, or an SDF stage's rounds (run now) and their RDDs."""
        if not stage.is_sdf_process:
            cache = self.edges.carriers.cache(stage.id)
            with self.plane.call_site(self._labels[stage.id]):
                rdd = self.rdds.build(stage, self.edges.stage_input(stage), side_bc, 0, cache)
            self._lazy.append((stage, rdd))
            return [rdd]
        state = self._state_for(stage.pipeline)
        # A committed round consumed the input: resume; else round 0 reads (and runs) it.
        resume = self.ctx.durable and state_layout.input_marker(stage.id) in state.completed()
        rdds = self._run_in_rounds(stage, side_bc, state, resume)
        if not resume:
            self._ran |= self.plan.upstream(stage.input_buffers)
        return rdds

    def _run_on_driver(self, stage: StagePlan, side_bc):
        """Run the stage here, now (``driver_stages``); main-input readers get its data as a
        one-partition dataset."""
        run = self.rdds.task_body(stage, side_bc, 0)
        rows = self.driver.rows(stage, self.ctx.plan_key)
        records = self._guarded(stage, lambda: list(run(iter(rows))))
        data, reports = self.driver.keep(stage, records)
        self._absorb(stage, reports)
        return self.plane.parallelize(data, 1)

    def _run_in_rounds(self, stage: StagePlan, side_bc, state, resume: bool) -> list:
        """The stage's round loop, until nothing is pending; every round's output RDD."""
        job = StageRounds(
            self.ctx, self.rdds, stage, side_bc, state,
            input_rdd=None if resume else self.edges.stage_input(stage),
            restored_metadata=self._restored_metadata.get(stage.pipeline),
        )  # fmt: skip
        RoundLoop(job, self.ctx).run()
        self.sink_files.extend(job.sink_files)
        if job.resumed is not None:
            self.resumed[stage.id] = job.resumed
        return job.outputs

    def _side_inputs(self, stages: list[StagePlan]) -> dict:
        """Side input buffer -> its encoded chunks, for every stage given: one Spark job for
        those that stages run on the driver did not write."""
        needed = dict.fromkeys(si.buffer for s in stages for si in s.side_inputs)
        values = {b: self.driver.chunks[b] for b in needed if self.driver.has(b)}
        buffers = [b for b in needed if b not in values]
        if not buffers:
            return values
        label = "; ".join(
            f"{self._labels[s.id]} (side input {si.tag})" for s in stages for si in s.side_inputs
        )
        self.plane.describe_job(self.rdds.group, label)
        with self.plane.call_site(label):
            reads = {b: self.edges.read(b) for b in buffers}
            collect = lambda d: self._guarded(stages[0], d.collect)  # noqa: E731
            values.update(read_together(self.plane, reads, collect))
        self._ran |= self.plan.upstream(buffers)
        return values

    def _run_remaining(self) -> None:
        """One Spark job that runs every stage not run yet and gathers all reports."""
        if not self._lazy:
            return
        label = "; ".join(self._labels[stage.id] for stage, _ in self._lazy)
        self.plane.describe_job(self.rdds.group, label)
        with self.plane.call_site(label):
            reports = self._guarded(None, self._reports().collect)
        by_stage: dict[str, list] = defaultdict(list)
        for r in reports:
            by_stage[r.stage].append(r)
        for stage, _ in self._lazy:
            self._absorb(stage, by_stage.get(stage.id, []))

    def _absorb(self, stage: StagePlan, reports: list) -> None:
        """An ordinary stage's reports: its metrics and staged sink files (warnings re-issued)."""
        ledger = RoundLedger().absorb(reports)
        if ledger.residual_count():
            raise NotImplementedError(
                f"Stage {stage.id} returned {ledger.residual_count()} residual(s) but is not "
                "a splittable-DoFn stage; this is a sparkbeam bug, please report it."
            )
        self.sink_files.extend(ledger.sink_files)
        for infos in ledger.metrics.values():
            self.ctx.metrics.add(stage.id, infos)

    def _reports(self):
        """The reports of every lazy stage nobody carries (with those they carry). Cached
        stages an earlier job ran share a few tasks: a task per cached partition cost more
        than the read (92 tiny stages made 147 tasks)."""
        fresh, cached = [], []
        for stage, rdd in self._lazy:
            if stage.id in self.edges.carriers.carrier:
                continue
            (cached if stage.id in self._ran else fresh).append(rdd.filter(is_report))
        if cached:
            fresh.append(self.plane.union(cached).coalesce(self.ctx.parallelism))
        return self.plane.union(fresh)

    def _guarded(self, stage: StagePlan | None, action):
        """Run a Spark action; a task failure becomes StageFailedError naming the stage."""
        try:
            return run_guarded(stage.id if stage else None, action, self._labels.get)
        except StartpointFailedError as e:  # every later start refuses it at once
            record_failure(self.store.startpoints, e)
            raise

    def _cleanup(self) -> None:
        """Free what this build made: its cached RDDs and side-input broadcasts (the plan's
        components are the run's and outlive a fallback's rebuild: unpersisted only)."""
        self.rdds.unpersist()
        try:
            for bc in self._broadcasts:
                self.plane.release(bc)
            self.ctx.components.unpersist(blocking=False)
        except Exception:  # noqa: BLE001 - best effort on shutdown
            pass
        self._broadcasts = []

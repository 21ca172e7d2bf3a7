"""A streaming pipeline's part of a round: restore, one Spark job over its live stages, metadata.

``PipelineRounds`` is the streaming ``RoundJob`` of ``rounds.loop.RoundLoop`` (which feeds,
absorbs, commits and waits): it fixes each round's watermarks (``watermarks``), runs the stages
data can reach (``round.live_stages``) as one job (``round.RoundBuilder``), and records what the
round left and whether the pipeline is done (``RoundMetadata``). It publishes each committed
round's sink files, and on restore unpublishes those of later rounds. The run's threads,
signals and drain request are ``executor``'s.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import defaultdict

from sparkbeam.checkpoint import state_layout
from sparkbeam.checkpoint.pipeline import PipelineStore
from sparkbeam.runner import progress
from sparkbeam.runner.errors import run_guarded
from sparkbeam.runner.rounds import feed, sink_files
from sparkbeam.runner.rounds.compatibility import restore_latest
from sparkbeam.runner.rounds.context import RunContext
from sparkbeam.runner.rounds.ledger import RoundLedger, RoundMetadata
from sparkbeam.runner.rounds.loop import Opened, RoundLoop
from sparkbeam.runner.rounds.startpoints import open_session
from sparkbeam.runner.spark.labels import job_group, stage_label
from sparkbeam.runner.streaming import pushback as streaming_pushback
from sparkbeam.runner.streaming import test_stream, watermarks
from sparkbeam.runner.streaming.round import RoundBuilder, RoundInputs, live_stages
from sparkbeam.runner.streaming.side_input_store import StreamingSideInputs
from sparkbeam.runner.task.bundle_executor import StageTask
from sparkbeam.sdf.startpoints.session import CONSUMED_METADATA_KEY
from sparkbeam.translation.plan import PipelinePlan

_LOG = logging.getLogger(__name__)


def keyed_parallelism(pipeline_id: str, parallelism: int, max_key_groups: int) -> int:
    """The tasks of a pipeline's shuffled (keyed) stages: the run's parallelism, but at most
    the key groups its state has (a task owns whole key groups; a store keeps its count)."""
    if parallelism <= max_key_groups:
        return parallelism
    _LOG.warning(
        "Pipeline %s: its state has %d key groups, fewer than the parallelism %d; its keyed "
        "stages run %d tasks (a new --checkpoint_dir with a larger --max_key_groups gets more)",
        pipeline_id, max_key_groups, parallelism, max_key_groups,
    )  # fmt: skip
    return max_key_groups


class PipelineRounds:
    """The rounds of one independent pipeline, as the round loop runs them."""

    def __init__(self, ctx: RunContext, pipeline: PipelinePlan, drain) -> None:
        self.ctx, self.plan, self.pipeline = ctx, ctx.plan, pipeline
        self.drain = drain  # the run's ``executor.Drain``
        ids = set(pipeline.stages)
        self.stages = [s for s in self.plan.stages if s.id in ids]
        self.sdf_stages = tuple(s.id for s in self.stages if s.is_sdf_process)
        self.labels = {s.id: stage_label(s) for s in self.stages}
        self.state: PipelineStore = None  # type: ignore[assignment]  # set by open()
        self.parallelism = ctx.parallelism  # of its shuffled stages, set by open()
        self.residuals: dict = {}  # the loop's residual keepers (``feed``), set by opened()
        self.impulse_done = False
        self.group_holds: dict[str, int] = {}
        self.group_keys: dict[str, int] = {}
        self.previous: dict[str, int] = {}  # GroupByKey -> input watermark of last round
        self.stateful: dict[str, dict] = {}  # stateful stage -> keys/timers/hold/watermark
        self.side = StreamingSideInputs(ctx, pipeline.id, self.stages)  # restored by open()
        self.pushed_back: set[str] = set()  # stages with main input held for side inputs
        self.draining = False  # truncate pending restrictions, watermarks at +inf
        self.progress = progress.PipelineProgress(pipeline.id)
        self.group = job_group(self.plan, pipeline.id)
        self.edge_pcollections = {e.pcollection for e in self.plan.edges}
        self._marks: watermarks.RoundWatermarks | None = None  # of the running round
        self._held: set[str] = set()  # stages whose main input the running round held
        self._fed: dict[str, list[bytes]] = {}  # TestStream buffer -> the running round's events
        player = test_stream.player_for(self.plan, ids)
        self.test_stream = test_stream.TestStreamClock(player) if player else None
        self.virtual_time = self.test_stream is not None  # the loop does not wait between rounds
        self.restores_on_open = True  # a round that read a damaged file falls back

    # --- restore -----------------------------------------------------------------------

    def open(self) -> Opened:
        """Start from the pipeline's latest checkpoint, or from nothing."""
        ctx = self.ctx
        if self.state is not None:
            self.state.close()  # drop uncommitted changes of a failed round
        self.state, info, meta = restore_latest(ctx, self.pipeline.id)
        if info is None:  # no checkpoint, or --fresh after a finished job: only its tokens
            meta = {k: v for k, v in (meta or {}).items() if k == CONSUMED_METADATA_KEY}
        self.parallelism = keyed_parallelism(
            self.pipeline.id, ctx.parallelism, self.state.max_key_groups
        )
        restored = RoundMetadata.from_dict(meta)
        self._left(restored)
        if self.test_stream is not None:
            self.test_stream.restore(restored.test_stream)
        self.impulse_done = state_layout.IMPULSE_DONE in self.state.completed()
        self.pushed_back = streaming_pushback.pending(self.state, self.stages)
        self.side.restore(self.state)
        stage_ids = [s.id for s in self.stages]
        if info is not None:  # rounds after the restored one are lost: unpublish their files
            staging = sink_files.recorded_staging_dirs(self.state)
            dirs = sink_files.output_directories(self.plan.components, staging)
            sink_files.unpublish_after(dirs, stage_ids, restored.round_no)
        sink_files.finalize_pending(self.state)  # files of the restored round, if not yet
        for directory in sink_files.recorded_staging_dirs(self.state):  # files no checkpoint names
            sink_files.discard_stage_files(directory, stage_ids)
        # Startpoints fan out from the checkpoint just restored (after a failed round, too).
        session = open_session(
            ctx.store.startpoints, self.plan, self.pipeline.id, meta,
            self.state if info is not None else None, ctx.startpoint_max_age_s,
        )  # fmt: skip
        cid = info.checkpoint_id if info is not None else None
        return Opened(self.state, restored, cid, session)

    def opened(self, loop: RoundLoop, pending: int) -> None:
        self.residuals = loop.residuals
        if loop.checkpoint_id is not None:
            _LOG.debug(
                "Pipeline %s restored checkpoint %d: round %d next, %d residual(s) pending",
                self.pipeline.id, loop.checkpoint_id, loop.round_no, pending,
            )  # fmt: skip
        if not loop.rounds_run and not loop.restores:
            self.progress.opened(self.ctx.url, loop.checkpoint_id, loop.round_no, pending)

    # --- one round -----------------------------------------------------------------------

    def begin_round(self, loop: RoundLoop) -> float:
        """The round's watermarks, fixed from what the previous round left (before the feed
        releases the holds of the residuals it takes); the feed's clock: now, or +inf once a
        drain was asked for (every residual is due, then truncated)."""
        if not self.draining and self.drain.requested():
            self.draining = True
            _LOG.warning("Pipeline %s: draining from round %d", self.pipeline.id, loop.round_no)
        if self.test_stream is not None:  # its next event, if nothing else is due now
            now_ms = self.test_stream.now_ms()
            timer = loop.next_timer_ms
            idle = not self.watermark_moves() and not (timer is not None and timer <= now_ms)
            self._fed = self.test_stream.play(idle, timer)
        self._marks = self._watermarks()
        if self.draining:
            return float("inf")
        return self.test_stream.now_ms() if self.test_stream else time.time() * 1000.0

    def has_input(self, due: dict) -> bool:
        return True  # a streaming round always runs: watermarks and timers move

    def run(self, loop: RoundLoop, due: dict) -> list:
        """The round's live stages as one Spark job; its reports."""
        round_no = loop.round_no
        live = live_stages(
            self.plan, self.stages, due, self.impulse_done, self.group_keys, self.stateful,
            self.pushed_back, self._fed,
        )  # fmt: skip
        builder = RoundBuilder(self.round_inputs(loop, due, live))
        label = f"{self.pipeline.id} round {round_no}: " + "; ".join(
            self.labels[s.id] for s in self.stages if s.id in live
        )
        self.ctx.plane.describe_job(self.group, label)  # the full list; stages: their own
        self.side.begin_round()
        try:
            with self.ctx.plane.call_site(f"{self.pipeline.id} round {round_no}"):
                reports = builder.build(self.side.for_stage)
                collected = run_guarded(None, reports.collect, self.labels.get)
        finally:
            builder.cleanup()
        self._held = set(builder.held)
        return list(collected) + self.side.records  # with the side inputs' keeping tasks'

    def round_inputs(self, loop: RoundLoop, due: dict, live: set[str]) -> RoundInputs:
        """The typed record a round is built from: this pipeline's state as the round starts."""
        ctx = self.ctx
        stages = [s for s in self.stages if s.id in live]
        return RoundInputs(
            ctx=ctx,
            pipeline=self.pipeline.id,
            stages=stages,
            tasks={s.id: self.stage_task(s) for s in stages},
            parallelism=self.parallelism,
            checkpoint_id=loop.checkpoint_id,
            round_no=loop.round_no,
            impulse_done=self.impulse_done,
            marks=self._marks,
            due=due,
            clock_ms=loop.clock_ms,
            previous=self.previous,
            side_values=self.side.values,
            pushed_back=self.pushed_back,
            state=self.state,
            startpoints=loop.startpoints,
            fed=self._fed,
            clock_micros=self._clock_micros(),
        )

    def _clock_micros(self) -> int | None:
        """A TestStream's virtual time for the round's tasks (None: they read the wall clock)."""
        return self.test_stream.position.clock_micros if self.test_stream else None

    def stage_task(self, stage) -> tuple[StageTask, object]:
        """The stage's task and components; draining, SDF stages truncate their restrictions."""
        key, components = self.ctx.plan_key, self.ctx.components
        if self.draining and stage.is_sdf_process:
            key, components, stage = self.drain.stages()[stage.id]
        task = StageTask(key, stage, residual_budget_s=0.0, clock_micros=self._clock_micros())
        return task, components

    # --- the barrier ------------------------------------------------------------------

    def barrier(self, loop: RoundLoop, ledger: RoundLedger) -> RoundMetadata:
        """Staging directories and the Impulse's mark into the state; the round's metadata:
        group and keyed state, residual timers, whether the pipeline is done."""
        for directory in sink_files.staging_dirs(ledger.sink_files):  # cleaned on restore
            sink_files.record_staging_dir(self.state, directory)
        self.state.mark_completed(state_layout.IMPULSE_DONE)
        marks, held = self._marks, self._held
        assert marks is not None  # set when the round was built
        holds: dict[str, int] = {}
        keys: dict[str, int] = defaultdict(int)
        for rec in ledger.groups:
            holds[rec.buffer] = min(holds.get(rec.buffer, watermarks.MAX), rec.hold_micros)
            keys[rec.buffer] += rec.keys
        ran = {r.stage for r in ledger.keyed}
        stateful: dict[str, dict] = {}
        for s in (s for s in self.stages if s.stateful):
            last = self.stateful.get(s.id, {})  # of a stage not run this round: unchanged
            left = {"watermark": marks.stage_input[s.id]} if s.id in ran else last
            stateful[s.id] = {"keys": 0, "timers": 0, "hold": watermarks.MAX, **left}
        for rec in ledger.keyed:
            info = stateful[rec.stage]
            info["keys"] += rec.keys
            info["timers"] += rec.timers
            info["hold"] = min(info["hold"], rec.hold_micros)
        timers = [r.next_processing_ms for r in (*ledger.groups, *ledger.keyed)]
        timers.append(feed.next_fire_ms(self.residuals))
        next_timer_ms = min((t for t in timers if t is not None), default=None)
        pending = feed.pending(self.residuals)
        timers_left = sum(info["timers"] for info in stateful.values())
        commits = zip(ledger.commit_stages, ledger.commits, strict=True)
        holding = [m for stage, m in commits if stage.startswith("hold:")]
        pushback_left = bool(self.pushed_back & held) or any(m.files for m in holding)
        finished = pending == 0 and not any(keys.values()) and not timers_left and not pushback_left
        if self.test_stream is not None:
            finished = self.test_stream.finished(finished)
        return RoundMetadata(
            round_no=loop.round_no,
            pending_residuals=pending,
            next_timer_ms=next_timer_ms,
            group_holds=holds,
            group_keys=dict(keys),
            group_watermarks=marks.group_input,
            stateful=stateful,
            watermark_micros=marks.source(),
            finished=finished,
            test_stream=self.test_stream.position.to_dict() if self.test_stream else None,
            residuals=feed.summaries(self.residuals),
        )

    def committed(self, loop: RoundLoop, ledger: RoundLedger, meta: RoundMetadata) -> None:
        """Publish the round's files; what it left is the next round's starting point."""
        sink_files.finalize_pending(self.state)
        self.side.committed()
        self.impulse_done = True
        self.pushed_back = streaming_pushback.pending(self.state, self.stages)
        self._left(meta)
        infos = (i for v in ledger.metrics.values() for i in v)
        moved = progress.records(infos, self.edge_pcollections)
        self.progress.round_committed(
            loop.round_no, loop.checkpoint_id, moved, meta.pending_residuals, meta.watermark_micros
        )

    def _left(self, meta: RoundMetadata) -> None:
        """What a round left (restored or committed): GroupByKey and stateful stage state."""
        self.group_holds, self.group_keys = meta.group_holds or {}, meta.group_keys
        self.previous, self.stateful = dict(meta.group_watermarks), meta.stateful

    # --- between rounds ---------------------------------------------------------------

    def watermark_moves(self) -> bool:
        marks = self._watermarks()
        groups = any(
            marks.group_input.get(b) != self.previous.get(b)
            for b, keys in self.group_keys.items()
            if keys
        )
        return groups or any(
            marks.stage_input.get(s) != info.get("watermark")
            for s, info in self.stateful.items()
            if info.get("timers")
        )

    def waiting(self, loop: RoundLoop, wait_s: float) -> None:
        pass  # progress lines come with committed rounds

    def ended(self, loop: RoundLoop) -> None:
        how = "finished" if loop.finished else "stopped"
        self.progress.ended(how, loop.checkpoint_id, loop.pending())

    def _watermarks(self) -> watermarks.RoundWatermarks:
        sources = self.test_stream.watermarks(self.draining) if self.test_stream else None
        compute = functools.partial(watermarks.compute, self.plan, self.stages)
        if self.draining:  # every window and event-time timer fires
            return compute(False, {}, {}, sources)
        holds = {
            **{s: info.get("hold") for s, info in self.stateful.items()},
            **{s: k.watermark_hold_micros() for s, k in self.residuals.items()},
        }
        marks = compute(not self.impulse_done, holds, self.group_holds, sources)
        # A stage that holds (or may hold) its main input back until its side inputs are
        # ready holds its output watermark at -inf meanwhile (streaming_pushback).
        waiting = {
            s.id
            for s in self.stages
            if s.id in self.pushed_back
            or (s.side_inputs and not streaming_pushback.ready(s, self.side.values, marks))
        }
        if not waiting:
            return marks
        holds.update({s: watermarks.MIN for s in waiting})
        return compute(not self.impulse_done, holds, self.group_holds, sources)

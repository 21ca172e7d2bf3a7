"""The rounds of one independent pipeline: restore, run a round, commit its checkpoint.

Each round's watermarks are fixed from what the previous round left (see
``watermarks``); only stages some data can reach run (``_live_stages``); the
round's reports are applied and committed as one checkpoint (``_commit``), the
barrier after which its sink files are published. A round that fails beyond
Spark's task retries drops the working state and restores the last checkpoint
(``open``), up to ``--max_restores`` times.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import replace
from typing import Any, NamedTuple

from sparkbeam.checkpoint import state_layout
from sparkbeam.runner import progress
from sparkbeam.runner.errors import StageFailedError, run_guarded
from sparkbeam.runner.faults import crash_point
from sparkbeam.runner.rounds import feed, sink_files
from sparkbeam.runner.rounds.ledger import RoundLedger, RoundMetadata
from sparkbeam.runner.rounds.startpoints import (
    open_session,
    record_failure,
)
from sparkbeam.runner.spark import session_conf
from sparkbeam.runner.spark.filesystem_options import use_in_jobs
from sparkbeam.runner.spark.labels import call_site, describe_job, job_group, stage_label
from sparkbeam.runner.streaming import pushback as streaming_pushback
from sparkbeam.runner.streaming import test_stream, watermarks
from sparkbeam.runner.streaming.round import RoundBuilder, RoundInputs, live_stages
from sparkbeam.runner.task.bundle_executor import StageTask
from sparkbeam.sdf import StateAndTimerBundleCheckpointHandler
from sparkbeam.sdf.startpoints.errors import StartpointFailedError
from sparkbeam.sdf.startpoints.session import CONSUMED_METADATA_KEY, StartpointSession
from sparkbeam.translation.plan import PipelinePlan

_LOG = logging.getLogger(__name__)
IMPULSE_DONE = state_layout.IMPULSE_DONE
SIDE_INPUT_PREFIX = state_layout.SIDE_INPUT_PREFIX
STAGING_DIRS = state_layout.SINK_STAGING_DIRS


class RoundTime(NamedTuple):
    """How long one committed round took: its Spark job, then its checkpoint commit."""

    round_no: int
    started: float  # epoch seconds, when the round's Spark job started
    job_s: float
    commit_s: float


class PipelineLoop:
    """The rounds of one independent pipeline."""

    def __init__(self, executor, pipeline: PipelinePlan) -> None:
        self.ex = executor
        self.plan = executor.plan
        self.pipeline = pipeline
        ids = set(pipeline.stages)
        self.stages = [s for s in self.plan.stages if s.id in ids]
        self.state: Any = None  # the PipelineStore, set by open()
        self.handlers: dict[str, StateAndTimerBundleCheckpointHandler] = {}
        self.round_no = 0
        self.impulse_done = False
        self.group_holds: dict[str, int] = {}
        self.group_keys: dict[str, int] = {}
        self.previous: dict[str, int] = {}  # GroupByKey -> input watermark of last round
        self.stateful: dict[str, dict] = {}  # stateful stage -> keys/timers/hold/watermark
        self.checkpoint_id: int | None = None
        self.side_values: dict[str, list[bytes]] = defaultdict(list)
        self.restores = 0  # restores after a failure (not the restore at start)
        self.rounds_run = 0
        self.finished = False
        self.next_timer_ms: float | None = None
        self.startpoints: StartpointSession | None = None  # this run's, made by open()
        self.pushed_back: set[str] = set()  # stages with main input held for side inputs
        self.draining = False  # truncate pending restrictions, watermarks at +inf
        self.round_times: list[RoundTime] = []  # every committed round of this run
        self.progress = progress.PipelineProgress(pipeline.id)
        self.group = job_group(self.plan, pipeline.id)
        self.edge_pcollections = {e.pcollection for e in self.plan.edges}
        self.player = test_stream.player_for(self.plan, ids)  # its TestStream, if it reads one
        self.position = test_stream.Position()
        self._played_out = False  # the TestStream is over and nothing is left to do

    # --- lifecycle -------------------------------------------------------------

    def run(self) -> None:
        pool = session_conf.scheduler_pool(self.ex.sc)
        if pool:  # every pipeline's rounds share sparkbeam's declared FAIR pool
            self.ex.sc.setLocalProperty("spark.scheduler.pool", pool)
        use_in_jobs(self.ex.sc, self.ex.filesystem_options)  # s3://... options in every task
        self.open()
        self.progress.opened(self.ex.url, self.checkpoint_id, self.round_no, self._pending())
        while not self.finished and not self.ex.stop.is_set():
            started = time.monotonic()
            if not self.draining and self.ex.draining():
                self.draining = True
                _LOG.warning("Pipeline %s: draining from round %d", self.pipeline.id, self.round_no)
            try:
                self.run_round()
            except StartpointFailedError as e:  # restoring cannot help: mark it, fail the run
                record_failure(self.ex.store.startpoints, e)
                raise
            except StageFailedError as e:
                self.restores += 1
                if self.restores > self.ex.max_restores:
                    raise
                _LOG.warning(
                    "Pipeline %s: round %d failed (%s); restoring its last checkpoint "
                    "(restore %d of at most %d). Other pipelines keep running.",
                    self.pipeline.id, self.round_no, e.stage, self.restores, self.ex.max_restores,
                )  # fmt: skip
                self.open()
                continue
            if not self.finished and self.player is None:  # a TestStream's rounds do not wait
                self._pause(started)
        how = "finished" if self.finished else "stopped"
        self.progress.ended(how, self.checkpoint_id, self._pending())

    def _pending(self) -> int:
        return feed.pending(self.handlers)

    def open(self) -> None:
        """Start from the pipeline's latest checkpoint, or from nothing."""
        if self.state is not None:
            self.state.close()  # drop uncommitted changes of a failed round
        self.state = self.ex.store.pipeline(self.pipeline.id)
        info = self.ex.guard.restore(self.state, self.ex.store)  # refuses incompatible changes
        meta = {}
        if info is not None:
            meta = self.ex.store.load_manifest(self.pipeline.id, info.checkpoint_id).metadata
            if meta.get(state_layout.FINISHED):
                _LOG.info("Pipeline %s had finished; running it again", self.pipeline.id)
                self.state.close()
                self.state = self.ex.store.pipeline(self.pipeline.id)
                info, meta = None, {k: v for k, v in meta.items() if k == CONSUMED_METADATA_KEY}
        self.checkpoint_id = info.checkpoint_id if info is not None else None
        restored = RoundMetadata.from_dict(meta)
        self.round_no = restored.round_no + 1
        self.group_holds = restored.group_holds or {}
        self.group_keys = restored.group_keys
        self.previous = restored.group_watermarks
        self.stateful = restored.stateful
        self.next_timer_ms = restored.next_timer_ms
        self.position = test_stream.Position.from_dict(restored.test_stream)
        self._played_out = False
        self.impulse_done = IMPULSE_DONE in self.state.completed()
        self._scan_pushback()
        self.handlers = {
            s.id: StateAndTimerBundleCheckpointHandler(self.state, s.id)
            for s in self.stages
            if s.is_sdf_process
        }
        pending = sum(h.restore() for h in self.handlers.values())
        stored: dict[str, list[tuple[bytes, bytes]]] = defaultdict(list)
        for ns, key, value in self.state.items():
            if ns.startswith(SIDE_INPUT_PREFIX):
                stored[ns[len(SIDE_INPUT_PREFIX) :]].append((key, value))
        self.side_values = defaultdict(
            list, {b: [v for _, v in sorted(kv)] for b, kv in stored.items()}
        )
        if info is not None:
            _LOG.debug(
                "Pipeline %s restored checkpoint %d: round %d next, %d residual(s) pending",
                self.pipeline.id, info.checkpoint_id, self.round_no, pending,
            )  # fmt: skip
        stage_ids = [s.id for s in self.stages]
        if info is not None:  # rounds after the restored one are lost: unpublish their files
            staging = [d.decode() for _, d, _ in self.state.items(STAGING_DIRS)]
            dirs = sink_files.output_directories(self.plan.components, staging)
            sink_files.unpublish_after(dirs, stage_ids, self.round_no - 1)
        sink_files.finalize_pending(self.state)  # files of the restored round, if not yet
        for _, directory, _ in self.state.items(STAGING_DIRS):  # files no checkpoint names
            sink_files.discard_stage_files(directory.decode(), stage_ids)
        # Startpoints fan out from the checkpoint just restored (after a failed round, too).
        self.startpoints = open_session(
            self.ex.store.startpoints, self.plan, self.pipeline.id, meta,
            self.state if info is not None else None, self.ex.startpoint_max_age_s,
        )  # fmt: skip

    def _pause(self, started: float) -> None:
        """Wait for the next round: the interval, or longer if nothing is due sooner."""
        earliest = started + self.ex.interval_s
        if self.next_timer_ms is None or self._watermark_moves():
            wake = earliest
        else:
            due = self.next_timer_ms / 1000.0 - time.time() + time.monotonic()
            wake = max(earliest, due)
        self.ex.stop.wait(max(0.0, wake - time.monotonic()))

    def _scan_pushback(self) -> None:
        """Which stages have main input pushed back (only stages with side inputs can)."""
        self.pushed_back = set()
        if any(s.side_inputs for s in self.stages):
            self.pushed_back = set(streaming_pushback.pending(self.state))

    def _watermark_moves(self) -> bool:
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

    def _watermarks(self) -> watermarks.RoundWatermarks:
        if self.draining:  # every window and event-time timer fires
            ended = replace(self.position, exhausted=True)
            sources = self.player.watermarks(ended) if self.player else None
            return watermarks.compute(self.plan, self.stages, False, {}, {}, sources)
        sources = self.player.watermarks(self.position) if self.player else None
        holds = {
            **{s: info.get("hold") for s, info in self.stateful.items()},
            **{s: h.watermark_hold_micros() for s, h in self.handlers.items()},
        }
        marks = watermarks.compute(
            self.plan, self.stages, not self.impulse_done, holds, self.group_holds, sources
        )
        # A stage that holds (or may hold) its main input back until its side inputs are
        # ready holds its output watermark at -inf meanwhile (streaming_pushback).
        waiting = {
            s.id
            for s in self.stages
            if s.id in self.pushed_back
            or (s.side_inputs and not streaming_pushback.ready(s, self.side_values, marks))
        }
        if not waiting:
            return marks
        holds.update({s: watermarks.MIN for s in waiting})
        return watermarks.compute(
            self.plan, self.stages, not self.impulse_done, holds, self.group_holds, sources
        )

    # --- one round -------------------------------------------------------------

    def run_round(self) -> None:
        sc, r = self.ex.sc, self.round_no
        fed = self._play()  # a TestStream's next event, when the pipeline is idle
        marks = self._watermarks()
        now_ms = float("inf") if self.draining else self._now_ms()
        due = feed.pop_due(self.handlers, now_ms)
        live = live_stages(
            self.plan, self.stages, due, self.impulse_done, self.group_keys, self.stateful,
            self.pushed_back, fed,
        )  # fmt: skip
        builder = RoundBuilder(self.round_inputs(marks, due, live, fed))
        labels = {s.id: stage_label(s) for s in self.stages}
        label = f"{self.pipeline.id} round {r}: " + "; ".join(
            labels[s.id] for s in self.stages if s.id in live
        )
        describe_job(sc, self.group, label)
        try:
            with call_site(sc, label):
                reports = builder.build(self._side_inputs)
                started, t0 = time.time(), time.monotonic()
                collected = run_guarded(None, reports.collect, labels.get)
            t1 = time.monotonic()
            crash_point("mid-round", r)
            self._commit(collected, marks, builder.held)
            self.round_times.append(RoundTime(r, started, t1 - t0, time.monotonic() - t1))
            _LOG.debug("%s round %d: Spark job %.3fs", self.pipeline.id, r, t1 - t0)
        finally:
            builder.cleanup()

    def _now_ms(self) -> float:
        """Processing time: a TestStream's virtual clock, else the wall clock."""
        if self.player is not None:
            return self.position.clock_micros / 1000.0
        return time.time() * 1000.0

    def _clock_micros(self) -> int | None:
        return self.position.clock_micros if self.player is not None else None

    def _play(self) -> dict[str, list[bytes]]:
        """Apply the TestStream's next event if nothing is left to do at the current time.

        Played out, the clock jumps to the next timer; with none, the pipeline is done."""
        if self.player is None:
            return {}
        idle = not self._watermark_moves() and not (
            self.next_timer_ms is not None and self.next_timer_ms <= self._now_ms()
        )
        step = self.player.step(self.position, idle)
        if idle and step.position == self.position and self.position.exhausted:
            if self.next_timer_ms is None:
                self._played_out = True
            micros = None if self.next_timer_ms is None else self.next_timer_ms * 1000.0
            self.position = test_stream.jump_clock(self.position, micros)
        else:
            self.position = step.position
        return step.elements

    def round_inputs(self, marks, due: dict, live: set[str], fed=None) -> RoundInputs:
        """The typed record a round is built from: this loop's state as the round starts."""
        stages = [s for s in self.stages if s.id in live]
        return RoundInputs(
            sc=self.ex.sc,
            plan=self.plan,
            pipeline=self.pipeline.id,
            stages=stages,
            tasks={s.id: self.stage_task(s) for s in stages},
            url=self.ex.url,
            plan_key=self.ex.plan_key,
            components=self.ex.components,
            parallelism=self.ex.parallelism,
            max_key_groups=self.state.max_key_groups,
            checkpoint_id=self.checkpoint_id,
            round_no=self.round_no,
            impulse_done=self.impulse_done,
            marks=marks,
            due=due,
            previous=self.previous,
            side_values=self.side_values,
            pushed_back=self.pushed_back,
            state=self.state,
            startpoints=self.startpoints,
            fed=fed or {},
            clock_micros=self._clock_micros(),
        )

    def stage_task(self, stage) -> tuple[StageTask, object]:
        """The stage's task and components; draining, SDF stages truncate their restrictions."""
        if self.draining and stage.is_sdf_process:
            key, components, drained = self.ex.drain_stages[stage.id]
            task = StageTask(key, drained, residual_budget_s=0.0, clock_micros=self._clock_micros())
            return task, components
        task = StageTask(
            self.ex.plan_key, stage, residual_budget_s=0.0, clock_micros=self._clock_micros()
        )
        return task, self.ex.components

    def _side_inputs(self, stage, edges) -> dict:
        """Side inputs accumulate over rounds (and are kept in the store for restores)."""
        values = {}
        for si in stage.side_inputs:
            if si.buffer not in edges.side_inputs_read:  # once per round, however many readers
                edges.side_inputs_read.add(si.buffer)
                new = run_guarded(stage.id, edges.read(si.buffer, None).collect)
                for i, chunk in enumerate(new):
                    key = f"{self.round_no:010d}/{i:08d}".encode()
                    self.state.put(state_layout.side_input(si.buffer), key, chunk)
                self.side_values[si.buffer].extend(new)
            values[si.buffer] = list(self.side_values[si.buffer])
        return values

    def _commit(self, reports: list, marks: watermarks.RoundWatermarks, held=()) -> None:
        """The round barrier: absorb every report into the ledger, then commit one checkpoint."""
        ledger = RoundLedger().absorb(reports)
        for directory in sink_files.staging_dirs(ledger.sink_files):  # cleaned on restore
            self.state.put(STAGING_DIRS, directory.encode(), b"")
        for stage, records in ledger.residuals.items():
            self.handlers[stage].add(records)
        self.state.mark_completed(IMPULSE_DONE)
        meta = self._round_metadata(ledger, marks, held)
        self.finished, self.next_timer_ms = meta.finished, meta.next_timer_ms
        cid = ledger.commit(  # startpoints this round consumed are deleted once it commits
            self.state,
            self.startpoints,
            meta,
            fingerprint=self.plan.fingerprint,
            parallelism=self.ex.parallelism,
            plan_metadata=self.ex.guard.metadata(self.pipeline.id),
        )
        # Committed: the round is real. Apply it to the loop and publish its files.
        crash_point("after-commit", self.round_no)
        sink_files.finalize_pending(self.state)
        self.checkpoint_id = int(cid)
        self.impulse_done = True
        self._scan_pushback()
        self.group_holds, self.group_keys = meta.group_holds or {}, meta.group_keys
        self.previous = dict(marks.group_input)
        self.stateful = meta.stateful
        for stage, stage_infos in ledger.metrics.items():
            self.ex.add_metrics(stage, stage_infos)
        self.rounds_run += 1
        infos = (i for v in ledger.metrics.values() for i in v)
        moved = progress.records(infos, self.edge_pcollections)
        pending = meta.pending_residuals
        self.progress.round_committed(self.round_no, int(cid), moved, pending, marks.source())
        self.round_no += 1

    def _round_metadata(self, ledger: RoundLedger, marks, held) -> RoundMetadata:
        """What this round leaves: group and keyed state, residual timers, whether it is done."""
        holds: dict[str, int] = {}
        keys: dict[str, int] = defaultdict(int)
        for rec in ledger.groups:
            holds[rec.buffer] = min(holds.get(rec.buffer, watermarks.MAX), rec.hold_micros)
            keys[rec.buffer] += rec.keys
        stateful: dict[str, dict] = {
            s.id: {"keys": 0, "timers": 0, "hold": watermarks.MAX}
            for s in self.stages
            if s.stateful
        }
        for rec in ledger.keyed:
            info = stateful[rec.stage]
            info["keys"] += rec.keys
            info["timers"] += rec.timers
            info["hold"] = min(info["hold"], rec.hold_micros)
        ran = {r.stage for r in ledger.keyed}
        for stage_id, info in stateful.items():
            if stage_id not in ran:  # not run this round: nothing changed
                info.update(self.stateful.get(stage_id, {}))
            else:
                info["watermark"] = marks.stage_input[stage_id]
        timers = [r.next_processing_ms for r in (*ledger.groups, *ledger.keyed)]
        timers.append(feed.next_fire_ms(self.handlers))
        next_timer_ms = min((t for t in timers if t is not None), default=None)
        pending = feed.pending(self.handlers)
        timers_left = sum(info["timers"] for info in stateful.values())
        holding = [
            m for st, m in zip(ledger.commit_stages, ledger.commits, strict=True)
            if st.startswith("hold:")
        ]  # fmt: skip
        pushback_left = bool(self.pushed_back & set(held)) or any(m.files for m in holding)
        finished = pending == 0 and not any(keys.values()) and not timers_left and not pushback_left
        if self.player is not None:  # a TestStream ends when played out, or with nothing to do
            finished = (finished and self.position.exhausted) or self._played_out
        return RoundMetadata(
            round_no=self.round_no,
            pending_residuals=pending,
            next_timer_ms=next_timer_ms,
            group_holds=holds,
            group_keys=dict(keys),
            group_watermarks=marks.group_input,
            stateful=stateful,
            watermark_micros=marks.source(),
            finished=finished,
            test_stream=self.position.to_dict() if self.player is not None else None,
        )

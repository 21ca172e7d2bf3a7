"""The one round loop of batch SDF stages and streaming pipelines.

``RoundLoop`` owns the round number, the SDF stages' residual keepers (``feed``), the ledger,
the commit, the last rounds' times and the wait between rounds. A round that fails beyond
Spark's task retries restores the last checkpoint, up to ``RunContext.max_restores`` times
(batch: none); one whose task found a file of its checkpoint damaged restores the newest sound
checkpoint instead (``checkpoint.restore.fall_back``). Batch ends the loop when nothing is
pending; streaming when its inputs end, or it is stopped or drained. What differs per side is
a ``RoundJob``: ``batch.stage_rounds.StageRounds``, ``streaming.pipeline.PipelineRounds``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from sparkbeam.checkpoint import restore
from sparkbeam.runner.errors import UNKNOWN_STAGE, DamagedStateError, StageFailedError
from sparkbeam.runner.faults import crash_point
from sparkbeam.runner.rounds import feed
from sparkbeam.runner.rounds.context import RunContext
from sparkbeam.runner.rounds.ledger import RoundLedger, RoundMetadata
from sparkbeam.runner.rounds.startpoints import record_failure
from sparkbeam.sdf.startpoints.errors import StartpointFailedError
from sparkbeam.sdf.startpoints.session import StartpointSession
from sparkbeam.translation.plan import PipelinePlan

_LOG = logging.getLogger(__name__)

TIMER_SLACK_S = 0.02
"""A round woken by a timer starts this much after it, so timers set for one moment by tasks
that each computed it from their own clock (a few ms apart: a Kafka read's caught-up partitions
aim at the same wall-clock tick) fire in one round, not in one round and another an interval
later."""

ROUND_TIMES_KEPT = 10_000  # committed rounds whose times a loop keeps (benchmarks read them)


class RoundTime(NamedTuple):
    """How long one committed round took: its Spark job, then its checkpoint commit."""

    round_no: int
    started: float  # epoch seconds, when the round's Spark job started
    job_s: float
    commit_s: float


@dataclass(frozen=True)
class Opened:
    """Where a job (re)starts: its state and the record of the checkpoint it restored."""

    state: Any  # the pipeline's PipelineStore
    metadata: RoundMetadata  # of the restored checkpoint; round_no -1 when none
    checkpoint_id: int | None
    startpoints: StartpointSession | None
    input_done: bool = False  # batch: a committed round consumed the stage's input


class RoundJob(Protocol):
    """What one side's round is: its input, its one Spark job, what its checkpoint records."""

    pipeline: PipelinePlan
    sdf_stages: tuple[str, ...]  # stages whose residuals the loop keeps
    virtual_time: bool  # the job keeps its own clock (a TestStream): no waiting between rounds
    restores_on_open: bool  # open() restores the latest checkpoint (streaming; batch: before)

    def open(self) -> Opened:
        """Restore the latest checkpoint (again after a failed round)."""

    def opened(self, loop: RoundLoop, pending: int) -> None:
        """After ``open``, with the residual keepers restored: the job's own bookkeeping."""

    def begin_round(self, loop: RoundLoop) -> float:
        """Fix what the round starts from, before the feed takes residuals (and their
        watermark holds) away; returns the feed's clock in ms (+inf: everything is due)."""

    def has_input(self, due: dict[str, feed.Due | None]) -> bool:
        """Whether a round with these due residuals has anything to run."""

    def run(self, loop: RoundLoop, due: dict[str, feed.Due | None]) -> list:
        """Run round ``loop.round_no`` as one Spark job; its tasks' reports."""

    def barrier(self, loop: RoundLoop, ledger: RoundLedger) -> RoundMetadata:
        """The round's own marks in the state, and the metadata its checkpoint records."""

    def committed(self, loop: RoundLoop, ledger: RoundLedger, meta: RoundMetadata) -> None:
        """The round is real: apply it to the job (publish, carry state to the next round)."""

    def watermark_moves(self) -> bool:
        """Whether the next round has work before the earliest timer (streaming watermarks)."""

    def waiting(self, loop: RoundLoop, wait_s: float) -> None:
        """The loop sleeps ``wait_s`` until its next round."""

    def ended(self, loop: RoundLoop) -> None:
        """The loop ended (finished or stopped)."""


class RoundLoop:
    """The rounds of one job, each one checkpoint, until nothing is pending or it is stopped."""

    def __init__(self, job: RoundJob, ctx: RunContext) -> None:
        self.job, self.ctx = job, ctx
        self.pipeline = job.pipeline
        self.state: Any = None  # the PipelineStore, from the job's open()
        self.startpoints: StartpointSession | None = None
        self.residuals: dict[str, feed.Keeper] = {}  # SDF stage -> its residuals' keeper
        self.clock_ms = 0.0  # the feed's clock of the round being run
        self.round_no = 0
        self.checkpoint_id: int | None = None
        self.next_timer_ms: float | None = None
        self.finished = False
        self.restores = 0  # restores after a failure (not the restore at start)
        self.rounds_run = 0
        # The last committed rounds of this run (bounded: a job may run for months).
        self.round_times: deque[RoundTime] = deque(maxlen=ROUND_TIMES_KEPT)

    def run(self) -> None:
        """Open, then round after round; a failed round restores the last checkpoint."""
        self.open()
        while not self.finished and not self.ctx.stop.is_set():
            started = time.monotonic()
            try:
                self.run_round()
            except StartpointFailedError as e:  # restoring cannot help: mark it, fail the run
                record_failure(self.ctx.store.startpoints, e)
                raise
            except StageFailedError as e:
                if isinstance(e, DamagedStateError) and self.fall_back(e):
                    continue  # a sound checkpoint restored: not a retry of the damaged one
                self.restores += 1
                if self.restores > self.ctx.max_restores:
                    raise
                _LOG.warning(
                    "%s -- round %d of pipeline %s failed%s; restoring %s (restore %d of at "
                    "most %d); other pipelines keep running.",
                    e.cause, self.round_no, self.pipeline.id, _where(e), _checkpoint(self),
                    self.restores, self.ctx.max_restores,
                )  # fmt: skip
                self.open()
                continue
            if not self.finished and not self.job.virtual_time:
                self.wait(started)
        self.job.ended(self)

    def fall_back(self, e: DamagedStateError) -> bool:
        """Restore the newest sound checkpoint (`restore.fall_back`); False when this job does
        not restore on open, or the checkpoint is sound after all."""
        if not (self.ctx.durable and self.job.restores_on_open):
            return False
        cause = f"{e.cause} -- round {self.round_no} of pipeline {self.pipeline.id}"
        if restore.fall_back(self.ctx.store, self.pipeline.id, cause) is None:
            return False
        self.open()
        return True

    def open(self) -> None:
        """Start from the job's latest checkpoint: its state, residuals and round number."""
        opened = self.job.open()
        self.state, self.startpoints = opened.state, opened.startpoints
        self.checkpoint_id = opened.checkpoint_id
        self.round_no = opened.metadata.round_no + 1
        self.residuals = feed.keepers(
            self.job.sdf_stages, self.ctx.durable, opened.metadata, self.state
        )
        pending = feed.pending(self.residuals)
        self.next_timer_ms = feed.next_fire_ms(self.residuals)
        self.finished = opened.input_done and not pending
        self.job.opened(self, pending)

    def run_round(self) -> None:
        """Feed what is due, one Spark job, its reports into one ledger, one checkpoint."""
        r = self.round_no
        # 1. Feed what is due.
        self.clock_ms = self.job.begin_round(self)
        due = feed.take_due(self.residuals, self.clock_ms)
        if not self.job.has_input(due):
            return  # woken before the timer: nothing to run yet
        # 2. Run one Spark job.
        started, t0 = time.time(), time.monotonic()
        reports = self.job.run(self, due)
        t1 = time.monotonic()
        crash_point("mid-round", r)
        # 3. Absorb its typed reports into one ledger; residuals to their stage's keeper.
        ledger = RoundLedger().absorb(reports)
        for keeper in self.residuals.values():
            keeper.absorb(ledger)
        # 4. Commit one checkpoint (without a store: advance in memory).
        meta = self.job.barrier(self, ledger)
        self.commit(ledger, meta)
        crash_point("after-commit", r)
        # 5. The round is real: the job, the metrics and the loop move on.
        self.finished, self.next_timer_ms = meta.finished, meta.next_timer_ms
        for stage, infos in ledger.metrics.items():
            self.ctx.metrics.add(stage, infos)
        self.job.committed(self, ledger, meta)
        self.rounds_run += 1
        self.round_times.append(RoundTime(r, started, t1 - t0, time.monotonic() - t1))
        _LOG.debug("%s round %d: Spark job %.3fs", self.pipeline.id, r, t1 - t0)
        self.round_no += 1

    def commit(self, ledger: RoundLedger, meta: RoundMetadata) -> None:
        """One checkpoint of the round's state; without a store, the round stays in memory."""
        if not self.ctx.durable:
            return
        cid = ledger.commit(  # startpoints this round consumed are deleted once it commits
            self.state,
            self.startpoints,
            meta,
            fingerprint=self.ctx.plan.fingerprint,
            parallelism=self.ctx.parallelism,
            plan_metadata=self.ctx.guard.metadata(self.pipeline.id),
        )
        self.checkpoint_id = int(cid)

    def pending(self) -> int:
        return feed.pending(self.residuals)

    def wait(self, started: float) -> None:
        """Until work is due: at once when a watermark moved, else at the earliest timer; with
        neither, one interval after this round started."""
        if self.job.watermark_moves():
            wake = time.monotonic()
        elif self.next_timer_ms is not None:
            wake = self.next_timer_ms / 1000.0 - time.time() + time.monotonic() + TIMER_SLACK_S
        else:
            wake = started + self.ctx.interval_s
        wait_s = max(0.0, wake - time.monotonic())
        self.job.waiting(self, wait_s)
        self.ctx.stop.wait(wait_s)


def _where(e: StageFailedError) -> str:
    if e.transform:
        return f" in {e.transform!r} (stage {e.stage})"
    return "" if e.stage == UNKNOWN_STAGE else f" in stage {e.stage}"


def _checkpoint(loop: RoundLoop) -> str:
    cid = loop.checkpoint_id
    return "its start (no checkpoint yet)" if cid is None else f"checkpoint {cid}"

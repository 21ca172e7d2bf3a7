"""A batch SDF stage's part of a round: its input first, then its due residuals.

``StageRounds`` is the batch ``RoundJob`` of ``sparkbeam.runner.rounds.loop.RoundLoop``.
Round 0 runs the stage over its input; each later round over the residuals due by then, kept
as state + a timer by the tasks in their key groups with a store (``task.residual_state``),
by the driver without (``rounds.feed``). Between rounds the loop sleeps until the earliest
timer, without polling. Every round's output RDD is kept for the stage's consumers.

A resumed stage starts from its committed output chunks and pending residuals, at the round
its restored ``RoundMetadata`` names.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from sparkbeam.checkpoint import state_layout
from sparkbeam.runner.batch.stage_rdd import StageRdds
from sparkbeam.runner.errors import run_guarded
from sparkbeam.runner.rounds import feed
from sparkbeam.runner.rounds.context import RunContext
from sparkbeam.runner.rounds.ledger import RoundLedger, RoundMetadata
from sparkbeam.runner.rounds.loop import Opened, RoundLoop
from sparkbeam.runner.task.records import is_report
from sparkbeam.translation.plan import StagePlan

_LOG = logging.getLogger(__name__)


class StageRounds:
    """The rounds of one SDF stage; ``outputs`` holds every round's RDD for its consumers."""

    def __init__(
        self,
        ctx: RunContext,
        rdds: StageRdds,
        stage: StagePlan,
        side_bc,
        state,
        input_rdd,
        restored_metadata: dict[str, Any] | None = None,
    ) -> None:
        """``input_rdd`` None: resume (a committed round consumed the input)."""
        self.ctx, self.rdds, self.stage = ctx, rdds, stage
        self.pipeline = next(p for p in ctx.plan.pipelines if p.id == stage.pipeline)
        self.sdf_stages = (stage.id,)
        self.virtual_time = False  # batch rounds wait for their residuals on the wall clock
        self.restores_on_open = False  # the executor restores, once, before any stage
        self.side_bc, self.state, self.input = side_bc, state, input_rdd
        self.restored = RoundMetadata.from_dict(restored_metadata or {})
        self.outputs: list = []  # every round's output RDD (and the restored chunks)
        self.sink_files: list[tuple[str, str]] = []  # (staged, final) of every round
        self.resumed: int | None = None  # residuals pending when the stage resumed

    def open(self) -> Opened:
        resume = self.input is None
        if resume and state_layout.stage_output(self.stage.id) in self.state.namespaces():
            self.outputs.append(self.rdds.restored_outputs(self.stage, self.restored_round()))
        metadata = RoundMetadata(self.restored_round() if resume else -1, 0, None)
        metadata.residuals = self.restored.residuals if resume else {}
        session = self.rdds.startpoints.get(self.stage.pipeline)
        return Opened(self.state, metadata, None, session, input_done=resume)

    def restored_round(self) -> int:
        """The last committed round of this stage (-1: none)."""
        return self.restored.round_no if self.restored.stage == self.stage.id else -1

    def opened(self, loop: RoundLoop, pending: int) -> None:
        if self.input is None:
            self.resumed = pending

    def begin_round(self, loop: RoundLoop) -> float:
        return time.time() * 1000.0

    def has_input(self, due: dict) -> bool:
        return self.input is not None or due[self.stage.id] is not None

    def run(self, loop: RoundLoop, due: dict) -> list:
        """Round 0 over the stage's input, later rounds over its due residuals."""
        input_rdd, self.input = self.input, None
        rows = due[self.stage.id].rows if due[self.stage.id] else ()
        if rows:  # the driver keeps them (no store)
            input_rdd = self.ctx.plane.parallelize(rows, min(self.ctx.parallelism, len(rows)))
        label = f"{self.rdds.labels[self.stage.id]} (round {loop.round_no})"
        self.ctx.plane.describe_job(self.rdds.group, label)
        with self.ctx.plane.call_site(label):
            rdd = self.rdds.build(
                self.stage, input_rdd, self.side_bc, loop.round_no, clock_ms=loop.clock_ms
            )
            action = rdd.filter(is_report).collect
            reports = run_guarded(self.stage.id, action, self.rdds.labels.get)
        self.outputs.append(rdd)
        return reports

    def barrier(self, loop: RoundLoop, ledger: RoundLedger) -> RoundMetadata:
        """The input is consumed; the metadata names the stage, its round and its residuals."""
        keeper = loop.residuals[self.stage.id]
        if self.ctx.durable:
            self.state.mark_completed(state_layout.input_marker(self.stage.id))
        return RoundMetadata(
            round_no=loop.round_no,
            pending_residuals=keeper.pending(),
            next_timer_ms=keeper.next_fire_ms(),
            stage=self.stage.id,
            watermark_hold_micros=keeper.watermark_hold_micros(),
            finished=not keeper.pending(),
            residuals=feed.summaries(loop.residuals),
        )

    def committed(self, loop: RoundLoop, ledger: RoundLedger, meta: RoundMetadata) -> None:
        self.sink_files.extend(ledger.sink_files)  # renamed when the run succeeds

    def watermark_moves(self) -> bool:
        return False  # a batch stage's next round waits for its residuals' timers only

    def waiting(self, loop: RoundLoop, wait_s: float) -> None:
        if wait_s <= 0:
            return
        keeper = loop.residuals[self.stage.id]
        hold = keeper.watermark_hold_micros()
        parts = [
            f"sparkbeam {self.stage.id}: round {loop.round_no}",
            f"{keeper.pending()} residual(s) pending",
            f"{keeper.fired} re-fed",
            f"next timer in {wait_s * 1000:.0f} ms",
        ]
        if hold is not None:
            parts.append(f"watermark hold {hold / 1e6:.3f}s")
        _LOG.info("%s", ", ".join(parts))

    def ended(self, loop: RoundLoop) -> None:
        pass  # the run reports when every stage is done (``progress.batch_done``)

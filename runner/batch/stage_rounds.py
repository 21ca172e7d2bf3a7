"""The round clock of one batch SDF stage: which round is next, and what it feeds back.

Round 0 processes the stage's input. Each residual a task returns goes to the
stage's ``StateAndTimerBundleCheckpointHandler`` (durable state + a timer).
Between rounds the driver sleeps until the earliest timer — no polling, no
CPU — then feeds the due residuals back to the same stage as a new Spark job
(Approach 1 of seed 003). The batch loop (``PlanExecutor._run_in_rounds``) ends
when nothing is pending; the round itself (one job, one ledger, one commit) is
the executor's ``_run_round``.
"""

from __future__ import annotations

import logging
import time

from sparkbeam.runner.rounds import feed
from sparkbeam.sdf import StateAndTimerBundleCheckpointHandler
from sparkbeam.translation.plan import StagePlan

_LOG = logging.getLogger(__name__)


class StageRounds:
    """Round numbers and due residuals of one SDF stage (no Spark job runs here)."""

    def __init__(
        self, stage: StagePlan, handler: StateAndTimerBundleCheckpointHandler, first_round: int
    ) -> None:
        self.stage = stage
        self.handler = handler
        self.round_no = first_round

    def pending(self) -> bool:
        return bool(self.handler.pending())

    def due_rows(self) -> list[tuple[str, bytes]]:
        """Sleep until the earliest timer, then the rows of the residuals due (maybe none)."""
        wait = feed.seconds_until(self.handler.next_fire_ms())
        if wait > 0:
            _LOG.info("%s", self.progress_line(wait))
            time.sleep(wait)
        return feed.due_rows(feed.pop_due({self.stage.id: self.handler})[self.stage.id])

    def progress_line(self, wait_s: float | None = None) -> str:
        hold = self.handler.watermark_hold_micros()
        parts = [
            f"sparkbeam {self.stage.id}: round {self.round_no}",
            f"{self.handler.pending()} residual(s) pending",
            f"{self.handler.fired} re-fed",
        ]
        if wait_s is not None:
            parts.append(f"next timer in {wait_s * 1000:.0f} ms")
        if hold is not None:
            parts.append(f"watermark hold {hold / 1e6:.3f}s")
        return ", ".join(parts)

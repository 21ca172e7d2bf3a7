"""Run one stage in rounds until no residual is pending (batch SDF support).

Round 0 processes the stage's input. Each residual a task returns goes to the
stage's ``StateAndTimerBundleCheckpointHandler`` (durable state + a timer).
Between rounds the driver sleeps until the earliest timer — no polling, no
CPU — then feeds the due residuals back to the same stage as a new Spark job
(Approach 1 of seed 003). The end of each round is a consistent cut: with a
checkpoint store configured, the pipeline's state is committed there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sparkbeam.sdf import StateAndTimerBundleCheckpointHandler
from sparkbeam.translation.plan import StagePlan

_LOG = logging.getLogger(__name__)

MAX_RESIDUALS_PER_ROUND = 50_000


class StageRounds:
    """The round loop of one stage; ``launch(rdd, round)`` runs one Spark job."""

    def __init__(
        self,
        sc,
        stage: StagePlan,
        handler: StateAndTimerBundleCheckpointHandler,
        parallelism: int,
        launch: Callable,
        on_round_end: Callable[[int], None] = lambda n: None,
    ) -> None:
        self.sc = sc
        self.stage = stage
        self.handler = handler
        self.parallelism = parallelism
        self.launch = launch
        self.on_round_end = on_round_end
        self.rounds = 0

    def run(self, input_rdd, first_round: int = 0) -> list:
        rdds = []
        self.rounds = first_round
        if input_rdd is not None:
            rdds.append(self.launch(input_rdd, self.rounds))
            self._end_round()
        while self.handler.pending():
            self._sleep_until_due()
            due = self.handler.pop_due(time.time() * 1000.0, MAX_RESIDUALS_PER_ROUND)
            if not due:
                continue
            rows = [(d.transform, d.element) for d in due]
            rdd = self.sc.parallelize(rows, max(1, min(self.parallelism, len(rows))))
            rdds.append(self.launch(rdd, self.rounds))
            self._end_round()
        return rdds

    def _end_round(self) -> None:
        self.on_round_end(self.rounds)
        self.rounds += 1

    def _sleep_until_due(self) -> None:
        next_ms = self.handler.next_fire_ms()
        if next_ms is None:
            return
        wait = next_ms / 1000.0 - time.time()
        if wait > 0:
            _LOG.info("%s", self.progress_line(wait))
            time.sleep(wait)

    def progress_line(self, wait_s: float | None = None) -> str:
        hold = self.handler.watermark_hold_micros()
        parts = [
            f"sparkbeam {self.stage.id}: round {self.rounds}",
            f"{self.handler.pending()} residual(s) pending",
            f"{self.handler.fired} re-fed",
        ]
        if wait_s is not None:
            parts.append(f"next timer in {wait_s * 1000:.0f} ms")
        if hold is not None:
            parts.append(f"watermark hold {hold / 1e6:.3f}s")
        return ", ".join(parts)

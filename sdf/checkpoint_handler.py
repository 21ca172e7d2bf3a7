"""StateAndTimerBundleCheckpointHandler: residuals become durable state + timers.

The design of seed 003 ("SDF self-checkpoint on the Flink runner"), on the
driver of a Spark job. For each residual root a bundle returns:

1. a unique id (a UUID: unique across restarts too);
2. the encoded residual written as keyed state in the pipeline's checkpoint
   store, namespace ``sdf-residual/<stage>``, keyed by the element (its
   encoded windowed bytes) plus the id — so residuals spread over key groups
   and follow them when parallelism changes on restore;
3. a processing-time timer at ``produced + requested_time_delay`` (ms), whose
   output timestamp (the watermark hold) is the min of the residual's output
   watermarks, else the input element's timestamp.

When timers come due their residuals are handed back (Approach 1: fed to the
same stage) and their state and holds are cleared. Because the state lives in
the store, every checkpoint includes pending residuals and their timers.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from sparkbeam.checkpoint import PipelineStore, state_layout
from sparkbeam.sdf.residuals import ResidualRecord, decode_pending, encode_pending
from sparkbeam.sdf.timer_service import ResidualTimerService

MAX_RESIDUALS_PER_ROUND = 50_000
"""At most this many due residuals are fed back in one round (batch and streaming alike)."""


@dataclass(frozen=True)
class DueResidual:
    """A residual whose timer fired: feed ``element`` to ``transform`` of the stage."""

    key: bytes
    transform: str
    element: bytes
    fire_at_ms: int
    hold_micros: int


class StateAndTimerBundleCheckpointHandler:
    """Keeps one stage's pending residuals in the store, under timers."""

    def __init__(self, state: PipelineStore, stage: str) -> None:
        self.state = state
        self.stage = stage
        self.namespace = state_layout.sdf_residual(stage)
        self.timers = ResidualTimerService()
        self.added = 0
        self.fired = 0

    def add(self, records: Iterable[ResidualRecord]) -> int:
        """Write each residual as state and set its timer; returns how many."""
        n = 0
        for r in records:
            key = r.element + b"\x00" + uuid.uuid4().bytes
            fire_at = int(r.produced_ms + r.delay_ms + 0.999)  # never earlier than asked
            self.state.put(
                self.namespace,
                key,
                encode_pending(r.transform, r.element, fire_at, r.hold_micros, r.delay_ms),
            )
            self.timers.set(key, fire_at, r.hold_micros)
            n += 1
        self.added += n
        return n

    def pending(self) -> int:
        return len(self.timers)

    def next_fire_ms(self) -> int | None:
        return self.timers.next_fire_ms()

    def watermark_hold_micros(self) -> int | None:
        return self.timers.hold_micros()

    def pop_due(self, now_ms: float, limit: int = MAX_RESIDUALS_PER_ROUND) -> list[DueResidual]:
        """Residuals whose timers fired by ``now_ms``; their state and holds are cleared."""
        due = []
        for key in self.timers.pop_due(now_ms, limit):
            value = self.state.get(self.namespace, key)
            if value is None:
                continue
            transform, element, fire_at, hold, _ = decode_pending(value, self.namespace)
            self.state.delete(self.namespace, key)
            due.append(DueResidual(key, transform, element, fire_at, hold))
        self.fired += len(due)
        return due

    def restore(self) -> int:
        """Rebuild the timers from state (after ``PipelineStore.restore``)."""
        entries = []
        for _, key, value in self.state.items(self.namespace):
            _, _, fire_at, hold, _ = decode_pending(value, self.namespace)
            entries.append((key, fire_at, hold))
        self.timers.restore(entries)
        return len(entries)

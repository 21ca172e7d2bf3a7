"""What a round feeds back: the residuals whose timers are due, and the wait until they are.

Batch and streaming rounds alike pop at most ``MAX_RESIDUALS_PER_ROUND`` due residuals per
stage from its ``StateAndTimerBundleCheckpointHandler``; between rounds the driver sleeps until
the earliest timer (nobody spins). Leaves to others: running the round (the loops) and keeping
residuals durable (the handler, on the pipeline's store).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from sparkbeam.sdf import DueResidual, StateAndTimerBundleCheckpointHandler


def pop_due(
    handlers: Mapping[str, StateAndTimerBundleCheckpointHandler], now_ms: float | None = None
) -> dict[str, list[DueResidual]]:
    """Stage -> its residuals due by ``now_ms`` (default: now), cleared from state and timers."""
    now_ms = time.time() * 1000.0 if now_ms is None else now_ms
    return {s: h.pop_due(now_ms) for s, h in handlers.items()}


def due_rows(due: list[DueResidual]) -> list[tuple[str, bytes]]:
    """The data rows that feed due residuals back: (data-input transform, element)."""
    return [(d.transform, d.element) for d in due]


def pending(handlers: Mapping[str, StateAndTimerBundleCheckpointHandler]) -> int:
    return sum(h.pending() for h in handlers.values())


def next_fire_ms(handlers: Mapping[str, StateAndTimerBundleCheckpointHandler]) -> float | None:
    """The earliest residual timer of any stage, if one is set."""
    times = [h.next_fire_ms() for h in handlers.values()]
    return min((t for t in times if t is not None), default=None)


def seconds_until(next_ms: float | None) -> float:
    """How long to sleep until ``next_ms`` (epoch ms); 0 if it is due or unset."""
    if next_ms is None:
        return 0.0
    return max(0.0, next_ms / 1000.0 - time.time())

"""Processing time inside a task: the wall clock, or the round's virtual clock.

A round driven by a TestStream ships its virtual time (``clock_micros``) with every task, so
processing-time timers, ``AfterProcessingTime`` triggers and SDF resume delays follow the
TestStream's ``advance_processing_time`` events instead of the wall clock.
"""

from __future__ import annotations

import time


def now_seconds(clock_micros: int | None) -> float:
    """Seconds since the epoch: the virtual clock if the round has one, else the wall clock."""
    return time.time() if clock_micros is None else clock_micros / 1e6

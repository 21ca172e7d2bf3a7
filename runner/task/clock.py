"""Processing time inside a task: the wall clock, or the round's virtual clock.

A round driven by a TestStream ships its virtual time (``clock_micros``) with every task, so
processing-time timers, ``AfterProcessingTime`` triggers and SDF resume delays follow the
TestStream's ``advance_processing_time`` events instead of the wall clock.
"""

from __future__ import annotations

import time

from apache_beam.runners.direct.clock import RealClock, TestClock
from apache_beam.utils.timestamp import Timestamp


def now_seconds(clock_micros: int | None) -> float:
    """Seconds since the epoch: the virtual clock if the round has one, else the wall clock."""
    return time.time() if clock_micros is None else clock_micros / 1e6


def trigger_clock(clock_micros: int | None):
    """The clock Beam's trigger driver reads (``AfterProcessingTime`` sets its timers by it)."""
    return RealClock() if clock_micros is None else TestClock(Timestamp(micros=clock_micros))

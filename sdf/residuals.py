"""What a Spark task hands back when an SDF does not finish: a ResidualRecord.

One record per ``DelayedBundleApplication`` (SDK-initiated checkpoint or the
residual of a split). It crosses the task boundary as plain bytes and ints;
``StateAndTimerBundleCheckpointHandler`` turns it into durable state + a timer.
"""

from __future__ import annotations

from typing import NamedTuple


class ResidualRecord(NamedTuple):
    """A residual root of one bundle, ready to be fed back to its stage."""

    stage: str
    transform: str  # the stage's data-input transform to re-feed it through
    element: bytes  # the encoded windowed (element, restriction, ...) application
    produced_ms: float  # wall clock (ms) when the task got it from the SDK
    delay_ms: float  # requested_time_delay, millisecond precision
    hold_micros: int  # output watermark hold: min of output watermarks, else element time

"""What a Spark task hands back when an SDF does not finish: a ResidualRecord.

One record per ``DelayedBundleApplication`` (SDK-initiated checkpoint or the
residual of a split). It crosses the task boundary as plain bytes and ints;
``StateAndTimerBundleCheckpointHandler`` turns it into durable state + a timer.
"""

from __future__ import annotations

import struct
from typing import NamedTuple


class ResidualRecord(NamedTuple):
    """A residual root of one bundle, ready to be fed back to its stage."""

    stage: str
    transform: str  # the stage's data-input transform to re-feed it through
    element: bytes  # the encoded windowed (element, restriction, ...) application
    produced_ms: float  # wall clock (ms) when the task got it from the SDK
    delay_ms: float  # requested_time_delay, millisecond precision
    hold_micros: int  # output watermark hold: min of output watermarks, else element time


_HEADER = struct.Struct(">qqdH")


def encode_pending(
    transform: str, element: bytes, fire_at_ms: int, hold_micros: int, delay_ms: float
) -> bytes:
    """The stored value of one pending residual (fixed header, then names and bytes)."""
    name = transform.encode("utf-8")
    return _HEADER.pack(fire_at_ms, hold_micros, delay_ms, len(name)) + name + element


def decode_pending(value: bytes) -> tuple[str, bytes, int, int, float]:
    """Inverse of encode_pending: (transform, element, fire_at_ms, hold_micros, delay_ms)."""
    fire_at_ms, hold_micros, delay_ms, n = _HEADER.unpack_from(value)
    start = _HEADER.size
    transform = value[start : start + n].decode("utf-8")
    return transform, value[start + n :], fire_at_ms, hold_micros, delay_ms

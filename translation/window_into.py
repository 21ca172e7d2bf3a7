"""WindowInto with one of Beam's standard WindowFns, marked for sparkbeam's own operation.

The SDK runs ``WindowInto`` as a DoFn call per element with an ``AssignContext``, ``Timestamp``
arithmetic and a new window object: a quarter of a streaming map stage
(``benchmarks/streaming.py``). The four standard WindowFns' windows depend on the timestamp
alone, so the runner's operation (``sparkbeam.runner.task.window_into``) computes them from
integer microseconds and reuses the window objects; any other WindowFn keeps Beam's operation.
"""

from __future__ import annotations

from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2

WINDOW_INTO_URN = "sparkbeam:transform:window_into:v1"
"""Beam's ``beam:transform:window_into:v1`` with the same payload (the WindowingStrategy)."""

STANDARD_WINDOW_FNS = frozenset(
    urn.urn
    for urn in (
        common_urns.global_windows,
        common_urns.fixed_windows,
        common_urns.sliding_windows,
        common_urns.session_windows,
    )
)
_ASSIGN_WINDOWS_URN = common_urns.primitives.ASSIGN_WINDOWS.urn


def mark_window_into(transform: beam_runner_api_pb2.PTransform) -> None:
    """Give a WindowInto of a standard WindowFn sparkbeam's URN (in place; payload unchanged)."""
    if transform.spec.urn != _ASSIGN_WINDOWS_URN:
        return
    strategy = beam_runner_api_pb2.WindowingStrategy.FromString(transform.spec.payload)
    if strategy.window_fn.urn in STANDARD_WINDOW_FNS:
        transform.spec.urn = WINDOW_INTO_URN

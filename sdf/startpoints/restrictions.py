"""How a startpoint becomes a restriction: the provider hooks and the OffsetRange built-in.

Only a source's ``RestrictionProvider`` knows what a position means for its restrictions, so it
honours startpoints through optional hooks:

- ``restriction_for_startpoint(element, restriction, startpoint)`` -> a new restriction, or None
  when this element has no data at that position yet (the startpoint is kept for later). It
  overrides everything below, and is the way for timestamp-based sources: map
  ``startpoint.position`` (epoch ms) to the source's own position.
- ``latest_offset(element)`` -> the offset the next record will get (None: unknown yet), for
  ``upcoming`` on unbounded ``OffsetRange`` restrictions (stop == ``sys.maxsize``).
- ``startpoint_key(element)`` -> the ``--key`` an operator passes (default: ``str(element)``).
- ``estimator_state_for_startpoint(element, restriction, estimator_state, startpoint)`` -> the
  watermark-estimator state for the new restriction. Default: the DoFn's
  ``initial_estimator_state(element, restriction)``, as for a fresh restriction: a rewind must
  not keep a watermark past its position (a ``ManualWatermarkEstimator`` refuses to move back).

Without ``restriction_for_startpoint``, ``OffsetRange`` restrictions get the built-in: offset ->
``[offset, stop)``; oldest -> ``[initial_restriction(element).start, stop)``; upcoming ->
``[latest_offset(element), stop)``, or ``[stop, stop)`` for a bounded range. Leaves to others:
decoding elements (`applier`) and the lifecycle (`session`).
"""

from __future__ import annotations

import sys
from typing import Any

from apache_beam.io.restriction_trackers import OffsetRange

from sparkbeam.checkpoint.startpoints import Startpoint, StartpointKind
from sparkbeam.sdf.startpoints.errors import StartpointError, UnsupportedStartpointError

HOOK = "restriction_for_startpoint"
LATEST_HOOK = "latest_offset"
KEY_HOOK = "startpoint_key"
ESTIMATOR_HOOK = "estimator_state_for_startpoint"
_DEFINE_HOOK = f"Define {HOOK}(element, restriction, startpoint) on its RestrictionProvider."


def estimator_state_for_startpoint(
    provider: Any, estimators: Any, element: Any, restriction: Any, state: Any, sp: Startpoint
) -> Any:
    """The watermark-estimator state for ``restriction``, the one a startpoint just made."""
    hook = getattr(provider, ESTIMATOR_HOOK, None)
    if hook is not None:
        return hook(element, restriction, state, sp)
    if estimators is None:
        return state
    return estimators.initial_estimator_state(element, restriction)


def element_key(provider: Any, element: Any) -> str:
    """The string a per-element startpoint's key is matched against."""
    hook = getattr(provider, KEY_HOOK, None)
    return str(hook(element)) if hook is not None else str(element)


def check_supported(provider: Any, source: str, startpoint: Startpoint) -> None:
    """At job start: fail early on what no element could ever honour."""
    if hasattr(provider, HOOK):
        return
    if startpoint.kind is StartpointKind.TIMESTAMP:
        raise UnsupportedStartpointError(
            source,
            startpoint.kind.value,
            f"its restriction provider {type(provider).__name__} has no {HOOK}() hook and "
            "offset restrictions carry no timestamps",
            f"Define {HOOK}(element, restriction, startpoint) on the provider to map the "
            "timestamp (startpoint.position, epoch ms) to a position, or set an 'offset' "
            "startpoint instead.",
        )
    if startpoint.kind is StartpointKind.OFFSET:
        parse_offset(source, startpoint)


def parse_offset(source: str, startpoint: Startpoint) -> int:
    try:
        return int(startpoint.position or "")
    except ValueError:
        raise StartpointError(
            f"Startpoint of kind 'offset' for transform {source!r} has position "
            f"{startpoint.position!r}, which is not an integer offset. Set it again with an "
            "integer --value, or define restriction_for_startpoint() on the source's restriction "
            "provider to parse its own positions."
        ) from None


def restriction_for_startpoint(
    provider: Any, source: str, element: Any, restriction: Any, startpoint: Startpoint
) -> Any | None:
    """The restriction this element continues from, or None to keep the startpoint for later:
    the provider's hook, else the OffsetRange built-in (see the module docstring)."""
    hook = getattr(provider, HOOK, None)
    if hook is not None:
        return hook(element, restriction, startpoint)
    kind = startpoint.kind
    if not isinstance(restriction, OffsetRange):
        reason = f"its restriction is a {type(restriction).__name__}, not an OffsetRange"
        raise UnsupportedStartpointError(source, kind.value, reason, _DEFINE_HOOK)
    stop = restriction.stop
    if kind is StartpointKind.OFFSET:
        offset = parse_offset(source, startpoint)
        return OffsetRange(offset, stop) if offset <= stop else None
    if kind is StartpointKind.OLDEST:
        initial = provider.initial_restriction(element)
        if not isinstance(initial, OffsetRange):
            reason = "its initial restriction is not an OffsetRange"
            raise UnsupportedStartpointError(source, kind.value, reason, _DEFINE_HOOK)
        return OffsetRange(min(initial.start, stop), stop)
    if kind is StartpointKind.UPCOMING:
        latest = getattr(provider, LATEST_HOOK, None)
        if latest is not None:
            offset = latest(element)
            return None if offset is None else OffsetRange(min(int(offset), stop), stop)
        if stop < sys.maxsize:
            return OffsetRange(stop, stop)
        raise UnsupportedStartpointError(
            source,
            kind.value,
            "its OffsetRange is unbounded (stop == sys.maxsize), so the runner cannot know where "
            "the data ends",
            f"Define {LATEST_HOOK}(element) -> the next offset on its RestrictionProvider, or "
            f"{HOOK}(element, restriction, startpoint).",
        )
    raise UnsupportedStartpointError(
        source, kind.value, "the OffsetRange built-in has no notion of time",
        f"Define {HOOK}(element, restriction, startpoint) on its RestrictionProvider to map the "
        "timestamp (startpoint.position, epoch ms) to an offset, or set an 'offset' startpoint.",
    )  # fmt: skip

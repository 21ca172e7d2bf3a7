"""Static checks of a splittable DoFn's restriction machinery (no Spark, no pipeline).

Owns: the checks ``check_sdf`` runs first: restriction and watermark-estimator-state coder
round trips, ``restriction_size`` >= 0 and shrinking as work is claimed, and, for
OffsetRange-like restrictions (integer ``start``/``stop``), ``try_split`` at 0, 0.5, 1 and a
seeded random fraction covering the range exactly, each tracker run to ``check_done()``.
Leaves to others: running the DoFn (``run``) and the report (``check``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from apache_beam.runners.common import DoFnSignature
from apache_beam.runners.sdf_utils import NoOpWatermarkEstimatorProvider

MAX_POSITIONS = 200  # claim at most this many positions per restriction in a static check


@dataclass
class StaticResult:
    """What the static checks found: problems (human sentences) and counts."""

    problems: list[str] = field(default_factory=list)
    splits_checked: int = 0
    notes: list[str] = field(default_factory=list)
    max_positions: int = 0  # the largest number of claims one restriction needs


def restriction_provider(dofn):
    """The DoFn's RestrictionProvider, or None when it is not splittable."""
    return DoFnSignature(dofn).get_restriction_provider()


def is_offset_like(restriction: Any) -> bool:
    return all(isinstance(getattr(restriction, end, None), int) for end in ("start", "stop"))


def _span(r: Any) -> str:
    return f"[{r.start}, {r.stop})"


def _round_trip_fault(coder, value) -> str | None:
    """None if ``value`` is equal after decode (or, not comparable, re-encodes to the same
    bytes), else the end of the problem's sentence: the coder and what it decoded."""
    encoded = coder.encode(value)
    decoded = coder.decode(encoded)
    if decoded == value or (
        type(value).__eq__ is object.__eq__ and coder.encode(decoded) == encoded
    ):
        return None
    return f"{type(coder).__name__}: decoded {decoded!r} (coder round-trip)."


def check_static(dofn, elements, seed: int = 0) -> StaticResult:
    """Run every static check over ``elements``; never raises for a check that fails."""
    result = StaticResult()
    provider = restriction_provider(dofn)
    if provider is None:
        result.problems.append(
            f"{type(dofn).__name__} is not splittable: its process() has no "
            "DoFn.RestrictionParam argument."
        )
        return result
    rng = random.Random(seed)
    coder = provider.restriction_coder()
    wm_provider = DoFnSignature(dofn).get_watermark_estimator_provider()
    for element in elements:
        try:
            _check_element(provider, coder, wm_provider, element, rng, result)
        except Exception as e:  # noqa: BLE001 - a crash in user code is a finding too
            result.problems.append(
                f"element {element!r}: the restriction provider raised {type(e).__name__}: {e}"
            )
    return result


def _check_element(provider, coder, wm_provider, element, rng, result: StaticResult) -> None:
    initial = provider.initial_restriction(element)
    where = f"element {element!r}"
    _check_restriction(provider, coder, element, initial, f"{where}, initial restriction", result)
    splits = list(provider.split(element, initial))
    for r in splits:
        _check_restriction(provider, coder, element, r, f"{where}, initial split", result)
    if is_offset_like(initial) and splits and all(is_offset_like(r) for r in splits):
        _check_cover(initial, splits, f"{where}: split() of {initial!r}", result)
    if wm_provider is not None and not isinstance(wm_provider, NoOpWatermarkEstimatorProvider):
        _check_watermark_state(wm_provider, element, splits or [initial], where, result)
    for r in splits:
        if is_offset_like(r):
            _check_offset_tracker(provider, coder, element, r, where, rng, result)
        else:
            note = f"{type(r).__name__} is not OffsetRange-like: split coverage not checked"
            if note not in result.notes:
                result.notes.append(note)


def _check_restriction(provider, coder, element, r, where, result: StaticResult) -> None:
    fault = _round_trip_fault(coder, r)
    if fault:
        result.problems.append(f"{where} {r!r} does not round-trip its restriction coder {fault}")
    size = provider.restriction_size(element, r)
    if size is None or size < 0:
        result.problems.append(f"{where} {r!r}: restriction_size is {size!r}, must be >= 0.")


def _check_cover(original, parts, where, result: StaticResult) -> None:
    """Parts (in order of start) must tile ``original``: no gap, no overlap."""
    parts = sorted(parts, key=lambda r: (r.start, r.stop))
    cursor = original.start
    for p in parts:
        if p.start > cursor:
            result.problems.append(
                f"{where}: positions [{cursor}, {p.start}) are in no part (lost position on split)."
            )
        elif p.start < cursor:
            result.problems.append(
                f"{where}: positions [{p.start}, {min(cursor, p.stop)}) are in two parts "
                "(duplicated position on split)."
            )
        cursor = max(cursor, p.stop)
    if cursor != original.stop:
        kind = "lost" if cursor < original.stop else "duplicated/extra"
        result.problems.append(
            f"{where}: parts end at {cursor}, original ends at {original.stop} ({kind} position "
            "on split)."
        )


def _check_watermark_state(wm_provider, element, restrictions, where, result) -> None:
    state_coder = wm_provider.estimator_state_coder()
    for r in restrictions:
        state = wm_provider.initial_estimator_state(element, r)
        later = wm_provider.create_watermark_estimator(state).get_estimator_state()
        for what, value in (("initial", state), ("get_estimator_state()'s", later)):
            fault = _round_trip_fault(state_coder, value)
            if fault:
                result.problems.append(
                    f"{where}: {what} watermark-estimator state {value!r} does not round-trip "
                    + fault
                )


def _check_offset_tracker(provider, coder, element, r, where, rng, result: StaticResult) -> None:
    n = r.stop - r.start
    result.max_positions = max(result.max_positions, n)
    if n <= 0:
        return
    where = f"{where}, restriction {r!r}"
    # try_split at fixed and one random fraction, each on a fresh tracker after one claim.
    for fraction in (0.0, 0.5, 1.0, round(rng.random(), 3)):
        tracker = provider.create_tracker(r)
        if not tracker.try_claim(r.start):
            result.problems.append(f"{where}: a fresh tracker refused try_claim({r.start}).")
            return
        split = tracker.try_split(fraction)
        label = f"{where}: try_split({fraction}) after claiming {r.start}"
        if split is None:
            primary = tracker.current_restriction()
            if (primary.start, primary.stop) != (r.start, r.stop):
                result.problems.append(
                    f"{label} returned None but changed the restriction to {_span(primary)}."
                )
            _run_to_completion(tracker, r.start + 1, label, result)
            continue
        result.splits_checked += 1
        primary, residual = split
        _check_cover(
            r, [primary, residual], f"{label} gave {_span(primary)} + {_span(residual)}", result
        )
        if primary.stop <= r.start:
            result.problems.append(f"{label}: primary {_span(primary)} drops claimed {r.start}.")
        current = tracker.current_restriction()
        if (current.start, current.stop) != (primary.start, primary.stop):
            result.problems.append(
                f"{label}: the tracker continues on {_span(current)}, not the primary "
                f"{_span(primary)}."
            )
        for part in (primary, residual):
            _check_restriction(provider, coder, element, part, f"{label}, part", result)
        _run_to_completion(tracker, r.start + 1, label, result)
    _check_size_shrinks(provider, element, r, where, result)


def _run_to_completion(tracker, first: int, label: str, result: StaticResult) -> None:
    """Claim the rest of the tracker's restriction, then one past it; check_done must pass."""
    stop = tracker.current_restriction().stop
    for pos in range(first, min(stop, first + MAX_POSITIONS)):
        if not tracker.try_claim(pos):
            result.problems.append(f"{label}: try_claim({pos}) inside the restriction failed.")
            return
    if stop > first + MAX_POSITIONS:
        return
    if tracker.try_claim(stop):
        result.problems.append(f"{label}: try_claim({stop}) past the restriction succeeded.")
    try:
        tracker.check_done()
    except Exception as e:  # noqa: BLE001 - check_done raising is the finding
        result.problems.append(f"{label}: check_done() after claiming everything raised: {e}")


def _check_size_shrinks(provider, element, r, where, result: StaticResult) -> None:
    """The size of what remains after k claims (the residual of try_split(0)) never grows."""
    n = min(r.stop - r.start, MAX_POSITIONS)
    sizes = []
    for k in range(n + 1):
        tracker = provider.create_tracker(r)
        for pos in range(r.start, r.start + k):
            tracker.try_claim(pos)
        split = tracker.try_split(0)
        sizes.append(provider.restriction_size(element, split[1]) if split else 0)
    full = provider.restriction_size(element, r)
    grows = [k for k in range(1, len(sizes)) if sizes[k] > sizes[k - 1]]
    if grows or (n > 0 and sizes[-1] >= full and full > 0):
        k = grows[0] if grows else n
        result.problems.append(
            f"{where}: restriction_size of the remaining work does not shrink as work is "
            f"claimed (after {k} claim(s): {sizes[k]!r}; before: {sizes[max(k - 1, 0)]!r}; "
            f"whole restriction: {full!r})."
        )

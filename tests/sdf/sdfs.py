"""Small, deterministic splittable DoFns used by the SDF tests and examples' tests."""

from __future__ import annotations

import time

import apache_beam as beam
from apache_beam.utils.timestamp import Duration

from sparkbeam.sdf import OffsetRangeProvider


class ChunkedWithDelay(beam.DoFn):
    """Claims ``per_call`` positions, then defers the rest by ``delay_s``.

    Emits (name, position, wall-clock time of the call that emitted it).
    """

    def __init__(self, per_call: int, delay_s: float) -> None:
        self.per_call = per_call
        self.delay_s = delay_s

    def process(self, element, tracker=beam.DoFn.RestrictionParam(OffsetRangeProvider())):
        name = element[0]
        now = time.time()
        pos = tracker.current_restriction().start
        for _ in range(self.per_call):
            if not tracker.try_claim(pos):
                return
            yield name, pos, now
            pos += 1
        if pos < tracker.current_restriction().stop:
            tracker.defer_remainder(Duration(seconds=self.delay_s))


class OffsetBySide(beam.DoFn):
    """Like ``ChunkedWithDelay``, with two side inputs read in every call (issue 43): emits
    ``"name,position + base,sum(extra)"``, so a round that lost a side input shows."""

    def __init__(self, per_call: int, delay_s: float) -> None:
        self.per_call = per_call
        self.delay_s = delay_s

    def process(
        self, element, base, extra, tracker=beam.DoFn.RestrictionParam(OffsetRangeProvider())
    ):
        pos = tracker.current_restriction().start
        for _ in range(self.per_call):
            if not tracker.try_claim(pos):
                return
            yield f"{element[0]},{pos + base},{sum(extra)}"
            pos += 1
        if pos < tracker.current_restriction().stop:
            tracker.defer_remainder(Duration(seconds=self.delay_s))

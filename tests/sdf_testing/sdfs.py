"""SDFs for the checker's tests: Beam's own well-behaved one, three broken ones, and one
that is valid but never splits."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.coders import coders
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.runners.portability.fn_api_runner.fn_runner_test import ExpandStringsProvider
from apache_beam.transforms.core import RestrictionProvider


class ExpandingStringsDoFn(beam.DoFn):
    """Beam's test SDF (fn_runner_test.test_sdf): one output per character."""

    def process(
        self, element, restriction_tracker=beam.DoFn.RestrictionParam(ExpandStringsProvider())
    ):
        assert isinstance(restriction_tracker, beam.runners.sdf_utils.RestrictionTrackerView)
        cur = restriction_tracker.current_restriction().start
        while restriction_tracker.try_claim(cur):
            yield element[cur]
            cur += 1


class LosingTracker(OffsetRestrictionTracker):
    """Off by one: the residual of every split starts one position too late."""

    def try_split(self, fraction_of_remainder):
        split = super().try_split(fraction_of_remainder)
        if split is None:
            return None
        primary, residual = split
        return primary, OffsetRange(min(residual.start + 1, residual.stop), residual.stop)


class DuplicatingTracker(OffsetRestrictionTracker):
    """The residual of every split starts one position early: it overlaps the primary."""

    def try_split(self, fraction_of_remainder):
        split = super().try_split(fraction_of_remainder)
        if split is None:
            return None
        primary, residual = split
        return primary, OffsetRange(residual.start - 1, residual.stop)


class NeverSplittingTracker(OffsetRestrictionTracker):
    """Valid Beam, but useless to rebalance: every ``try_split`` declines."""

    def try_split(self, fraction_of_remainder):
        return None


class StartOnlyCoder(coders.Coder):
    """Encodes an OffsetRange's start and forgets its stop."""

    def encode(self, value):
        return coders.VarIntCoder().encode(value.start)

    def decode(self, encoded):
        start = coders.VarIntCoder().decode(encoded)
        return OffsetRange(start, start)

    def is_deterministic(self):
        return True


class _Provider(RestrictionProvider):
    def __init__(self, tracker_cls=OffsetRestrictionTracker, coder=None) -> None:
        self.tracker_cls = tracker_cls
        self.coder = coder

    def initial_restriction(self, element):
        return OffsetRange(0, element[1])

    def create_tracker(self, restriction):
        return self.tracker_cls(restriction)

    def restriction_size(self, element, restriction):
        return restriction.size()

    def restriction_coder(self):
        return self.coder or super().restriction_coder()


class _Emit(beam.DoFn):
    """Emit ``(name, position)`` for each claimed position of ``[0, size)``."""

    def _emit(self, element, tracker):
        pos = tracker.current_restriction().start
        while tracker.try_claim(pos):
            yield element[0], pos
            pos += 1


class GoodOffsetFn(_Emit):
    def process(self, element, tracker=beam.DoFn.RestrictionParam(_Provider())):
        yield from self._emit(element, tracker)


class LosesPositionOnSplitFn(_Emit):
    def process(self, element, tracker=beam.DoFn.RestrictionParam(_Provider(LosingTracker))):
        yield from self._emit(element, tracker)


class DuplicatesPositionOnSplitFn(_Emit):
    def process(self, element, tracker=beam.DoFn.RestrictionParam(_Provider(DuplicatingTracker))):
        yield from self._emit(element, tracker)


class BadCoderFn(_Emit):
    def process(
        self, element, tracker=beam.DoFn.RestrictionParam(_Provider(coder=StartOnlyCoder()))
    ):
        yield from self._emit(element, tracker)


class NeverSplitsFn(_Emit):
    def process(
        self, element, tracker=beam.DoFn.RestrictionParam(_Provider(NeverSplittingTracker))
    ):
        yield from self._emit(element, tracker)


ELEMENTS = [("a", 4), ("b", 3)]

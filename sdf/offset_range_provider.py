"""The restriction provider of the simplest splittable DoFn: positions ``[0, size)`` of an element.

The three methods every offset-based SDF starts with, shared by the examples, tests and
benchmarks. Subclass it to add startpoint hooks (``sparkbeam.sdf.startpoints.restrictions``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.transforms.core import RestrictionProvider


def second(element: Any) -> int:
    """The size of a ``(name, size)`` element."""
    return element[1]


class OffsetRangeProvider(RestrictionProvider):
    """Restriction ``[0, size(element))``; by default an element is ``(name, size)``."""

    def __init__(self, size: Callable[[Any], int] = second) -> None:
        self.size = size

    def initial_restriction(self, element: Any) -> OffsetRange:
        return OffsetRange(0, self.size(element))

    def create_tracker(self, restriction: OffsetRange) -> OffsetRestrictionTracker:
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, element: Any, restriction: OffsetRange) -> int:
        return restriction.size()

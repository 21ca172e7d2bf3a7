"""The restriction side of ``ReadFromKafka``: one offset range per topic-partition.

Owns: the element (``(topic, partition, start, stop)``, a tuple with a deterministic coder;
``stop`` is ``sys.maxsize`` for an unbounded read), its restriction (``KafkaOffsetRange``) and
tracker (an unbounded range splits only at its position: a runner-initiated split is a
checkpoint, never a cut at half of ``sys.maxsize``), the size and backlog estimates, the
per-partition watermark estimator (the largest record timestamp seen, or the processing time
once caught up, so an idle partition does not hold the pipeline back), and the startpoint
hooks (key ``<topic>-<partition>``). Leaves to others: polling (``kafka_read``), broker
questions (``kafka_client``).
"""

from __future__ import annotations

import copy
import sys
import typing
from typing import Any

from apache_beam import coders
from apache_beam.io.iobase import RestrictionProgress, WatermarkEstimator
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.transforms.core import RestrictionProvider, WatermarkEstimatorProvider
from apache_beam.utils.timestamp import MIN_TIMESTAMP, Timestamp

from sparkbeam.checkpoint.startpoints import Startpoint, StartpointKind
from sparkbeam.io import kafka_client

UNBOUNDED = sys.maxsize

PartitionElement = typing.Tuple[str, int, int, int]  # noqa: UP006 - Beam's coder registry
"""``(topic, partition, start, stop)``: coded by Beam's TupleCoder (StrUtf8, VarInt...)."""
PartitionUntilElement = typing.Tuple[str, int, int, int, int]  # noqa: UP006
"""The same and, with ``max_read_time``, when the read ends (epoch ms, set at the listing)."""

# The last end offset a task saw per (topic, partition): the backlog estimate, no broker call.
_END_SEEN: dict[tuple[str, int], int] = {}


def note_end_offset(topic: str, partition: int, end: int) -> None:
    _END_SEEN[(topic, partition)] = end


class KafkaOffsetRange(OffsetRange):
    """An offset range that carries what a read learnt of its partition to the next: since
    when (epoch s) its reads have found nothing (``idle_since``), so the next knows whether
    to back off, and its fetch wait and stall (``pace``, ``kafka_pace.FetchPace``); None: not
    known, as for a plain ``OffsetRange`` (a startpoint's) or one pickled without ``pace``.
    ``split_at`` hands them to the residual."""

    def __init__(
        self, start: int, stop: int, idle_since: float | None = None, pace: Any = None
    ) -> None:
        super().__init__(start, stop)
        self.idle_since = idle_since
        self.pace = pace

    def split_at(self, split_pos) -> tuple[KafkaOffsetRange, KafkaOffsetRange]:
        pace = getattr(self, "pace", None)  # the read goes on with it; the residual's a copy
        return (
            KafkaOffsetRange(self.start, split_pos, self.idle_since, pace),
            KafkaOffsetRange(split_pos, self.stop, self.idle_since, copy.copy(pace)),
        )


def mark_idle_since(tracker, since: float | None) -> None:
    """Carry ``since`` (see ``KafkaOffsetRange``) to the residual the read defers next."""
    restriction = tracker.current_restriction()
    if isinstance(restriction, KafkaOffsetRange):
        restriction.idle_since = since


class ClaimUpTo:
    """``tracker.try_claim(ClaimUpTo(last))`` claims a polled batch, up to ``last`` or the
    range's stop, in one call (under the thread-safe tracker's lock, so a runner-initiated
    split can only cut after it); ``claimed`` is then the last offset claimed (None: none)."""

    __slots__ = ("last", "claimed")

    def __init__(self, last: int) -> None:
        self.last, self.claimed = last, None


class KafkaOffsetTracker(OffsetRestrictionTracker):
    """An ``OffsetRestrictionTracker`` whose unbounded range reports its backlog and splits
    only where it stands, and claims a polled batch at once (`ClaimUpTo`)."""

    def __init__(self, restriction: OffsetRange, backlog: int | None = None) -> None:
        if not isinstance(restriction, KafkaOffsetRange):
            restriction = KafkaOffsetRange(restriction.start, restriction.stop)
        super().__init__(restriction)
        self._backlog = backlog

    def _unbounded(self) -> bool:
        return self._range.stop >= UNBOUNDED

    def try_claim(self, position) -> bool:
        if type(position) is not ClaimUpTo:
            return super().try_claim(position)
        last = min(position.last, self._range.stop - 1)
        done = self._last_claim_attempt is not None and last <= self._last_claim_attempt
        if done or last < self._range.start or not super().try_claim(last):
            return False
        position.claimed = last
        return True

    def current_progress(self) -> RestrictionProgress:
        if not self._unbounded():
            return super().current_progress()
        claimed = self._last_claim_attempt
        position = self._range.start if claimed is None else claimed + 1
        remaining = max(1, self._backlog or 1)
        return RestrictionProgress(completed=position - self._range.start, remaining=remaining)

    def try_split(self, fraction_of_remainder):
        if self._unbounded():
            fraction_of_remainder = 0  # a checkpoint at the current position
        return super().try_split(fraction_of_remainder)

    def is_bounded(self) -> bool:
        return not self._unbounded()


class KafkaRestrictionProvider(RestrictionProvider):
    """Offset ranges per topic-partition, and the startpoint hooks (see the module docstring)."""

    def __init__(self, consumer_config: dict[str, Any]) -> None:
        self.consumer_config = dict(consumer_config)
        self._client = None

    def client(self):
        if self._client is None:
            self._client = kafka_client.question_consumer(self.consumer_config)
        return self._client

    def initial_restriction(self, element) -> OffsetRange:
        return KafkaOffsetRange(element[2], element[3])

    def create_tracker(self, restriction: OffsetRange) -> KafkaOffsetTracker:
        return KafkaOffsetTracker(restriction)

    def restriction_size(self, element, restriction: OffsetRange) -> int:
        if restriction.stop < UNBOUNDED:
            return restriction.size()
        end = _END_SEEN.get((element[0], element[1]))
        return max(1, (end or 0) - restriction.start)

    # -- startpoint hooks (sparkbeam.sdf.startpoints.restrictions) --

    def startpoint_key(self, element) -> str:
        """``<topic>-<partition>``, Kafka's own name for a topic-partition (``--key`` of
        ``sparkbeam startpoints set``)."""
        return f"{element[0]}-{element[1]}"

    def latest_offset(self, element) -> int:
        return kafka_client.end_offset(self.client(), element[0], element[1])

    def restriction_for_startpoint(
        self, element, restriction: OffsetRange, startpoint: Startpoint
    ) -> OffsetRange | None:
        topic, partition = element[0], element[1]
        kind, stop = startpoint.kind, restriction.stop
        if kind is StartpointKind.OFFSET:
            offset = int(startpoint.position or "")
        elif kind is StartpointKind.OLDEST:
            offset = kafka_client.low_offset(self.client(), topic, partition)
        elif kind is StartpointKind.UPCOMING:
            offset = kafka_client.end_offset(self.client(), topic, partition)
        else:
            millis = int(startpoint.position or "")
            offset = kafka_client.offset_for_time(self.client(), topic, partition, millis)
        return KafkaOffsetRange(min(offset, stop), stop)


class KafkaWatermarkEstimator(WatermarkEstimator):
    """The largest record timestamp seen, a polled batch at a time, or when caught up the start
    of the poll that found the end (``advance_to``)."""

    def __init__(self, state: Timestamp | None) -> None:
        self._watermark = MIN_TIMESTAMP if state is None else state

    def observe_timestamp(self, timestamp: Timestamp) -> None:
        """Beam's call for every output: the read has observed its batch already."""

    def advance_to(self, at: Timestamp) -> None:
        """Nothing older than ``at`` can come from the partition (under ``CreateTime``, bar
        records stamped more than ``max_delay_s`` before they reached the broker)."""
        if at > self._watermark:
            self._watermark = at

    def current_watermark(self) -> Timestamp:
        return self._watermark

    def get_estimator_state(self) -> Timestamp:
        return self._watermark


class KafkaWatermarkEstimatorProvider(WatermarkEstimatorProvider):
    def initial_estimator_state(self, element, restriction):
        return None

    def create_watermark_estimator(self, estimator_state) -> KafkaWatermarkEstimator:
        return KafkaWatermarkEstimator(estimator_state)

    def estimator_state_coder(self):
        return coders.NullableCoder(coders.TimestampCoder())

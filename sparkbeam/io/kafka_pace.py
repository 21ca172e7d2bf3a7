"""How long a Kafka read lets the broker hold a fetch of a partition, and when it says the
partition makes no progress.

The source's fetch wait (``fetch.wait.max.ms``) starts at 5 ms (``kafka_client.SOURCE_DEFAULTS``)
so that a caught-up read ends in ~10 ms. A broker that needs longer to gather a partition's
records answers nothing: Tansu (the test broker), at 30,000 one-record batches, comes back empty
at 5 ms and reads them all at 50. So a poll that gets nothing while the partition's end (as the
consumer's fetches saw it) is past the read's position is lag, not idleness: the wait doubles,
up to ``max_fetch_wait_ms``, and halves after ``RELAX_S`` without growing. A partition that lags
and gets nothing for ``stall_warning_s`` is named in a ``KafkaReadStalledWarning``.

Owns: ``FetchPace`` (carried in the restriction, ``KafkaOffsetRange.pace``), ``Pacing`` (a
reader's settings and these rules), ``Hold`` (a read call's consumer and position) and
``Consumers`` (one per wait: librdkafka fixes a consumer's ``fetch.wait.max.ms`` when it is
made). Leaves to others: polling (``kafka_read``), the restriction (``kafka_restrictions``),
making and closing consumers (``kafka_client``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from sparkbeam.io import kafka_client
from sparkbeam.io.errors import KafkaConfigError
from sparkbeam.io.kafka_restrictions import note_end_offset

MAX_FETCH_WAIT_MS = 500
RELAX_S = 30.0  # a grown wait halves after this long without growing
WARN_EVERY_S = 60.0  # at most one stall warning per partition in this time
MIN_SLICE_S = 0.2  # a poll slice: at least this, and 4x the wait
MAX_CONSUMERS = 3  # per reader: the most recently used waits' consumers


@dataclasses.dataclass
class FetchPace:
    """One partition's fetch wait, and its stall (epoch seconds; None: not so)."""

    wait_ms: int
    grown_at: float | None = None  # when the wait last grew (or halved)
    stalled_since: float | None = None  # lag and no record since
    warned_at: float | None = None  # the last stall warning


@dataclasses.dataclass(frozen=True)
class Pacing:
    """A reader's settings: the starting wait, the most it grows to, and how long a lagging
    partition goes without a record before the read warns."""

    start_ms: int
    max_ms: int
    stall_s: float

    @classmethod
    def of(cls, config: dict[str, str], max_fetch_wait_ms: int, stall_warning_s: float) -> Pacing:
        """From the consumer config's ``fetch.wait.max.ms`` (the starting wait) up to
        ``max_fetch_wait_ms`` (at least that); bad values refused by name."""
        start = config.get("fetch.wait.max.ms", kafka_client.SOURCE_DEFAULTS["fetch.wait.max.ms"])
        if not (str(start).isdigit() and int(start) > 0):
            raise KafkaConfigError(
                f"consumer_config's fetch.wait.max.ms={start!r} must be a whole number of ms > 0."
            )
        if not (isinstance(max_fetch_wait_ms, int) and max_fetch_wait_ms > 0):
            raise KafkaConfigError(f"max_fetch_wait_ms={max_fetch_wait_ms!r} must be an int > 0.")
        if not 0 < stall_warning_s < float("inf"):
            raise KafkaConfigError(f"stall_warning_s={stall_warning_s} must be > 0 (seconds).")
        return cls(int(start), max(int(start), max_fetch_wait_ms), float(stall_warning_s))

    def pace_of(self, restriction: Any, now: float) -> FetchPace:
        """The restriction's pace (new if it has none), within this reader's bounds, relaxed if
        due; the read changes it in place and the residual carries it on."""
        pace = getattr(restriction, "pace", None) or FetchPace(self.start_ms)
        pace.wait_ms = min(max(pace.wait_ms, self.start_ms), self.max_ms)
        if pace.wait_ms > self.start_ms and now - (pace.grown_at or 0.0) >= RELAX_S:
            pace.wait_ms, pace.grown_at = max(self.start_ms, pace.wait_ms // 2), now
        restriction.pace = pace
        return pace

    def slice_s(self, pace: FetchPace) -> float:
        """How long a poll waits before the read looks whether the partition lags: several
        fetches' time at the current wait."""
        return max(MIN_SLICE_S, 4 * pace.wait_ms / 1000)

    def grow(self, pace: FetchPace, now: float) -> bool:
        """A poll got nothing while the partition lags: double the wait (False: it is at
        ``max_ms`` already). The stall streak starts now if it has not."""
        if pace.stalled_since is None:
            pace.stalled_since = now
        grown = min(self.max_ms, 2 * pace.wait_ms)
        if grown == pace.wait_ms:
            return False
        pace.wait_ms, pace.grown_at = grown, now
        return True

    def stall_warning(
        self, pace: FetchPace, now: float, name: str, position: int, end: int, age_s: float
    ) -> str | None:
        """The warning for partition ``name``, which lags and got nothing (None: not for
        ``stall_s`` yet, or one was issued within ``WARN_EVERY_S``)."""
        if pace.stalled_since is None or now - pace.stalled_since < self.stall_s:
            return None
        if pace.warned_at is not None and now - pace.warned_at < WARN_EVERY_S:
            return None
        pace.warned_at = now
        return (
            f"Kafka partition {name} has made no progress for {now - pace.stalled_since:.0f} s "
            f"although records wait past its position: position {position}, end offset {end} "
            f"({end - position} behind); every fetch came back empty at "
            f"fetch.wait.max.ms={pace.wait_ms} (max_fetch_wait_ms={self.max_ms}) on a consumer "
            f"made {age_s:.0f} s ago, so the broker takes longer than that to answer. The read "
            "goes on polling and loses nothing; check the broker's load and storage, or raise "
            "max_fetch_wait_ms of ReadFromKafka."
        )


def progressed(pace: FetchPace) -> None:
    """The read got records: the stall streak ends (the wait stays: it is what worked)."""
    pace.stalled_since = None


class Hold:
    """One read call's hold on its partition: the consumer assigned at ``position`` (the next
    offset to read), the ends its fetches saw, and since when the call has got nothing."""

    def __init__(self, topic: str, partition: int, position: int, consumer: Any) -> None:
        from confluent_kafka import TopicPartition

        self.topic, self.partition, self.name = topic, partition, f"{topic}-{partition}"
        self.tp = TopicPartition(topic, partition)
        self.position, self.end_seen, self.first_end = position, -1, -1
        self.quiet_from = time.monotonic()
        self.consumer: Any = None
        self.take(consumer)

    def take(self, consumer: Any) -> None:
        """Read on with ``consumer`` (another fetch wait's) from the position."""
        from confluent_kafka import TopicPartition

        self.release()
        self.consumer = consumer
        consumer.assign([TopicPartition(self.topic, self.partition, self.position)])

    def lags(self) -> bool:
        """Whether this consumer's fetches saw the partition end past the position (its own
        fetches: one just assigned elsewhere has not fetched it yet)."""
        return self._high() > self.position

    def reached_end(self) -> bool:
        """Whether the read has taken all that its consumer's newest fetch saw (caught up as of
        that fetch): librdkafka's partition-EOF event needs a fetch that found nothing new,
        which a partition written every few ms seldom gets."""
        return 0 <= self._high() <= self.position

    def more_since_start(self, n: int) -> bool:
        """Whether the call has taken all that the partition held when its first batch came
        and ``n`` or more records were written since: those wait for the next call, so that a
        call reads the backlog it began with, neither chasing a partition written faster than
        it is fetched for ``max_poll_s`` nor taking it for idle when caught up for an instant."""
        high = self._high()
        return 0 <= self.first_end <= self.position and high - self.position >= n

    def _high(self) -> int:
        """The partition's end as this consumer's newest fetch saw it (cached; -1 before any
        fetch), noted in ``end_seen`` (and ``first_end`` the first time)."""
        _, high = self.consumer.get_watermark_offsets(self.tp, cached=True)
        self.end_seen = max(self.end_seen, high)
        if self.first_end < 0:
            self.first_end = high
        return high

    def release(self) -> None:
        """Unassign the partition, noting the end offset seen (the backlog estimate)."""
        if self.consumer is None:
            return
        self.lags()
        if self.end_seen >= 0:
            note_end_offset(self.topic, self.partition, self.end_seen)
        self.consumer.unassign()
        self.consumer = None


class Consumers:
    """A reader's consumers by fetch wait, made when first asked for; the ``MAX_CONSUMERS``
    most recently used are kept open (each is a few librdkafka threads and a connection)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self._made: dict[int, tuple[Any, float]] = {}  # wait ms -> (consumer, made at)

    def get(self, wait_ms: int):
        entry = self._made.pop(wait_ms, None)
        if entry is None:
            wait = {"fetch.wait.max.ms": str(wait_ms)}
            entry = (kafka_client.consumer(self.config, **wait), time.monotonic())
        self._made[wait_ms] = entry  # the most recently used last
        while len(self._made) > MAX_CONSUMERS:
            kafka_client.close(self._made.pop(next(iter(self._made)))[0])
        return entry[0]

    def age_s(self, consumer: Any) -> float:
        made = next((at for c, at in self._made.values() if c is consumer), time.monotonic())
        return time.monotonic() - made

    def drop(self, consumer: Any) -> None:
        """Close ``consumer`` after a fatal error; the next read of its wait gets a new one."""
        for wait, (c, _) in list(self._made.items()):
            if c is consumer:
                del self._made[wait]
        kafka_client.close(consumer)

    def close(self) -> None:
        while self._made:
            kafka_client.close(self._made.popitem()[1][0])

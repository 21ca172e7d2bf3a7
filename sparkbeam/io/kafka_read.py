"""``ReadFromKafka``: a splittable DoFn over confluent-kafka, one restriction per partition.

Owns: the transform (Beam's ``apache_beam.io.kafka.ReadFromKafka`` argument names where they
apply) and the read loop: poll one partition in batches, claim each batch at once, and defer
the remainder once caught up (librdkafka's partition-EOF event, or ``Hold.reached_end``), once
it has read the backlog it began with while more came (``Hold.more_since_start``), or after
``max_poll_s``. A caught-up partition reads on in the next round if its call took a batch or
more, else waits ``idle_resume_delay_s`` (``max_idle_resume_delay_s`` once its reads have found
nothing that long), ending on a multiple of the delay on the wall clock so that an idle
topic's partitions poll in the same round. Offsets live in the
checkpoint (the SDF residual), never in the consumer group. Leaves to others: which
partitions and where they start (``kafka_listing``), restrictions, watermarks and startpoints
(``kafka_restrictions``), fetch waits and stalls (``kafka_pace``), records (``kafka_records``),
broker questions (``kafka_client``).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import apache_beam as beam
from apache_beam.utils.timestamp import Duration, Timestamp

from sparkbeam.io import kafka_client, kafka_records
from sparkbeam.io.errors import (
    KafkaBrokerUnreachableError,
    KafkaConfigError,
    KafkaReadStalledWarning,
)
from sparkbeam.io.kafka_listing import DiscoverPartitions, ListPartitions
from sparkbeam.io.kafka_pace import MAX_FETCH_WAIT_MS, Consumers, Hold, Pacing, progressed
from sparkbeam.io.kafka_records import PolledBatch
from sparkbeam.io.kafka_restrictions import (
    UNBOUNDED,
    ClaimUpTo,
    KafkaRestrictionProvider,
    KafkaWatermarkEstimatorProvider,
    PartitionElement,
    PartitionUntilElement,
    mark_idle_since,
)

__all__ = ["ReadFromKafka"]


class ReadFromKafka(beam.PTransform):
    """Read ``topics`` as ``(key, value)`` pairs, or Beam Kafka rows ``with_metadata=True``.

    Unbounded unless ``max_num_records`` (in total, shared by the partitions at the start by
    their backlog), ``stop_offsets`` (``{(topic, partition): offset}``, exclusive),
    ``stop_read_time`` (epoch ms: a partition ends at its first record at or after it) or
    ``max_read_time`` (seconds: a partition ends at its first poll that long after the
    partitions were listed, a time its checkpointed position keeps) bound it. The start is
    ``start_read_time`` (epoch ms) if given, else the consumer group's committed offset, else
    ``auto.offset.reset`` (``latest`` by default, as in Kafka). ``commit_offset_in_finalize``
    commits read offsets to the consumer group (for lag monitoring only: a restore reads its
    positions from the checkpoint). The SDF is the ``Read`` step of this transform: startpoints
    name it ``<label>/Read``, per partition with ``--key <topic>-<partition>``.
    ``topic_pattern`` (a regular expression matched against whole topic names) adds the matching
    topics; ``dynamic_read_poll_interval_seconds`` lists the partitions again at that interval
    while an unbounded read runs, and reads each new one from where a Kafka consumer would start
    it. sparkbeam's own knobs: ``idle_resume_delay_s`` (how long a caught-up partition waits
    before it polls again, unless its read took ``batch_size`` records or more) and
    ``max_idle_resume_delay_s`` (how long it waits once its polls have found nothing for that
    long; by default 4x it), ``max_poll_s`` and ``batch_size`` (a call reads batches of
    ``batch_size`` records for at most ``max_poll_s``, then hands its remainder back to the
    runner, which checkpoints it); ``max_fetch_wait_ms`` (500: the
    longest a partition's fetch wait grows to, from the consumer config's
    ``fetch.wait.max.ms``, 5 by default, while the partition lags and the broker answers
    nothing within the wait) and ``stall_warning_s`` (60: how long a lagging partition goes
    without a record before a ``KafkaReadStalledWarning`` names it, once a minute).
    ``max_delay_s`` (``CreateTime`` only; 0 by default) is how much earlier than the newest
    record a producer may stamp one that reaches the broker later: the watermark stays that far
    behind the newest record, and a caught-up partition's advances to its last poll's start
    less it (Beam Java's ``withCreateTime(maxDelay)``).
    """

    processing_time_policy = kafka_records.PROCESSING_TIME
    create_time_policy = kafka_records.CREATE_TIME
    log_append_time = kafka_records.LOG_APPEND_TIME

    def __init__(
        self,
        consumer_config: Mapping[str, Any],
        topics: Iterable[str],
        key_deserializer: Any = None,
        value_deserializer: Any = None,
        start_read_time: int | None = None,
        max_num_records: int | None = None,
        max_read_time: float | None = None,
        commit_offset_in_finalize: bool = False,
        timestamp_policy: str = kafka_records.PROCESSING_TIME,
        consumer_polling_timeout: float = 2,
        with_metadata: bool = False,
        expansion_service: Any = None,
        stop_offsets: Mapping[tuple[str, int], int] | None = None,
        stop_read_time: int | None = None,
        dynamic_read_poll_interval_seconds: float | None = None,
        topic_pattern: str | None = None,
        idle_resume_delay_s: float = 1.0,
        max_poll_s: float = 1.0,
        batch_size: int = 500,
        max_idle_resume_delay_s: float | None = None,
        max_fetch_wait_ms: int = MAX_FETCH_WAIT_MS,
        stall_warning_s: float = 60.0,
        max_delay_s: float = 0.0,
    ) -> None:
        super().__init__()
        if not idle_resume_delay_s > 0:
            raise KafkaConfigError(f"idle_resume_delay_s={idle_resume_delay_s} must be > 0.")
        if max_idle_resume_delay_s is None:
            max_idle_resume_delay_s = 4 * idle_resume_delay_s
        if not idle_resume_delay_s <= max_idle_resume_delay_s < float("inf"):
            raise KafkaConfigError(
                f"max_idle_resume_delay_s={max_idle_resume_delay_s} must be finite and at least "
                f"idle_resume_delay_s={idle_resume_delay_s}."
            )
        if max_read_time is not None and not max_read_time > 0:
            raise KafkaConfigError(f"max_read_time={max_read_time} must be > 0 (seconds).")
        self.consumer_config = {k: str(v) for k, v in dict(consumer_config).items()}
        pacing = Pacing.of(self.consumer_config, max_fetch_wait_ms, stall_warning_s)
        if not kafka_client.bootstrap_of(self.consumer_config):
            raise KafkaConfigError(
                "consumer_config has no 'bootstrap.servers'; pass the broker list, e.g. "
                "{'bootstrap.servers': 'localhost:9092'}."
            )
        self.topics = [topics] if isinstance(topics, str) else list(topics or ())
        if not self.topics and topic_pattern is None:
            raise KafkaConfigError("ReadFromKafka needs topics, or a topic_pattern to match.")
        bounded = any(b is not None for b in (max_num_records, stop_read_time, max_read_time))
        if dynamic_read_poll_interval_seconds is not None and (bounded or stop_offsets):
            raise KafkaConfigError(
                "dynamic_read_poll_interval_seconds discovers partitions of an unbounded read; "
                "drop it, or drop max_num_records, max_read_time, stop_offsets and "
                "stop_read_time."
            )
        if dynamic_read_poll_interval_seconds is None:
            self.listing = "Partitions" >> beam.ParDo(
                ListPartitions(
                    self.consumer_config, self.topics, topic_pattern, start_read_time,
                    max_num_records, dict(stop_offsets or {}), max_read_time,
                )
            ).with_output_types(
                PartitionElement if max_read_time is None else PartitionUntilElement
            )  # fmt: skip
        else:
            self.listing = "Discover" >> DiscoverPartitions(
                self.consumer_config, self.topics, topic_pattern, start_read_time,
                float(dynamic_read_poll_interval_seconds),
            )  # fmt: skip
        self.reader = (_ReadPartitions if bounded else _ReadUnboundedPartitions)(
            self.consumer_config,
            kafka_records.RecordMaker(
                key_deserializer, value_deserializer, timestamp_policy, with_metadata, max_delay_s
            ),
            commit_offset_in_finalize=commit_offset_in_finalize,
            poll_timeout_s=float(consumer_polling_timeout),
            stop_read_time=stop_read_time,
            idle_resume_delay_s=idle_resume_delay_s,
            max_idle_resume_delay_s=max_idle_resume_delay_s,
            max_poll_s=max_poll_s,
            batch_size=batch_size,
            pacing=pacing,
        )

    def expand(self, pbegin):
        if isinstance(self.listing.transform, DiscoverPartitions):
            partitions = pbegin | self.listing
        else:
            partitions = pbegin | "Impulse" >> beam.Impulse() | self.listing
        # The reader outputs its records in this one window (GLOBAL_WINDOWS).
        assert partitions.windowing.windowfn == beam.window.GlobalWindows()
        # A polled batch is one element, handed on record by record by a fused ParDo: Beam's
        # SDF output path costs ~1.4 us a record (a Timestamp each), a plain ParDo's does not.
        batches = partitions | "Read" >> beam.ParDo(self.reader).with_output_types(PolledBatch)
        return batches | "Records" >> beam.ParDo(_Records())


class _Records(beam.DoFn):
    """A polled batch's records, each already a ``WindowedValue`` with its own timestamp."""

    def process(self, batch):
        return batch


class _PolledBatchCoder(beam.coders.Coder):
    """A polled batch goes from the read to `_Records` inside one fused stage, not encoded;
    Beam's size sampling of the read's output asks this coder for an estimate, which a pickle
    of 500 records would cost more than reading them (one byte a record: not measured)."""

    def encode(self, batch: PolledBatch) -> bytes:
        return beam.coders.PickleCoder().encode(list(batch))

    def decode(self, encoded: bytes) -> PolledBatch:
        return PolledBatch(beam.coders.PickleCoder().decode(encoded))

    def estimate_size(self, batch: PolledBatch) -> int:
        return len(batch)

    def to_type_hint(self):
        return PolledBatch


beam.coders.registry.register_coder(PolledBatch, _PolledBatchCoder)


class _ReadPartitions(KafkaRestrictionProvider, beam.DoFn):
    """The SDF, its own restriction provider: reads one topic-partition's restriction per call
    (see the module docstring)."""

    def __init__(
        self, config, records, *, commit_offset_in_finalize, poll_timeout_s, stop_read_time,
        idle_resume_delay_s, max_idle_resume_delay_s, max_poll_s, batch_size, pacing,
    ) -> None:  # fmt: skip
        KafkaRestrictionProvider.__init__(self, config)
        self.config, self.records = config, records
        self.commit_offset_in_finalize = commit_offset_in_finalize
        self.poll_timeout_s, self.stop_read_time = poll_timeout_s, stop_read_time
        self.idle_resume_delay_s, self.max_poll_s = idle_resume_delay_s, max_poll_s
        self.max_idle_s = max_idle_resume_delay_s
        self.batch_size = batch_size
        self.pacing: Pacing = pacing
        self._consumers = Consumers(config)  # none made until a read asks

    def setup(self):
        self._to_commit: dict[tuple[str, int], int] = {}

    def finish_bundle(self):
        # Beam Python's BundleFinalizerParam does not work with a RestrictionParam (the tracker
        # is passed twice): offsets are committed when the bundle finishes (lag monitoring only).
        if self._to_commit:
            from confluent_kafka import TopicPartition

            offsets = [TopicPartition(t, p, o) for (t, p), o in self._to_commit.items()]
            consumer = self._consumers.get(self.pacing.start_ms)
            consumer.commit(offsets=offsets, asynchronous=False)
            self._to_commit.clear()

    def teardown(self):
        self._consumers.close()

    def process(
        self,
        element,
        tracker=beam.DoFn.RestrictionParam(),
        watermark=beam.DoFn.WatermarkEstimatorParam(KafkaWatermarkEstimatorProvider()),
    ):
        topic, partition = element[0], element[1]
        until_ms = element[4] if len(element) > 4 else None  # max_read_time's end, epoch ms
        restriction = tracker.current_restriction()
        idle_since = getattr(restriction, "idle_since", None)
        pace = self.pacing.pace_of(restriction, time.time())
        hold = Hold(topic, partition, restriction.start, self._consumers.get(pace.wait_ms))
        deadline = time.monotonic() + self.max_poll_s
        last, taken = None, 0
        try:
            while True:
                slice_s, polled_at = self.pacing.slice_s(pace), time.time()
                messages = kafka_client.poll(hold.consumer, self.batch_size, slice_s)
                if not messages:
                    if self._nothing(hold, pace, tracker, until_ms):
                        return
                    continue
                hold.quiet_from = time.monotonic()
                at_end, away, batch = False, False, []
                for message in messages:
                    if message.error() is None:
                        batch.append(message)
                        at_end = False  # a record after the end event: not the end any more
                    elif self._at_end(message, hold):
                        at_end = True
                    else:
                        away = True
                ours = self._claim(batch, tracker)
                if ours:
                    yield self.records.windowed_batch(batch[:ours], Timestamp.now(), watermark)
                    last, taken = batch[ours - 1].offset(), taken + ours
                    hold.position = last + 1
                    progressed(pace)
                if ours < len(batch) or _past(until_ms):
                    tracker.try_claim(UNBOUNDED)  # the rest is not ours: done
                    return
                if last is not None and last + 1 >= tracker.current_restriction().stop:
                    return  # the restriction is done: no empty residual to schedule
                if at_end or away or (ours and hold.reached_end()):
                    if not away:  # a broker that is away may hold records: the watermark waits
                        watermark.advance_to(self.records.idle_watermark(polled_at))
                    if _past(self.stop_read_time) or _past(until_ms):
                        tracker.try_claim(UNBOUNDED)
                        return
                    self._rest(tracker, taken, idle_since)
                    return
                more = ours and hold.more_since_start(self.batch_size)
                if more or time.monotonic() >= deadline:
                    mark_idle_since(tracker, None)
                    tracker.defer_remainder()  # not caught up: the next round reads on
                    return
        finally:
            hold.release()
            if self.commit_offset_in_finalize and last is not None:
                self._to_commit[(topic, partition)] = last + 1

    def _nothing(self, hold: Hold, pace, tracker, until_ms: int | None) -> bool:
        """A poll slice got nothing. A lagging partition gets a longer fetch wait and the call
        goes on; after ``poll_timeout_s`` of nothing (the broker away, or too slow even at the
        longest wait) the remainder is deferred, not caught up, and a stall is named in a
        warning. True: the call is over."""
        kafka_client.check_credentials(hold.consumer, self.config)
        if _past(until_ms):
            tracker.try_claim(UNBOUNDED)  # max_read_time is up: done
            return True
        now = time.time()
        lags = hold.lags()
        if lags and self.pacing.grow(pace, now):
            hold.take(self._consumers.get(pace.wait_ms))
            return False
        if time.monotonic() - hold.quiet_from < self.poll_timeout_s:
            return False
        if lags:
            age_s = self._consumers.age_s(hold.consumer)
            end = hold.end_seen
            warning = self.pacing.stall_warning(pace, now, hold.name, hold.position, end, age_s)
            if warning is not None:
                warnings.warn(warning, KafkaReadStalledWarning, stacklevel=2)
        tracker.defer_remainder(Duration(seconds=self.idle_resume_delay_s))
        return True

    def _rest(self, tracker, taken: int, idle_since: float | None) -> None:
        """Defer a caught-up partition: to the next round if this call took ``batch_size``
        records or more (a busy partition: waiting the resume delay there held each record up
        to that long, and a window's end as long), else ``idle_resume_delay_s`` away, or, once
        its reads have found nothing for ``max_idle_resume_delay_s`` (the streak that
        ``idle_since`` began, carried to the residual), that long; on the delay's wall-clock
        grid."""
        now = time.time()
        if taken >= self.batch_size:
            mark_idle_since(tracker, None)
            tracker.defer_remainder()
            return
        if taken:
            idle_since = None  # records: the quiet streak ends
        elif idle_since is None:
            idle_since = now  # nothing: a streak begins
        mark_idle_since(tracker, idle_since)
        quiet = idle_since is not None and now - idle_since >= self.max_idle_s
        delay = self.max_idle_s if quiet else self.idle_resume_delay_s
        tracker.defer_remainder(Duration(seconds=idle_wait(delay, now)))

    def _claim(self, batch: list, tracker) -> int:
        """How many of ``batch`` (in offset order) this call claimed, in one claim: those
        before its first record at or past ``stop_read_time``, up to the restriction's stop."""
        n = len(batch)
        if self.stop_read_time is not None:
            stop = self.stop_read_time
            n = next((i for i, m in enumerate(batch) if m.timestamp()[1] >= stop), n)
        if n == 0:
            return 0
        claim = ClaimUpTo(batch[n - 1].offset())
        if not tracker.try_claim(claim):
            return 0
        if claim.claimed == claim.last:
            return n
        return sum(1 for m in batch[:n] if m.offset() <= claim.claimed)

    def _at_end(self, message, hold: Hold) -> bool:
        """An event: True at the partition's end, False for a broker that is away (either
        ends the call: retried after the resume delay, nothing is lost); raises on an error
        no retry can mend, and closes the consumer first on a fatal one (librdkafka: the
        consumer cannot go on), the one error that calls for a new consumer."""
        from confluent_kafka import KafkaError

        error = message.error()
        code = error.code()
        if code == KafkaError._PARTITION_EOF:
            return True
        if code in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT):
            return False
        if error.fatal() or not error.retriable():
            if error.fatal():
                self._consumers.drop(hold.consumer)
                hold.consumer = None
            bootstrap = kafka_client.bootstrap_of(self.config)
            raise KafkaBrokerUnreachableError(f"{bootstrap} ({hold.name})", error)
        return False  # a retriable error: no proof of the end either


def _past(until_ms: int | None) -> bool:
    """Whether the wall clock is at or past ``until_ms`` (epoch ms; None: never)."""
    return until_ms is not None and time.time() * 1000 >= until_ms


def idle_wait(delay_s: float, now: float) -> float:
    """How long a caught-up partition waits before it polls again: about ``delay_s``, ending
    on a multiple of it on the wall clock (at least a quarter of it away), so that partitions
    deferred in different rounds resume in the same one."""
    wait = delay_s - now % delay_s
    return wait + delay_s if wait < delay_s / 4 else wait


class _ReadUnboundedPartitions(_ReadPartitions):
    """The same read, its output marked unbounded (no bound was given)."""

    @beam.DoFn.unbounded_per_element()
    def process(
        self,
        element,
        tracker=beam.DoFn.RestrictionParam(),
        watermark=beam.DoFn.WatermarkEstimatorParam(KafkaWatermarkEstimatorProvider()),
    ):
        yield from super().process(element, tracker, watermark)

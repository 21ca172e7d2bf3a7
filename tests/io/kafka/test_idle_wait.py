"""A caught-up partition's wait: on its delay's wall-clock grid (partitions poll together), and
long only once its polls have found nothing for a while (real broker for the read)."""

from __future__ import annotations

import math
import threading
import time
import uuid

import pytest
from apache_beam.io.restriction_trackers import OffsetRange
from apache_beam.runners.sdf_utils import RestrictionTrackerView, ThreadsafeRestrictionTracker

from sparkbeam.io import ReadFromKafka
from sparkbeam.io.errors import KafkaConfigError
from sparkbeam.io.kafka_read import idle_wait
from sparkbeam.io.kafka_restrictions import (
    UNBOUNDED,
    KafkaOffsetRange,
    KafkaOffsetTracker,
    KafkaRestrictionProvider,
    KafkaWatermarkEstimator,
)


@pytest.mark.parametrize(
    "now", [1000.0, 1000.3, 1000.49, 1000.51, 1000.74, 1000.76, 1000.99, 1234.5678]
)
def test_the_wait_is_about_the_delay_and_ends_on_its_grid(now):
    for delay in (0.1, 1.0, 4.0):
        wait = idle_wait(delay, now)
        assert delay / 4 <= wait <= 1.25 * delay  # about the delay: never a busy poll
        resume = now + wait
        assert math.isclose(resume / delay, round(resume / delay), abs_tol=1e-6)


def test_two_partitions_deferred_in_different_rounds_resume_together():
    """Each resumes at the same grid point, so one round polls both (not one round each)."""
    first = 500.02 + idle_wait(1.0, 500.02)
    second = 500.41 + idle_wait(1.0, 500.41)
    assert math.isclose(first, second)


@pytest.mark.parametrize(
    "settings",
    [
        {"idle_resume_delay_s": 0},
        {"idle_resume_delay_s": 2.0, "max_idle_resume_delay_s": 1.0},
        {"max_idle_resume_delay_s": math.inf},
    ],
)
def test_bad_delays_are_refused_by_name(settings):
    with pytest.raises(KafkaConfigError, match="idle_resume_delay_s"):
        ReadFromKafka({"bootstrap.servers": "127.0.0.1:1"}, ["t"], **settings)


def _read_once(reader, topic: str, restriction: OffsetRange) -> tuple[KafkaOffsetRange, float]:
    """One call of the read; its residual (through the restriction coder, as a checkpoint
    keeps it) and the resume delay it asked for, in seconds."""
    tracker = ThreadsafeRestrictionTracker(KafkaOffsetTracker(restriction))
    element = (topic, 0, restriction.start, UNBOUNDED)
    list(reader.process(element, RestrictionTrackerView(tracker), KafkaWatermarkEstimator(None)))
    residual, delay = tracker.deferred_status()
    coder = KafkaRestrictionProvider({}).restriction_coder()
    return coder.decode(coder.encode(residual)), delay.micros / 1e6


def test_a_partition_backs_off_only_once_its_polls_have_found_nothing_for_a_while(kafka_broker):
    """Short polls while records come now and then; the long wait once it has been quiet for
    ``max_idle_resume_delay_s`` (a first poll that finds nothing no longer backs off at once,
    which made the next record wait 4x the delay)."""
    topic = "idle-" + uuid.uuid4().hex[:8]
    kafka_broker.create_topic(topic, 1)
    kafka_broker.produce(topic, [(b"k", b"v0", None)], partition=0)
    reader = ReadFromKafka(
        kafka_broker.config(), [topic], idle_resume_delay_s=1.0, max_idle_resume_delay_s=8.0
    ).reader
    reader.setup()
    try:
        # A plain OffsetRange (a checkpoint written before the streak was kept) reads as usual.
        residual, delay = _read_once(reader, topic, OffsetRange(0, UNBOUNDED))
        assert (residual.start, residual.idle_since) == (1, None)
        assert delay <= 1.25
        residual, delay = _read_once(reader, topic, residual)  # nothing: a streak begins
        assert residual.idle_since == pytest.approx(time.time(), abs=10)
        assert delay <= 1.25
        residual.idle_since -= 9  # as if its polls had found nothing for 9 s
        quiet, delay = _read_once(reader, topic, residual)
        assert quiet.idle_since == residual.idle_since
        assert 2.0 <= delay <= 10.0  # the long wait, on its 8 s grid
        kafka_broker.produce(topic, [(b"k", b"v1", None)], partition=0)
        residual, delay = _read_once(reader, topic, quiet)  # a record ends the streak
        assert (residual.start, residual.idle_since) == (2, None)
        assert delay <= 1.25
    finally:
        reader.teardown()


@pytest.mark.parametrize("batch_size", [5000, 50])
def test_a_read_of_a_partition_written_every_few_ms_ends_once_it_has_taken_what_is_there(
    kafka_broker, batch_size
):
    """librdkafka's EOF event needs a fetch that finds nothing new, which a partition written
    every few ms seldom answers: such a read went on for its whole ``max_poll_s`` (issue 43's
    soak: every round as long as that, a partition after another). It ends once it has read
    what its newest fetch saw. Then, having taken less than a batch, it waits the resume delay
    as a caught-up read does; having taken a batch or more (a busy partition), it reads on in
    the next round: the delay held each record, and the end of its window, up to that long
    (the sustained-rate benchmark's 15,000 records/s: window end -> visible p99 2.4 -> 1.5 s)."""
    from confluent_kafka import Producer

    topic = "busy-" + uuid.uuid4().hex[:8]
    kafka_broker.create_topic(topic, 1)
    producer = Producer(kafka_broker.config(**{"linger.ms": "0"}))
    stop = threading.Event()

    def write() -> None:
        while not stop.is_set():
            producer.produce(topic, key=b"k", value=b"v", partition=0)
            producer.poll(0)
            time.sleep(0.002)
        producer.flush(10)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    reader = ReadFromKafka(
        kafka_broker.config(), [topic], idle_resume_delay_s=1.0, max_poll_s=20.0,
        batch_size=batch_size,
    ).reader  # fmt: skip
    reader.setup()
    try:
        time.sleep(1.0)
        started = time.monotonic()
        residual, delay = _read_once(reader, topic, OffsetRange(0, UNBOUNDED))
        took = time.monotonic() - started
    finally:
        stop.set()
        writer.join(15)
        reader.teardown()
    assert 50 < residual.start < 5000  # it read what was there: more than 50, less than 5000
    assert took < 5.0, f"the read went on for {took:.1f} s"
    if batch_size > residual.start:
        assert 0.25 <= delay <= 1.25  # caught up: the resume delay, on its grid
    else:
        assert delay == 0  # busy: the next round reads on


def test_a_read_of_a_partition_written_faster_than_it_is_fetched_ends_at_its_first_backlog(
    kafka_broker,
):
    """Every fetch of a partition written at thousands of records a second brings more: the
    read went on for its whole ``max_poll_s`` (a round as long, its records waiting for it),
    or, caught up with a fetch for an instant, advanced the watermark to the clock and waited
    the resume delay while records kept coming (the sustained-rate benchmark, issue 45). It
    ends once it has read what the partition held when it began and a batch or more came
    since: the rest is for the next round, at once, and the watermark stays at what was read
    (the partition is not caught up)."""
    from confluent_kafka import Producer

    topic = "fast-" + uuid.uuid4().hex[:8]
    kafka_broker.create_topic(topic, 1)
    producer = Producer(kafka_broker.config(**{"linger.ms": "1"}))
    stop = threading.Event()

    def write() -> None:  # bursts of 2,000 records: more than a batch comes during a read
        while not stop.is_set():
            for _ in range(2000):
                producer.produce(topic, key=b"k", value=b"v" * 100, partition=0)
            producer.poll(0)
            time.sleep(0.02)
        producer.flush(10)

    kafka_broker.produce(topic, [(b"k", b"v" * 100, None)] * 50_000, partition=0)
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    reader = ReadFromKafka(
        kafka_broker.config(), [topic], idle_resume_delay_s=1.0, max_poll_s=20.0,
        timestamp_policy=ReadFromKafka.create_time_policy,
    ).reader  # fmt: skip
    reader.setup()
    try:
        _wait_for_records(kafka_broker, topic, 54_000)
        tracker = ThreadsafeRestrictionTracker(KafkaOffsetTracker(OffsetRange(0, UNBOUNDED)))
        watermark = KafkaWatermarkEstimator(None)
        started = time.monotonic()
        element = (topic, 0, 0, UNBOUNDED)
        batches = list(reader.process(element, RestrictionTrackerView(tracker), watermark))
        took = time.monotonic() - started
        residual, delay = tracker.deferred_status()
    finally:
        stop.set()
        writer.join(15)
        reader.teardown()
    records = sum(len(batch.value) for batch in batches)
    assert records >= 54_000 and residual.start == records  # it read a backlog, and stopped
    assert took < 10.0, f"the read went on for {took:.1f} s"
    assert delay.micros == 0  # more is there: the next round reads it at once
    newest = max(r.timestamp_micros for batch in batches for r in batch.value)
    assert watermark.current_watermark().micros == newest  # not advanced to the clock


def _wait_for_records(kafka_broker, topic: str, n: int) -> None:
    """Until partition 0 of ``topic`` holds ``n`` records (a minute at most)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(kafka_broker.config(**{"group.id": "count-" + topic}))
    try:
        deadline = time.monotonic() + 60
        while consumer.get_watermark_offsets(TopicPartition(topic, 0), 5)[1] < n:
            assert time.monotonic() < deadline, f"{topic} got fewer than {n} records in a minute"
            time.sleep(0.1)
    finally:
        consumer.close()

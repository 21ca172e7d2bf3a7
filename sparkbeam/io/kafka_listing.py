"""Which topic-partitions a ``ReadFromKafka`` covers, and where each starts and stops.

Owns: the listing when the job first starts (``ListPartitions``: every partition of the topics
and of those matching ``topic_pattern``, with its start and, for bounded reads, its stop; a
restore continues from the checkpointed residuals instead), and, with
``dynamic_read_poll_interval_seconds``, the listing while the job runs
(``DiscoverPartitions``: a ``PeriodicImpulse`` lists them again and a step with checkpointed
state per ``<topic>-<partition>`` passes each on once, so a restored job reads none twice). A
partition starts where Kafka's consumer would start it: ``start_read_time``, else the group's
committed offset, else ``auto.offset.reset``. Leaves to others: reading (``kafka_read``),
broker questions (``kafka_client``).
"""

from __future__ import annotations

import re
import time
import typing

import apache_beam as beam
from apache_beam.coders import BooleanCoder
from apache_beam.transforms.periodicsequence import PeriodicImpulse
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec
from apache_beam.utils.timestamp import Timestamp

from sparkbeam.io import kafka_client
from sparkbeam.io.kafka_restrictions import UNBOUNDED, PartitionElement

TopicPartition = typing.Tuple[str, int]  # noqa: UP006 - Beam's coder registry


class _Starts:
    """Where a partition's read starts (needs a consumer)."""

    def __init__(self, config: dict, start_read_time: int | None) -> None:
        self.config, self.start_read_time = config, start_read_time

    def start(self, client, topic: str, partition: int) -> int:
        if self.start_read_time is not None:
            return kafka_client.offset_for_time(client, topic, partition, self.start_read_time)
        if "group.id" in self.config:
            from confluent_kafka import TopicPartition as Tp

            (committed,) = client.committed([Tp(topic, partition)], timeout=10)
            if committed.offset >= 0:
                return committed.offset
        reset = self.config.get("auto.offset.reset", "latest")
        if reset in ("earliest", "smallest", "beginning"):
            return kafka_client.low_offset(client, topic, partition)
        return kafka_client.end_offset(client, topic, partition)


def list_topic_partitions(client, config, topics, pattern) -> list[tuple[str, int]]:
    """``(topic, partition)`` of ``topics`` and of the topics matching ``pattern`` (a regular
    expression matched against the whole name, as Kafka's Java consumer does)."""
    bootstrap = kafka_client.bootstrap_of(config)
    names = list(topics)
    if pattern is not None:
        regex = re.compile(pattern)
        names += sorted(
            t for t in kafka_client.topic_names(client, bootstrap)
            if regex.fullmatch(t) and t not in names
        )  # fmt: skip
    return [(t, p) for t in names for p in kafka_client.partitions_of(client, t, bootstrap)]


class ListPartitions(beam.DoFn):
    """Impulse -> ``(topic, partition, start, stop)`` for every partition of the topics, and
    with ``max_read_time`` when the read ends, in epoch ms (checkpointed with each residual:
    a resumed job keeps the same end)."""

    def __init__(
        self, config, topics, pattern, start_read_time, max_num_records, stop_offsets,
        max_read_time=None,
    ):  # fmt: skip
        self.config, self.topics, self.pattern = config, topics, pattern
        self.starts = _Starts(config, start_read_time)
        self.max_num_records, self.stop_offsets = max_num_records, stop_offsets
        self.max_read_time = max_read_time

    def process(self, _impulse):
        client = kafka_client.question_consumer(self.config)
        try:
            parts = list_topic_partitions(client, self.config, self.topics, self.pattern)
            starts = {tp: self.starts.start(client, *tp) for tp in parts}
            stops = self._stops(client, parts, starts)
        finally:
            kafka_client.close(client)
        until = (
            () if self.max_read_time is None else (int((time.time() + self.max_read_time) * 1000),)
        )
        for topic, partition in parts:
            yield (topic, partition, starts[(topic, partition)], stops[(topic, partition)], *until)

    def _stops(self, client, parts, starts) -> dict[tuple[str, int], int]:
        stops = {tp: self.stop_offsets.get(tp, UNBOUNDED) for tp in parts}
        if self.max_num_records is None:
            return stops
        # Share the total by backlog first, then round-robin what is left (those partitions
        # wait for records that are not there yet).
        left = int(self.max_num_records)
        shares = dict.fromkeys(parts, 0)
        for tp in parts:
            backlog = kafka_client.end_offset(client, *tp) - starts[tp]
            cap = stops[tp] - starts[tp]
            shares[tp] = max(0, min(backlog, cap, left))
            left -= shares[tp]
        i = 0
        while left > 0 and parts:
            shares[parts[i % len(parts)]] += 1
            left, i = left - 1, i + 1
        return {tp: min(stops[tp], starts[tp] + shares[tp]) for tp in parts}


class DiscoverPartitions(beam.PTransform):
    """Every ``interval_s``: list the partitions; each one new to the job goes on once, as
    ``(topic, partition, start, UNBOUNDED)``."""

    def __init__(self, config, topics, pattern, start_read_time, interval_s: float) -> None:
        super().__init__()
        self.config, self.topics, self.pattern = config, topics, pattern
        self.start_read_time, self.interval_s = start_read_time, interval_s

    def expand(self, pbegin):
        ticks = pbegin | "Every" >> PeriodicImpulse(
            start_timestamp=Timestamp.now(), fire_interval=self.interval_s
        )
        listed = ticks | "List" >> beam.ParDo(
            _ListNow(self.config, self.topics, self.pattern)
        ).with_output_types(typing.Tuple[str, TopicPartition])  # noqa: UP006
        first = _FirstSeen(self.config, self.start_read_time)
        return listed | "New" >> beam.ParDo(first).with_output_types(PartitionElement)


class _ListNow(beam.DoFn):
    """A tick -> ``("<topic>-<partition>", (topic, partition))`` for each partition now."""

    def __init__(self, config, topics, pattern) -> None:
        self.config, self.topics, self.pattern = config, topics, pattern

    def setup(self):
        self._client = kafka_client.consumer(self.config)

    def process(self, _tick):
        for topic, partition in list_topic_partitions(
            self._client, self.config, self.topics, self.pattern
        ):
            yield f"{topic}-{partition}", (topic, partition)

    def teardown(self):
        kafka_client.close(self._client)


class _FirstSeen(beam.DoFn):
    """Passes a topic-partition on the first time it is listed (state per partition)."""

    SEEN = ReadModifyWriteStateSpec("seen", BooleanCoder())

    def __init__(self, config, start_read_time) -> None:
        self.config, self.starts = config, _Starts(config, start_read_time)

    def setup(self):
        self._client = kafka_client.question_consumer(self.config)

    def process(self, keyed, seen=beam.DoFn.StateParam(SEEN)):
        if seen.read():
            return
        topic, partition = keyed[1]
        yield (topic, partition, self.starts.start(self._client, topic, partition), UNBOUNDED)
        seen.write(True)

    def teardown(self):
        kafka_client.close(self._client)

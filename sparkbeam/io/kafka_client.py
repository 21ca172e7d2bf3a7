"""What sparkbeam asks a Kafka broker, over confluent-kafka (librdkafka), with the workarounds.

Owns: consumers for a source (``consumer``; each remembers the broker's refusal of its
credentials, which librdkafka reports only to an error callback) or for broker questions
(``question_consumer``), a topic's partitions (``partitions_of``, with one-line errors for an
unreachable broker, refused credentials or a missing topic), a partition's end offset
(``end_offset``) and the first offset at or after a time (``offset_for_time``). Leaves to
others: reading records (``kafka_read``).

Two broker answers are not trusted, because Tansu (the test broker) gets them wrong:

- ``ListOffsets(latest)`` returns the base offset of the last record *batch* plus one, not the
  high watermark (1 after 1,000 records produced in one batch). A Fetch response carries the
  true one, so ``end_offset`` fetches the record before that answer and reads librdkafka's
  cached watermark.
- ``ListOffsets(timestamp)`` returns the oldest offset whatever the time. ``offset_for_time``
  checks the answer against the records around it and, when wrong, binary-searches the
  partition by single-record fetches (timestamps assumed non-decreasing within a partition).

On a real Kafka broker both checks cost one small fetch and agree with the broker.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from typing import Any

from sparkbeam.io.errors import (
    KafkaBrokerUnreachableError,
    KafkaCredentialsError,
    KafkaTopicMissingError,
)

log = logging.getLogger(__name__)

METADATA_TIMEOUT_S = 10.0
FETCH_TIMEOUT_S = 5.0
CLOSE_TIMEOUT_S = 10.0
QUESTION_FETCH_WAIT_MS = 500

# A source's consumer defaults (consumer_config overrides them): partitions are assigned (no
# group rebalancing), offsets live in sparkbeam's checkpoint.
SOURCE_DEFAULTS = {
    "enable.auto.commit": "false",
    "enable.auto.offset.store": "false",
    "enable.partition.eof": "true",
    # The broker holds a fetch that finds nothing new this long, and a caught-up read waits
    # for two such fetches (the EOF event's and the previous read's): 100 ms made it 200 ms.
    # The starting wait: it grows for a partition that lags (kafka_pace).
    "fetch.wait.max.ms": "5",
}


# What a client needs to reach and authenticate to the broker (a producer's config, minus
# what only a producer takes, makes its probe consumer).
_CONNECTION_KEYS = ("bootstrap.servers", "metadata.broker.list", "security.protocol", "client.id")
_CONNECTION_PREFIXES = ("sasl.", "ssl.", "socket.")


def connection_config(config: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v for k, v in config.items()
        if k in _CONNECTION_KEYS or k.startswith(_CONNECTION_PREFIXES)
    }  # fmt: skip


def consumer(config: dict[str, Any], **overrides: Any):
    """A confluent-kafka Consumer for ``config`` (a group id is made up if it has none);
    ``credentials_refused`` is then the broker's last refusal of its SASL/TLS handshake."""
    merged = {**SOURCE_DEFAULTS, **{k: str(v) for k, v in config.items()}, **overrides}
    merged.setdefault("group.id", "sparkbeam-" + uuid.uuid4().hex[:12])
    given = config.get("error_cb")
    holder: dict[str, Any] = {}

    def on_error(error) -> None:
        if error.code() in _credential_codes():
            holder["refused"] = error
        if callable(given):
            given(error)

    merged["error_cb"] = on_error
    client = _consumer_type()(merged)
    client.holder = holder
    return client


def question_consumer(config: dict[str, Any]):
    """A consumer for broker questions (``end_offset``, ``offset_for_time``): each fetches a
    record that exists, so a long fetch wait costs nothing and lets a slow broker answer."""
    return consumer(config, **{"fetch.wait.max.ms": str(QUESTION_FETCH_WAIT_MS)})


@functools.cache
def _consumer_type():
    from confluent_kafka import Consumer

    class SourceConsumer(Consumer):
        holder: dict[str, Any]

        @property
        def credentials_refused(self):
            return self.holder.get("refused")

    return SourceConsumer


@functools.cache
def _credential_codes() -> frozenset:
    from confluent_kafka import KafkaError

    return frozenset((KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED,
                      KafkaError._SSL))  # fmt: skip


def check_credentials(client: Any, config: dict[str, Any]) -> None:
    """Raise if the broker refused ``client``'s credentials (a read that gets nothing: not an
    outage to wait out, as no retry with the same credentials can succeed)."""
    refused = getattr(client, "credentials_refused", None)
    if refused is not None:
        raise KafkaCredentialsError(bootstrap_of(config), refused.str())


def _metadata(client: Any, bootstrap: str, topic: str | None = None):
    """The broker's metadata (of ``topic``, else of every topic), asked for in 1 s slices for
    up to ``METADATA_TIMEOUT_S``: between them a consume call serves the error callback, so a
    refusal of the client's credentials ends the wait at once with its own error."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + METADATA_TIMEOUT_S
    while True:
        left = deadline - time.monotonic()
        try:
            return client.list_topics(topic, timeout=max(0.1, min(1.0, left)))
        except KafkaException as e:
            failed = e.args[0] if e.args else e
        if not client.assignment():  # nothing assigned: no record to take by mistake
            client.consume(1, timeout=0)
        check_credentials(client, {"bootstrap.servers": bootstrap})
        if left <= 1.0:
            raise KafkaBrokerUnreachableError(bootstrap, failed)


def poll(client: Any, batch_size: int, timeout_s: float) -> list:
    """Up to ``batch_size`` records and events, as soon as any arrived (``[]`` after
    ``timeout_s`` without any): librdkafka's ``consume(n, timeout)`` waits for ``n`` messages
    or the whole timeout, so this takes what is queued, else waits for the first message."""
    messages = client.consume(batch_size, timeout=0)
    if messages:
        return messages
    first = client.poll(timeout_s)
    if first is None:
        return []
    return [first, *client.consume(batch_size - 1, timeout=0)] if batch_size > 1 else [first]


def close(client: Any) -> None:
    """Close ``client`` without waiting more than ``CLOSE_TIMEOUT_S``: librdkafka's close
    can block for as long as a broker does not answer, and a task must not hang on it."""
    closer = threading.Thread(target=client.close, name="kafka-close", daemon=True)
    closer.start()
    closer.join(CLOSE_TIMEOUT_S)
    if closer.is_alive():
        log.warning(
            "A Kafka consumer did not close within %.0f s; left to finish alone.", CLOSE_TIMEOUT_S
        )


def bootstrap_of(config: dict[str, Any]) -> str:
    return str(config.get("bootstrap.servers", config.get("metadata.broker.list", "")))


def partitions_of(client: Any, topic: str, bootstrap: str) -> list[int]:
    """The partition ids of ``topic``; one-line errors when the broker or topic is missing."""
    from confluent_kafka import KafkaError

    metadata = _metadata(client, bootstrap, topic)
    found = metadata.topics.get(topic)
    missing = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)
    if found is None or (found.error is not None and found.error.code() in missing):
        raise KafkaTopicMissingError(topic, bootstrap)
    if found.error is not None and found.error.code() != KafkaError.NO_ERROR:
        raise KafkaBrokerUnreachableError(bootstrap, found.error)
    if not found.partitions:
        raise KafkaTopicMissingError(topic, bootstrap)
    return sorted(found.partitions)


def topic_names(client: Any, bootstrap: str) -> list[str]:
    """Every topic the broker lists (internal ones, ``__...``, left out)."""
    metadata = _metadata(client, bootstrap)
    return sorted(t for t in metadata.topics if not t.startswith("__"))


def low_offset(client: Any, topic: str, partition: int) -> int:
    from confluent_kafka import TopicPartition

    low, _ = client.get_watermark_offsets(TopicPartition(topic, partition), timeout=FETCH_TIMEOUT_S)
    return max(0, low)


def end_offset(client: Any, topic: str, partition: int) -> int:
    """The offset the next record of the partition gets (its high watermark), from a fetch."""
    from confluent_kafka import TopicPartition

    tp = TopicPartition(topic, partition)
    low, listed = client.get_watermark_offsets(tp, timeout=FETCH_TIMEOUT_S)
    if listed <= max(low, 0):
        return max(listed, 0)
    record = _record_at(client, topic, partition, listed - 1)
    _, high = client.get_watermark_offsets(tp, cached=True)
    if record is not None:
        high = max(high, record.offset() + 1)
    return max(high, listed)


def offset_for_time(client: Any, topic: str, partition: int, time_ms: int) -> int:
    """The first offset whose record timestamp is >= ``time_ms`` (the end offset if none)."""
    from confluent_kafka import TopicPartition

    (answer,) = client.offsets_for_times(
        [TopicPartition(topic, partition, time_ms)], timeout=FETCH_TIMEOUT_S
    )
    low, high = low_offset(client, topic, partition), end_offset(client, topic, partition)
    offset = high if answer.offset < 0 else answer.offset
    later = offset >= high or _timestamp(client, topic, partition, offset) >= time_ms
    if later and (offset <= low or _timestamp(client, topic, partition, offset - 1) < time_ms):
        return offset  # the broker's answer is right: the first record at or after the time
    return _search(client, topic, partition, time_ms, low, high)


def _search(client: Any, topic: str, partition: int, time_ms: int, low: int, high: int) -> int:
    while low < high:
        mid = (low + high) // 2
        if _timestamp(client, topic, partition, mid) < time_ms:
            low = mid + 1
        else:
            high = mid
    return low


def _timestamp(client: Any, topic: str, partition: int, offset: int) -> int:
    record = _record_at(client, topic, partition, offset)
    return -1 if record is None else record.timestamp()[1]


def _record_at(client: Any, topic: str, partition: int, offset: int):
    """The first record at or after ``offset`` (None if the partition ends before it)."""
    from confluent_kafka import KafkaError, TopicPartition

    client.assign([TopicPartition(topic, partition, offset)])
    try:
        while True:
            records = client.consume(1, timeout=FETCH_TIMEOUT_S)
            if not records:
                break
            record = records[0]
            if record.error() is None:
                return record
            if record.error().code() == KafkaError._PARTITION_EOF:
                return None
            raise KafkaBrokerUnreachableError(f"{topic}-{partition}", record.error())
        _, high = client.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
        if high > offset:  # the record is there: not the end, a broker too slow to answer
            raise KafkaBrokerUnreachableError(
                f"{topic}-{partition}",
                f"no record at offset {offset} within {FETCH_TIMEOUT_S:.0f} s although the "
                f"partition ends at {high}",
            )
        return None
    finally:
        client.unassign()

"""How a Kafka record becomes a Beam element: deserializers, timestamps, the record shapes.

Owns: the Python equivalents of Beam's Java (de)serializer class names (so a pipeline written
for ``apache_beam.io.kafka`` keeps its arguments; ``WriteToKafka`` uses the serializers), the
timestamp policies (``ProcessingTime``, ``CreateTime``, ``LogAppendTime``), and the element:
``(key, value)`` or, ``with_metadata=True``, a ``beam.Row`` with the fields of Beam's Kafka rows
(``topic``, ``partition``, ``offset``, ``timestamp``, ``timestampTypeId``,
``timestampTypeName``, ``key``, ``value``, ``headers`` as rows of ``key``/``value``), and a
polled batch's values in the global window. Leaves to others: polling (``kafka_read``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils import windowed_value
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from sparkbeam.io.errors import KafkaConfigError, KafkaDeserializeError

PROCESSING_TIME = "ProcessingTime"
CREATE_TIME = "CreateTime"
LOG_APPEND_TIME = "LogAppendTime"
POLICIES = (PROCESSING_TIME, CREATE_TIME, LOG_APPEND_TIME)
_TIMESTAMP_TYPE_NAMES = {0: "NoTimestampType", 1: "CreateTime", 2: "LogAppendTime"}

_JAVA = "org.apache.kafka.common.serialization."
GLOBAL_WINDOWS = (GlobalWindow(),)


def _signed(data: bytes) -> int:
    return int.from_bytes(data, "big", signed=True)


def _identity(data: bytes) -> bytes:
    return data


JAVA_DESERIALIZERS: dict[str, Callable[[bytes], Any]] = {
    _JAVA + "ByteArrayDeserializer": _identity,
    _JAVA + "StringDeserializer": lambda data: data.decode("utf-8"),
    _JAVA + "LongDeserializer": _signed,
    _JAVA + "IntegerDeserializer": _signed,
    _JAVA + "ShortDeserializer": _signed,
}
JAVA_SERIALIZERS: dict[str, Callable[[Any], bytes]] = {
    _JAVA + "ByteArraySerializer": _identity,
    _JAVA + "StringSerializer": lambda v: v.encode("utf-8"),
    _JAVA + "LongSerializer": lambda v: struct.pack(">q", v),
    _JAVA + "IntegerSerializer": lambda v: struct.pack(">i", v),
}


def python_fn(arg: str, given: Any, java: dict[str, Callable], shape: str) -> Callable:
    """The function for argument ``arg`` (``key_deserializer`` & co): ``given`` if callable,
    the Python equivalent of a Java class name in ``java``, or (None) bytes as they are."""
    if given is None:
        return _identity
    if callable(given):
        return given
    if isinstance(given, str) and given in java:
        return java[given]
    raise KafkaConfigError(
        f"{arg}={given!r} is neither a Python callable ({shape}) nor one of the Java classes "
        f"sparkbeam maps to Python ({', '.join(sorted(java))}). Pass a callable."
    )


def check_policy(policy: str, max_delay_s: float) -> str:
    if policy not in POLICIES:
        raise KafkaConfigError(
            f"timestamp_policy={policy!r} is not one of {', '.join(POLICIES)} (Beam's "
            "ReadFromKafka policies). Pick one of them."
        )
    if not 0 <= max_delay_s < float("inf"):
        raise KafkaConfigError(f"max_delay_s={max_delay_s} must be a finite number >= 0.")
    if max_delay_s and policy != CREATE_TIME:
        raise KafkaConfigError(
            f"max_delay_s={max_delay_s} bounds how late a producer's create time reaches the "
            f"broker; it applies to timestamp_policy={CREATE_TIME!r}, not {policy!r}: drop it."
        )
    return policy


class PolledBatch(list):
    """A polled batch's records as ``WindowedValue``s: the read's one element a batch."""


def _key_value(message) -> tuple:
    return (message.key(), message.value())


class RecordMaker:
    """Turns a confluent-kafka ``Message`` into the element and its event time."""

    def __init__(
        self, key_deserializer, value_deserializer, policy: str, with_metadata: bool, max_delay_s
    ) -> None:
        self.key_fn, self.value_fn = (
            python_fn(f"{which}_deserializer", given, JAVA_DESERIALIZERS, "bytes -> value")
            for which, given in (("key", key_deserializer), ("value", value_deserializer))
        )
        self.policy, self.with_metadata = check_policy(policy, max_delay_s), with_metadata
        self.max_delay_micros = int(max_delay_s * 1e6)
        self._as_they_are = not with_metadata and self.key_fn is self.value_fn is _identity

    def windowed_batch(self, batch: list, now: Timestamp, watermark) -> WindowedValue:
        """A non-empty ``batch`` as one element, the list of its records' ``WindowedValue``s in
        the global window (the read's input is, checked in its expand: no per-record window
        assignment), stamped with the earliest of their event times, once ``watermark`` has
        advanced to the largest (less ``max_delay_s``). An event time is ``now`` (one clock read
        a batch) under ``ProcessingTime`` or for a record without a timestamp, else the
        record's; built from int micros: a ``Timestamp`` a record cost 4 of the 4.5 us."""
        now_micros, create = now.micros, windowed_value.create
        if self.policy == PROCESSING_TIME:
            micros = [now_micros] * len(batch)
        else:
            stamps = (message.timestamp() for message in batch)
            micros = [m * 1000 if k and m >= 0 else now_micros for k, m in stamps]
        element = _key_value if self._as_they_are else self.element
        out = [create(element(m), t, GLOBAL_WINDOWS) for m, t in zip(batch, micros)]
        watermark.advance_to(Timestamp(micros=max(micros) - self.max_delay_micros))
        return create(PolledBatch(out), min(micros), GLOBAL_WINDOWS)

    def idle_watermark(self, polled_at: float) -> Timestamp:
        """A caught-up partition's watermark: the time the poll that found its end began (a
        record the broker appends later is stamped later, or, under ``CreateTime``, at most
        ``max_delay_s`` earlier: Beam Java's ``withCreateTime(maxDelay)``)."""
        return Timestamp(micros=int(polled_at * 1e6) - self.max_delay_micros)

    def element(self, message) -> Any:
        key = self._deserialize("key", self.key_fn, message.key(), message)
        value = self._deserialize("value", self.value_fn, message.value(), message)
        if not self.with_metadata:
            return (key, value)
        kind, millis = message.timestamp()
        return beam.Row(
            topic=message.topic(),
            partition=message.partition(),
            offset=message.offset(),
            timestamp=millis,
            timestampTypeId=kind,
            timestampTypeName=_TIMESTAMP_TYPE_NAMES.get(kind, str(kind)),
            key=key,
            value=value,
            headers=[beam.Row(key=k, value=v) for k, v in (message.headers() or [])],
        )

    @staticmethod
    def _deserialize(which: str, fn, data, message) -> Any:
        if data is None:
            return None
        try:
            return fn(data)
        except Exception as e:  # noqa: BLE001 - any user deserializer error becomes one line
            raise KafkaDeserializeError(
                which, message.topic(), message.partition(), message.offset(), e
            ) from None

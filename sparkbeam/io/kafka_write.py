"""``WriteToKafka``: each element produced to a topic by an idempotent producer.

Owns: the sink transform (Beam's ``apache_beam.io.kafka.WriteToKafka`` argument names) and
delivery: records are produced asynchronously and flushed when the bundle finishes; a record
not acknowledged fails the bundle with one line, and the runner retries it. At-least-once: a
retried bundle (or a round replayed after a driver kill) produces its records again; the
idempotent producer (``enable.idempotence``, ``acks=all``) only removes duplicates from
librdkafka's own retries. Exactly-once through Kafka transactions is not built. Leaves to
others: serializers (``kafka_records``), reading (``kafka_read``), broker questions
(``kafka_client``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import apache_beam as beam

from sparkbeam.io import kafka_client
from sparkbeam.io.errors import KafkaBrokerUnreachableError, KafkaConfigError
from sparkbeam.io.kafka_records import JAVA_SERIALIZERS, python_fn

__all__ = ["WriteToKafka"]

PRODUCER_DEFAULTS = {"enable.idempotence": "true", "acks": "all", "linger.ms": "5"}
FLUSH_TIMEOUT_S = 60.0


class WriteToKafka(beam.PTransform):
    """Produce ``(key, value)`` elements (``with_headers=True``: rows with ``key``, ``value``
    and optional ``headers`` of ``key``/``value`` rows) to ``topic``; at-least-once."""

    def __init__(
        self,
        producer_config: Mapping[str, Any],
        topic: str,
        key_serializer: Any = None,
        value_serializer: Any = None,
        with_headers: bool = False,
        expansion_service: Any = None,
    ) -> None:
        super().__init__()
        config = {**PRODUCER_DEFAULTS, **{k: str(v) for k, v in dict(producer_config).items()}}
        if not kafka_client.bootstrap_of(config):
            raise KafkaConfigError(
                "producer_config has no 'bootstrap.servers'; pass the broker list, e.g. "
                "{'bootstrap.servers': 'localhost:9092'}."
            )
        key_fn, value_fn = (
            python_fn(f"{which}_serializer", given, JAVA_SERIALIZERS, "value -> bytes")
            for which, given in (("key", key_serializer), ("value", value_serializer))
        )
        self.fn = _Produce(config, topic, key_fn, value_fn, with_headers)

    def expand(self, pcoll):
        return pcoll | "Produce" >> beam.ParDo(self.fn)


class _Produce(beam.DoFn):
    def __init__(self, config, topic, key_fn, value_fn, with_headers) -> None:
        self.config, self.topic = config, topic
        self.key_fn, self.value_fn, self.with_headers = key_fn, value_fn, with_headers
        self._producer = None

    def setup(self):
        from confluent_kafka import Producer

        bootstrap = kafka_client.bootstrap_of(self.config)
        probe = kafka_client.consumer(kafka_client.connection_config(self.config))
        try:
            kafka_client.partitions_of(probe, self.topic, bootstrap)
        finally:
            probe.close()
        self._producer = Producer(self.config)

    def start_bundle(self):
        self._failures: list[Any] = []

    def process(self, element):
        if self.with_headers:
            key, value = element.key, element.value
            headers = [(h.key, h.value) for h in (getattr(element, "headers", None) or [])]
        else:
            (key, value), headers = element, None
        record = {
            "key": None if key is None else self.key_fn(key),
            "value": None if value is None else self.value_fn(value),
            "on_delivery": self._delivered,
        }
        if headers:
            record["headers"] = headers
        while True:
            try:
                self._producer.produce(self.topic, **record)
                break
            except BufferError:  # librdkafka's queue is full: let it send
                self._producer.poll(0.1)
        self._producer.poll(0)

    def _delivered(self, error, _message) -> None:
        if error is not None:
            self._failures.append(error)

    def finish_bundle(self):
        left = self._producer.flush(FLUSH_TIMEOUT_S)
        if left or self._failures:
            cause = self._failures[0] if self._failures else f"{left} records unacknowledged"
            raise KafkaBrokerUnreachableError(
                f"{kafka_client.bootstrap_of(self.config)} (topic {self.topic!r})", cause
            )

    def teardown(self):
        if self._producer is not None:
            self._producer.flush(FLUSH_TIMEOUT_S)
            self._producer = None

"""Exceptions of sparkbeam.io's Kafka source and sink.

Owns: one small class per failure a user can act on, each subclassing a builtin, with a
one-line message that names the broker, topic or partition and ends with what to do; and the
warning of a lagging partition that makes no progress (``KafkaReadStalledWarning``). Leaves to
others: deciding when to raise.
"""

from __future__ import annotations


class KafkaBrokerUnreachableError(ConnectionError):
    """No broker of ``bootstrap.servers`` answered a metadata request."""

    def __init__(self, bootstrap: str, cause: object) -> None:
        super().__init__(
            f"Kafka broker {bootstrap!r} did not answer ({cause}). Check bootstrap.servers in "
            "consumer_config/producer_config and that the broker runs; no record was read or "
            "lost, and a restart from the checkpoint resumes where the job stopped."
        )


class KafkaCredentialsError(PermissionError):
    """The broker answered, and refused the client's SASL or TLS handshake."""

    def __init__(self, bootstrap: str, cause: object) -> None:
        super().__init__(
            f"Kafka broker {bootstrap!r} refused this client's credentials ({cause}). Check "
            "security.protocol, sasl.mechanism, sasl.username/sasl.password (or the ssl.* "
            "settings) in consumer_config/producer_config; no record was read or lost."
        )


class KafkaTopicMissingError(LookupError):
    """A topic to read from or write to does not exist on the broker."""

    def __init__(self, topic: str, bootstrap: str) -> None:
        super().__init__(
            f"Kafka topic {topic!r} does not exist on {bootstrap!r}. Create it (e.g. "
            f"`kafka-topics --create --topic {topic}`) or fix the topics argument."
        )


class KafkaDeserializeError(ValueError):
    """A key or value deserializer raised on a record."""

    def __init__(self, which: str, topic: str, partition: int, offset: int, cause: object):
        super().__init__(
            f"The {which} deserializer raised on Kafka record {topic}-{partition}@{offset}: "
            f"{cause!r}. Fix the deserializer (or skip the record with a startpoint: "
            f"`sparkbeam startpoints set --key {topic}-{partition} --kind offset --value "
            f"{offset + 1}`); the record's offset was not committed to the checkpoint."
        )


class KafkaConfigError(ValueError):
    """An argument of ReadFromKafka/WriteToKafka has a value sparkbeam cannot use."""


class KafkaReadStalledWarning(UserWarning):
    """A partition has records past its position, and its read got none of them for a while
    (``stall_warning_s``); issued at most once a minute per partition, by ``kafka_pace``."""

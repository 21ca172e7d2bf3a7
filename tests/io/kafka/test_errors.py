"""ReadFromKafka's failures are one line naming the cause: an unreachable broker, refused
credentials (WriteToKafka's too), a missing topic, a deserializer that raises (naming the
record's topic-partition@offset, not committed), and arguments sparkbeam cannot use (at
construction)."""

from __future__ import annotations

import uuid

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.io import ReadFromKafka, WriteToKafka
from sparkbeam.io.errors import KafkaConfigError
from tests.conftest import spark_test_options
from tests.servers import free_port

pytestmark = pytest.mark.spark


def _run(config, topic, **kwargs):
    p = beam.Pipeline(options=PipelineOptions(spark_test_options()))
    _ = p | ReadFromKafka(config, [topic], max_num_records=5, **kwargs)
    p.run().wait_until_finish()


def test_unreachable_broker_and_missing_topic(spark, kafka_broker):
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(Exception, match=rf"Kafka broker '{dead}' did not answer .*no record"):
        _run({"bootstrap.servers": dead}, "t")
    with pytest.raises(Exception, match=r"Kafka topic 'absent' does not exist on '127"):
        _run(kafka_broker.config(), "absent")


def test_credentials_the_broker_refuses_are_one_line_naming_them(spark, kafka_broker):
    """SASL the broker does not accept (Tansu takes no SASL at all: librdkafka reports it as
    the authentication failure a wrong password gives on Kafka) is not "did not answer"."""
    config = kafka_broker.config(
        **{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
           "sasl.username": "reader", "sasl.password": "wrong"}
    )  # fmt: skip
    refused = r"Kafka broker '127[^']*' refused this client's credentials \(.*SASL"
    with pytest.raises(Exception, match=refused) as raised:
        _run(config, "t")
    assert "did not answer" not in str(raised.value)
    p = beam.Pipeline(options=PipelineOptions(spark_test_options()))
    _ = p | beam.Create([(b"k", b"v")]) | WriteToKafka(config, "t")
    with pytest.raises(Exception, match=refused):  # its probe uses the producer's SASL too
        p.run().wait_until_finish()


def test_deserializer_that_raises_names_the_record(spark, kafka_broker):
    topic = "bad-" + uuid.uuid4().hex[:8]
    kafka_broker.create_topic(topic, 1)
    kafka_broker.produce(topic, [(None, b"1", None), (None, b"x", None)], partition=0)

    def to_int(data: bytes) -> int:
        return int(data)

    config = kafka_broker.config(**{"auto.offset.reset": "earliest"})
    with pytest.raises(Exception, match=rf"value deserializer raised on Kafka record {topic}-0@1"):
        _run(config, topic, value_deserializer=to_int)


def test_bad_arguments_fail_at_construction():
    with pytest.raises(KafkaConfigError, match=r"timestamp_policy='Wall' is not one of"):
        ReadFromKafka({"bootstrap.servers": "h:1"}, ["t"], timestamp_policy="Wall")
    with pytest.raises(KafkaConfigError, match=r"consumer_config has no 'bootstrap.servers'"):
        ReadFromKafka({}, ["t"])
    with pytest.raises(KafkaConfigError, match=r"value_deserializer='com.Foo' is neither"):
        ReadFromKafka({"bootstrap.servers": "h:1"}, ["t"], value_deserializer="com.Foo")
    with pytest.raises(KafkaConfigError, match=r"needs topics, or a topic_pattern"):
        ReadFromKafka({"bootstrap.servers": "h:1"}, [])
    with pytest.raises(KafkaConfigError, match=r"discovers partitions of an unbounded read"):
        ReadFromKafka(
            {"bootstrap.servers": "h:1"}, ["t"], max_num_records=5,
            dynamic_read_poll_interval_seconds=1,
        )  # fmt: skip


def test_a_read_whose_credentials_are_refused_fails_instead_of_retrying(kafka_broker):
    """The read loop itself (a streaming job's partitions, listed while the credentials still
    held): a poll that gets nothing because the broker refused them raises the one line,
    where a broker that is away would only be retried after the resume delay."""
    from apache_beam.io.restriction_trackers import OffsetRange
    from apache_beam.runners.sdf_utils import RestrictionTrackerView, ThreadsafeRestrictionTracker

    from sparkbeam.io.errors import KafkaCredentialsError
    from sparkbeam.io.kafka_restrictions import (
        UNBOUNDED,
        KafkaOffsetTracker,
        KafkaWatermarkEstimator,
    )

    config = kafka_broker.config(
        **{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
           "sasl.username": "reader", "sasl.password": "wrong"}
    )  # fmt: skip
    reader = ReadFromKafka(config, ["t"], consumer_polling_timeout=1).reader
    reader.setup()
    try:
        tracker = RestrictionTrackerView(
            ThreadsafeRestrictionTracker(KafkaOffsetTracker(OffsetRange(0, UNBOUNDED)))
        )
        watermark = KafkaWatermarkEstimator(None)
        with pytest.raises(KafkaCredentialsError, match=r"refused this client's credentials"):
            list(reader.process(("t", 0, 0, UNBOUNDED), tracker, watermark))
    finally:
        reader.teardown()


def test_max_delay_s_is_refused_for_a_policy_it_does_not_bound():
    with pytest.raises(KafkaConfigError, match=r"max_delay_s=1 .* applies to .*CreateTime"):
        ReadFromKafka({"bootstrap.servers": "h:1"}, ["t"], max_delay_s=1)

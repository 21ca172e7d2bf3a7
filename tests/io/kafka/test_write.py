"""``sparkbeam.io.WriteToKafka`` on SparkCheckpointRunner, read back with a plain consumer."""

from __future__ import annotations

import uuid

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from confluent_kafka import TopicPartition

from sparkbeam.io import WriteToKafka, kafka_client
from tests.conftest import spark_test_options

pytestmark = pytest.mark.spark

STRING = "org.apache.kafka.common.serialization.StringSerializer"


def _read_all(kafka_broker, topic: str, partitions: int) -> list[tuple[str, str]]:
    client = kafka_client.consumer(kafka_broker.config())
    got = []
    for p in range(partitions):
        end = kafka_client.end_offset(client, topic, p)
        client.assign([TopicPartition(topic, p, 0)])
        while end and (not got or sum(1 for _ in got) < 10**6):
            messages = client.consume(500, timeout=5)
            records = [m for m in messages if m.error() is None]
            got += [(m.key().decode(), m.value().decode()) for m in records]
            if not messages or any(m.offset() >= end - 1 for m in records):
                break
    client.close()
    return got


def test_every_element_is_produced_once_on_a_clean_run(spark, kafka_broker):
    topic = "write-" + uuid.uuid4().hex[:8]
    kafka_broker.create_topic(topic, 2)
    elements = [(f"k{i % 7}", f"v{i}") for i in range(300)]
    options = PipelineOptions(spark_test_options("--parallelism=2"))
    with beam.Pipeline(options=options) as p:
        _ = (
            p
            | beam.Create(elements)
            | WriteToKafka(
                kafka_broker.config(), topic, key_serializer=STRING, value_serializer=STRING
            )
        )
    assert sorted(_read_all(kafka_broker, topic, 2)) == sorted(elements)


def test_missing_topic_fails_with_one_line(spark, kafka_broker):
    options = PipelineOptions(spark_test_options())
    p = beam.Pipeline(options=options)
    _ = p | beam.Create([(b"k", b"v")]) | WriteToKafka(kafka_broker.config(), "no-such-topic")
    with pytest.raises(Exception, match=r"Kafka topic 'no-such-topic' does not exist on '127"):
        p.run().wait_until_finish()

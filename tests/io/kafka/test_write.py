"""``sparkbeam.io.WriteToKafka`` on SparkCheckpointRunner, read back with a plain consumer."""

from __future__ import annotations

import uuid

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.io import WriteToKafka
from tests.conftest import spark_test_options
from tests.io.kafka.kafka_pipeline import STRING, topic_records

pytestmark = pytest.mark.spark


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
    assert sorted(topic_records(kafka_broker, topic, 2)) == sorted(elements)


def test_missing_topic_fails_with_one_line(spark, kafka_broker):
    options = PipelineOptions(spark_test_options())
    p = beam.Pipeline(options=options)
    _ = p | beam.Create([(b"k", b"v")]) | WriteToKafka(kafka_broker.config(), "no-such-topic")
    with pytest.raises(Exception, match=r"Kafka topic 'no-such-topic' does not exist on '127"):
        p.run().wait_until_finish()

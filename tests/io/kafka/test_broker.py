"""The Tansu test broker: started and stopped by PID, and the answers it gets wrong.

Tansu answers ``ListOffsets`` wrongly (latest: the last batch's base offset + 1; a timestamp:
the oldest offset), and an aborted transaction's records reach ``read_committed`` consumers.
These tests pin those limits, so a Tansu that fixes them shows up here, and check that
``sparkbeam.io.kafka_client`` derives the right answers anyway.
"""

from __future__ import annotations

import os

import pytest
from confluent_kafka import Consumer, TopicPartition

from sparkbeam.io import kafka_client
from sparkbeam.io.errors import KafkaBrokerUnreachableError, KafkaTopicMissingError
from tests.servers import free_port, start_kafka_broker, stop_process_group

BASE_MS = 1_700_000_000_000


@pytest.fixture(scope="module")
def topic(kafka_broker):
    """``probe``: 2 partitions of 1,000 records each, produced in large batches, record i at
    ``BASE_MS + 1000 * i``."""
    kafka_broker.create_topic("probe", 2)
    for partition in (0, 1):
        records = [(b"k%d" % i, b"v%d" % i, BASE_MS + 1000 * i) for i in range(1000)]
        kafka_broker.produce("probe", records, partition=partition)
    return "probe"


def _consumer(kafka_broker):
    return kafka_client.consumer(kafka_broker.config())


def test_broker_starts_and_is_gone_after_stop(tmp_path):
    broker = start_kafka_broker(tmp_path)
    try:
        broker.create_topic("t", 1)
        assert kafka_client.partitions_of(_consumer(broker), "t", broker.bootstrap) == [0]
    finally:
        stop_process_group(broker.proc)
    with pytest.raises(ProcessLookupError):
        os.kill(broker.proc.pid, 0)


def test_tansu_lists_the_last_batch_not_the_high_watermark(kafka_broker, topic):
    plain = Consumer(kafka_broker.config(**{"group.id": "probe"}))
    _, listed = plain.get_watermark_offsets(TopicPartition(topic, 0), timeout=5)
    assert listed < 1000  # Tansu's limit: far short of the 1,000 records there
    assert kafka_client.end_offset(_consumer(kafka_broker), topic, 0) == 1000


def test_tansu_answers_any_time_with_the_oldest_offset(kafka_broker, topic):
    plain = Consumer(kafka_broker.config(**{"group.id": "probe"}))
    (answer,) = plain.offsets_for_times([TopicPartition(topic, 1, BASE_MS + 500_000)], timeout=5)
    assert answer.offset == 0  # Tansu's limit: the right answer is 500
    client = _consumer(kafka_broker)
    assert kafka_client.offset_for_time(client, topic, 1, BASE_MS + 500_000) == 500
    assert kafka_client.offset_for_time(client, topic, 1, BASE_MS + 500_001) == 501
    assert kafka_client.offset_for_time(client, topic, 1, BASE_MS - 1) == 0
    assert kafka_client.offset_for_time(client, topic, 1, BASE_MS + 10**9) == 1000


def test_missing_topic_and_unreachable_broker_are_one_line(kafka_broker, monkeypatch):
    with pytest.raises(KafkaTopicMissingError, match=r"'nope' does not exist on '127\.0\.0\.1:"):
        kafka_client.partitions_of(_consumer(kafka_broker), "nope", kafka_broker.bootstrap)
    monkeypatch.setattr(kafka_client, "METADATA_TIMEOUT_S", 1.0)
    dead = f"127.0.0.1:{free_port()}"
    client = kafka_client.consumer({"bootstrap.servers": dead})
    with pytest.raises(KafkaBrokerUnreachableError, match=rf"'{dead}' did not answer"):
        kafka_client.partitions_of(client, "t", dead)


def test_tansu_delivers_aborted_transactions_to_read_committed_consumers(kafka_broker):
    """Why ``WriteToKafka`` has no exactly-once mode yet: the protocol calls succeed, but an
    aborted transaction's record is read as if committed, so a write bound to checkpoints by
    transactions could not be tested here (README, "Reading and writing Kafka")."""
    from confluent_kafka import Producer

    kafka_broker.create_topic("tx", 1)
    producer = Producer(kafka_broker.config(**{"transactional.id": "tx-probe"}))
    producer.init_transactions(10)
    for value, commit in ((b"committed", True), (b"aborted", False)):
        producer.begin_transaction()
        producer.produce("tx", value=value)
        producer.flush(10)
        (producer.commit_transaction if commit else producer.abort_transaction)(10)
    consumer = Consumer(
        kafka_broker.config(**{"group.id": "tx-probe", "isolation.level": "read_committed"})
    )
    consumer.assign([TopicPartition("tx", 0, 0)])
    seen = []
    for _ in range(20):
        seen += [m.value() for m in consumer.consume(10, 0.5) if m.error() is None]
        if len(seen) >= 2:
            break
    consumer.close()
    assert seen == [b"committed", b"aborted"]  # Kafka would deliver b"committed" alone

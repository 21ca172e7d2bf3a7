"""A broker that is down for a while and then back: the streaming read retries at each resume
delay and the output is exact. Tansu keeps its topics in a bucket of the test S3 server (moto),
so a restart on the same port finds them again."""

from __future__ import annotations

import time
import uuid

import apache_beam as beam
import pytest

from sparkbeam.io import ReadFromKafka, WriteToFilesOnCheckpoint
from tests.io.kafka.streaming_job import streaming_options, wait_for_exactly
from tests.servers import start_kafka_broker, stop_process_group

pytestmark = [pytest.mark.spark, pytest.mark.slow]

DOWN_S = 30  # the outage: longer than librdkafka's longest reconnect backoff (10 s)


def _produce(broker, topic: str, first: int, count: int) -> list[str]:
    values = []
    for p in range(2):
        batch = [f"{p}/{i}" for i in range(first, first + count)]
        broker.produce(topic, [(None, v.encode(), None) for v in batch], partition=p)
        values += batch
    return values


def test_a_broker_down_for_30_s_and_back_gives_exact_output(spark, s3_server, tmp_path):
    bucket = "tansu-" + uuid.uuid4().hex[:8]
    s3_server.client().create_bucket(Bucket=bucket)
    broker = start_kafka_broker(tmp_path, s3=s3_server, bucket=bucket)
    port = int(broker.bootstrap.rsplit(":", 1)[1])
    try:
        broker.create_topic("events", 2)
        expected = _produce(broker, "events", 0, 5)
        p = beam.Pipeline(options=streaming_options(tmp_path))
        config = broker.config(**{"auto.offset.reset": "earliest"})
        _ = (
            p
            | ReadFromKafka(config, ["events"], idle_resume_delay_s=0.2)
            | beam.MapTuple(lambda _key, value: value.decode())
            | WriteToFilesOnCheckpoint(str(tmp_path / "out" / "out"))
        )
        run = p.run()
        try:
            wait_for_exactly(str(tmp_path / "out"), expected, run)
            stop_process_group(broker.proc)
            time.sleep(DOWN_S)
            assert run.state not in ("FAILED", "DONE", "CANCELLED"), run.state
            broker = start_kafka_broker(tmp_path, port=port, s3=s3_server, bucket=bucket)
            expected += _produce(broker, "events", 5, 5)
            wait_for_exactly(str(tmp_path / "out"), expected, run)
        finally:
            run.cancel()
    finally:
        stop_process_group(broker.proc)

"""A broker that is down for a while and then back: the streaming read retries at each resume
delay and the output is exact. Tansu keeps its topics in a bucket of the test S3 server (moto),
so a restart on the same port finds them again."""

from __future__ import annotations

import time
import uuid
from collections import Counter

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.io import ReadFromKafka, WriteToFilesOnCheckpoint
from tests.conftest import spark_test_options
from tests.io.kafka.kafka_pipeline import visible
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


def _wait_for(out: str, expected: list[str], run) -> None:
    deadline = time.monotonic() + 120
    while (seen := visible(out)) != Counter(expected):
        assert not set(seen) - set(expected) and max(seen.values(), default=1) == 1, seen
        assert time.monotonic() < deadline, (sorted(set(expected) - set(seen)), run.state)
        time.sleep(0.2)


def test_a_broker_down_for_30_s_and_back_gives_exact_output(spark, s3_server, tmp_path):
    bucket = "tansu-" + uuid.uuid4().hex[:8]
    s3_server.client().create_bucket(Bucket=bucket)
    broker = start_kafka_broker(tmp_path, s3=s3_server, bucket=bucket)
    port = int(broker.bootstrap.rsplit(":", 1)[1])
    try:
        broker.create_topic("events", 2)
        expected = _produce(broker, "events", 0, 5)
        options = PipelineOptions(
            spark_test_options(
                "--streaming", f"--checkpoint_dir={tmp_path / 'ckpt'}",
                "--checkpoint_interval_s=0.05",
            )
        )  # fmt: skip
        p = beam.Pipeline(options=options)
        config = broker.config(**{"auto.offset.reset": "earliest"})
        _ = (
            p
            | ReadFromKafka(config, ["events"], idle_resume_delay_s=0.2)
            | beam.MapTuple(lambda _key, value: value.decode())
            | WriteToFilesOnCheckpoint(str(tmp_path / "out" / "out"))
        )
        run = p.run()
        try:
            _wait_for(str(tmp_path / "out"), expected, run)
            stop_process_group(broker.proc)
            time.sleep(DOWN_S)
            assert run.state not in ("FAILED", "DONE", "CANCELLED"), run.state
            broker = start_kafka_broker(tmp_path, port=port, s3=s3_server, bucket=bucket)
            expected += _produce(broker, "events", 5, 5)
            _wait_for(str(tmp_path / "out"), expected, run)
        finally:
            run.cancel()
    finally:
        stop_process_group(broker.proc)

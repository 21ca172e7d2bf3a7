"""A Kafka -> files streaming job for the kill-and-resume tests, run as a driver subprocess.

``python -m tests.io.kafka.kafka_pipeline --bootstrap H:P --topic T --records N --output DIR``
plus runner flags: reads ``N`` records of ``T`` (all partitions, from the oldest) in batches
of 7 per partition per call, and writes ``"<partition> <offset> <value>"`` lines through the
exactly-once sink; with ``--output-topic`` it also produces them (keyed by partition) to that
topic with ``WriteToKafka``.
"""

from __future__ import annotations

import argparse
import glob
import os
from collections import Counter

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from confluent_kafka import TopicPartition

from sparkbeam.io import ReadFromKafka, WriteToFilesOnCheckpoint, WriteToKafka, kafka_client

STRING = "org.apache.kafka.common.serialization.StringSerializer"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--output-topic")
    args, rest = parser.parse_known_args(argv)
    config = {"bootstrap.servers": args.bootstrap, "auto.offset.reset": "earliest"}
    with beam.Pipeline(options=PipelineOptions(rest)) as p:
        lines = (
            p
            | "Kafka" >> ReadFromKafka(
                config, [args.topic], max_num_records=args.records, with_metadata=True,
                batch_size=7, max_poll_s=0, idle_resume_delay_s=0.1,
            )
            | beam.Map(lambda r: f"{r.partition} {r.offset} {r.value.decode()}")
        )  # fmt: skip
        if args.output_topic:
            producer = {"bootstrap.servers": args.bootstrap}
            _ = (
                lines
                | beam.Map(lambda line: (line.split()[0], line))
                | WriteToKafka(producer, args.output_topic, STRING, STRING)
            )
        _ = lines | WriteToFilesOnCheckpoint(os.path.join(args.output, "out"))


def visible(out_dir: str) -> Counter:
    lines: Counter = Counter()
    for path in glob.glob(os.path.join(out_dir, "out-*")):
        with open(path) as f:
            lines.update(line.rstrip("\n") for line in f if line.strip())
    return lines


def topic_records(kafka_broker, topic: str, partitions: int) -> list[tuple[str, str]]:
    """Every record of ``topic``, as (key, value) strings, read from the oldest (a partition
    that stops answering ends its read: the caller's comparison then names what is missing)."""
    client = kafka_client.consumer(kafka_broker.config())
    got: list[tuple[str, str]] = []
    try:
        for p in range(partitions):
            end, position = kafka_client.end_offset(client, topic, p), 0
            client.assign([TopicPartition(topic, p, 0)])
            while position < end:
                messages = client.consume(500, timeout=5)
                if not messages:
                    break
                for m in messages:
                    if m.error() is None:
                        got.append((m.key().decode(), m.value().decode()))
                        position = m.offset() + 1
    finally:
        client.close()
    return got


if __name__ == "__main__":
    main()

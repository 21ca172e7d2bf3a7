"""A Kafka -> files streaming job for the kill-and-resume tests, run as a driver subprocess.

``python -m tests.io.kafka.kafka_pipeline --bootstrap H:P --topic T --records N --output DIR``
plus runner flags: reads ``N`` records of ``T`` (all partitions, from the oldest) in batches
of 7 per partition per call, and writes ``"<partition> <offset> <value>"`` lines through the
exactly-once sink.
"""

from __future__ import annotations

import argparse
import glob
import os
from collections import Counter

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.io import ReadFromKafka, WriteToFilesOnCheckpoint


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--output", required=True)
    args, rest = parser.parse_known_args(argv)
    config = {"bootstrap.servers": args.bootstrap, "auto.offset.reset": "earliest"}
    with beam.Pipeline(options=PipelineOptions(rest)) as p:
        _ = (
            p
            | "Kafka" >> ReadFromKafka(
                config, [args.topic], max_num_records=args.records, with_metadata=True,
                batch_size=7, max_poll_s=0, idle_resume_delay_s=0.1,
            )
            | beam.Map(lambda r: f"{r.partition} {r.offset} {r.value.decode()}")
            | WriteToFilesOnCheckpoint(os.path.join(args.output, "out"))
        )  # fmt: skip


def visible(out_dir: str) -> Counter:
    lines: Counter = Counter()
    for path in glob.glob(os.path.join(out_dir, "out-*")):
        with open(path) as f:
            lines.update(line.rstrip("\n") for line in f if line.strip())
    return lines


if __name__ == "__main__":
    main()

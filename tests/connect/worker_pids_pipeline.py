"""A tiny pipeline whose tasks append their Python worker daemon's PID (the parent of the
worker process) to a file: ``python worker_pids_pipeline.py OUT --spark_remote=sc://...``."""

from __future__ import annotations

import os
import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions


class DaemonPid(beam.DoFn):
    def __init__(self, out: str) -> None:
        self.out = out

    def process(self, element):
        with open(self.out, "a", encoding="utf-8") as f:
            f.write(f"{os.getppid()}\n")
        yield element


if __name__ == "__main__":
    out, rest = sys.argv[1], sys.argv[2:]
    options = PipelineOptions(["--runner=SparkCheckpointRunner", *rest])
    with beam.Pipeline(options=options) as p:
        _ = p | beam.Create(range(4)) | beam.ParDo(DaemonPid(out))

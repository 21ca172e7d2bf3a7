"""A pipeline run in its own process (own Spark master with task retries) by test_write_to_files.

Usage: sink_pipeline.py MASTER OUT_PREFIX. Every task of the sink's stage fails on its first
attempt, after the sink has staged its file; Spark retries it. Each failing attempt leaves a
file `failed-attempt-<partition>` beside OUT_PREFIX: the test's evidence that it ran (Beam's
per-task error log is off on workers).
"""

from __future__ import annotations

import sys
from pathlib import Path

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.io import WriteToFilesOnCheckpoint

N = 100


class FailFirstAttempt(beam.DoFn):
    """Runs after the sink in the same fused stage: its finish_bundle comes after the sink's."""

    def __init__(self, marker_dir: str):
        self._marker_dir = marker_dir

    def finish_bundle(self):
        from pyspark import TaskContext

        context = TaskContext.get()
        if context.attemptNumber() == 0:
            Path(self._marker_dir, f"failed-attempt-{context.partitionId()}").touch()
            raise RuntimeError("injected failure of the first attempt")


def main(master: str, out_prefix: str) -> None:
    options = PipelineOptions(
        ["--runner=SparkCheckpointRunner", f"--spark_master_url={master}", "--parallelism=2"]
    )
    with beam.Pipeline(options=options) as p:
        (
            p
            | beam.Create([(i % 4, str(i)) for i in range(N)])
            | beam.GroupByKey()
            | beam.FlatMap(lambda kv: kv[1])
            | WriteToFilesOnCheckpoint(out_prefix, ".txt")
            | beam.ParDo(FailFirstAttempt(str(Path(out_prefix).parent)))
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

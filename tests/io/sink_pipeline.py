"""A pipeline run in its own process (own Spark master with task retries) by test_write_to_files.

Usage: sink_pipeline.py MASTER OUT_PREFIX. Every task of the sink's stage fails on its first
attempt, after the sink has staged its file; Spark retries it.
"""

from __future__ import annotations

import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.io import WriteToFilesOnCheckpoint

N = 100


class FailFirstAttempt(beam.DoFn):
    """Runs after the sink in the same fused stage: its finish_bundle comes after the sink's."""

    def finish_bundle(self):
        from pyspark import TaskContext

        if TaskContext.get().attemptNumber() == 0:
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
            | beam.ParDo(FailFirstAttempt())
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

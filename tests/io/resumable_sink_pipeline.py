"""test_write_to_files' kill-and-resume pipeline: a sink fused into a self-checkpointing SDF stage.

argv: output path prefix, then pipeline flags (e.g. --checkpoint_dir URL).
"""

import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.io import WriteToFilesOnCheckpoint
from tests.sdf.sdfs import ChunkedWithDelay


def main(out_prefix: str, flags: list[str]) -> None:
    options = PipelineOptions(
        ["--runner=SparkCheckpointRunner", "--spark_master_url=local[2]", *flags]
    )
    with beam.Pipeline(options=options) as p:
        _ = (
            p
            | beam.Create([("a", 12), ("b", 9), ("c", 15)])
            | beam.ParDo(ChunkedWithDelay(per_call=3, delay_s=0.4))
            | beam.MapTuple(lambda name, pos, _: f"{name},{pos}")
            | WriteToFilesOnCheckpoint(out_prefix, ".txt")
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

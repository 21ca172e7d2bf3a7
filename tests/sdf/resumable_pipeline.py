"""A batch pipeline whose SDF defers every few positions; run by test_batch_resume.py.

argv: output path, then pipeline flags (e.g. --checkpoint_dir URL).
"""

import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from tests.sdf.sdfs import ChunkedWithDelay


def main(out: str, flags: list[str]) -> None:
    options = PipelineOptions(
        ["--runner=SparkCheckpointRunner", "--spark_master_url=local[2]", *flags]
    )
    with beam.Pipeline(options=options) as p:
        _ = (
            p
            | beam.Create([("a", 12), ("b", 9), ("c", 15)])
            | beam.ParDo(ChunkedWithDelay(per_call=3, delay_s=0.4))
            | beam.MapTuple(lambda name, pos, _: f"{name},{pos}")
            | beam.io.WriteToText(out, shard_name_template="")
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

"""A batch pipeline whose SDF defers every few positions; run by test_batch_resume.py.

argv: output path, then pipeline flags (e.g. --checkpoint_dir URL). Taken out before the flags
reach Beam: with ``--side_inputs`` the SDF reads two side inputs in every call
(``side_input_lines``; tests/sdf/test_sdf_side_inputs.py); with ``--sink_prefix=P`` the same
lines also go through ``WriteToFilesOnCheckpoint(P)``, fused into the SDF's stage.
"""

import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.pvalue import AsList, AsSingleton

from sparkbeam.io import WriteToFilesOnCheckpoint
from tests.sdf.sdfs import ChunkedWithDelay, OffsetBySide

SIDE_INPUTS = "--side_inputs"
SINK_PREFIX = "--sink_prefix="
ELEMENTS = [("a", 12), ("b", 9), ("c", 15)]


def side_input_lines(p, elements=ELEMENTS, per_call: int = 3, delay_s: float = 0.4):
    """``elements`` through ``OffsetBySide``: a singleton base of 100, a list of 1000 and 2000."""
    base = p | "Base" >> beam.Create([100])
    extra = p | "Extra" >> beam.Create([1, 2]) | "Thousands" >> beam.Map(lambda x: x * 1000)
    return (
        p
        | beam.Create(elements)
        | beam.ParDo(OffsetBySide(per_call, delay_s), AsSingleton(base), AsList(extra))
    )


def main(out: str, flags: list[str]) -> None:
    side_inputs = SIDE_INPUTS in flags
    sinks = [f[len(SINK_PREFIX) :] for f in flags if f.startswith(SINK_PREFIX)]
    flags = [f for f in flags if f != SIDE_INPUTS and not f.startswith(SINK_PREFIX)]
    options = PipelineOptions(
        ["--runner=SparkCheckpointRunner", "--spark_master_url=local[2]", *flags]
    )
    with beam.Pipeline(options=options) as p:
        if side_inputs:
            lines = side_input_lines(p)
        else:
            lines = (
                p
                | beam.Create(ELEMENTS)
                | beam.ParDo(ChunkedWithDelay(per_call=3, delay_s=0.4))
                | beam.MapTuple(lambda name, pos, _: f"{name},{pos}")
            )
        _ = lines | beam.io.WriteToText(out, shard_name_template="")
        for prefix in sinks:
            _ = lines | WriteToFilesOnCheckpoint(prefix, ".txt")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

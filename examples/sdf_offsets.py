"""An offset-range splittable DoFn that checkpoints itself every K elements.

Each input element is ``(name, size)``; the SDF's restriction is
``OffsetRange(0, size)``. Each call claims positions one by one and emits
``name`` for each; after ``--every`` claims it calls ``tracker.defer_remainder()``
(no delay), so the rest of the range becomes a residual that the runner
re-feeds. At the end the pipeline counts the elements per name and prints them:
each count must equal its size.

    python examples/sdf_offsets.py --runner=SparkCheckpointRunner --output out/offsets
    python examples/sdf_offsets.py --names a=1000,b=2500 --every 100 --runner=DirectRunner

Other flags go to Beam (``--spark_master_url local[2]``, ``--checkpoint_dir DIR``, ...).
"""

from __future__ import annotations

import argparse
import glob
import os

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.sdf import OffsetRangeProvider


class EmitWithCheckpoints(beam.DoFn):
    """Emit ``name`` once per position of ``[0, size)``; defer the rest every ``every`` claims."""

    def __init__(self, every: int = 1000) -> None:
        self.every = every
        self.checkpoints = Metrics.counter("offsets", "checkpoints")

    def process(self, element, tracker=beam.DoFn.RestrictionParam(OffsetRangeProvider())):
        yield from self._emit(element[0], tracker)

    def _emit(self, name, tracker):
        restriction = tracker.current_restriction()
        pos = restriction.start
        end = min(restriction.stop, pos + self.every)
        while pos < end:
            if not tracker.try_claim(pos):
                return
            yield name
            pos += 1
        if pos < tracker.current_restriction().stop:
            self.checkpoints.inc()
            tracker.defer_remainder()


def parse_names(names: str, size: int) -> list[tuple[str, int]]:
    """``a,b`` -> [(a, size), (b, size)]; ``a=10,b=7`` -> [(a, 10), (b, 7)]."""
    out = []
    for item in names.split(","):
        name, sep, n = item.strip().partition("=")
        out.append((name, int(n) if sep else size))
    return out


def build(p: beam.Pipeline, elements: list[tuple[str, int]], every: int, output: str) -> None:
    (
        p
        | "Sizes" >> beam.Create(elements)
        | "Emit" >> beam.ParDo(EmitWithCheckpoints(every))
        | "Count" >> beam.combiners.Count.PerElement()
        | "Format" >> beam.MapTuple(lambda name, n: f"{name}\t{n}")
        | "Write" >> beam.io.WriteToText(output)
    )


def read_counts(output: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for shard in sorted(glob.glob(output + "-*-of-*")):
        with open(shard, encoding="utf-8") as f:
            for line in f.read().splitlines():
                name, n = line.split("\t")
                counts[name] = counts.get(name, 0) + int(n)
    return counts


def run(argv: list[str] | None = None) -> dict[str, int]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--names",
        default="a,b,c",
        help="Names, or name=size pairs, comma-separated. Default: %(default)s",
    )
    parser.add_argument(
        "--size",
        type=int,
        default=100_000,
        help="Size of a name given without =size. Default: %(default)s",
    )
    parser.add_argument(
        "--every",
        type=int,
        default=1000,
        help="Claims per call before defer_remainder(). Default: %(default)s",
    )
    parser.add_argument(
        "--output", default="out/offsets", help="Output prefix. Default: %(default)s"
    )
    args, beam_args = parser.parse_known_args(argv)
    elements = parse_names(args.names, args.size)
    for old in glob.glob(args.output + "-*-of-*"):
        os.remove(old)
    with beam.Pipeline(options=PipelineOptions(beam_args)) as p:
        build(p, elements, args.every, args.output)
    counts = read_counts(args.output)
    for name, size in elements:
        got = counts.get(name, 0)
        print(f"{name}\t{got}" + ("" if got == size else f"\t(expected {size})"))
    return counts


if __name__ == "__main__":
    run()

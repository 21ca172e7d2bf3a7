"""A well-behaved splittable DoFn: read files by line ranges (the "Testing your SDF" example).

Each input element is a file path; its restriction is ``OffsetRange(0, n_lines)``
over line numbers; the tracker is Beam's ``OffsetRestrictionTracker``. Each call
claims line numbers one by one and emits ``(path, line_number, text)``; it never
emits a line it did not claim, so the runner may checkpoint or split it anywhere.

    python examples/line_reader_sdf.py README.md CHANGELOG.md --runner=SparkCheckpointRunner
    sparkbeam sdf-check examples.line_reader_sdf:LineReaderFn --elements '["README.md"]'

Check it like any SDF with ``sparkbeam.sdf.testing.check_sdf(LineReaderFn(), [paths])``.
"""

from __future__ import annotations

import argparse

import apache_beam as beam
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.core import RestrictionProvider


def read_lines(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


class LineRangeProvider(RestrictionProvider):
    """Restriction ``[0, number of lines)`` of a path; initial splits of ``lines_per_split``."""

    def __init__(self, lines_per_split: int = 0) -> None:
        self.lines_per_split = lines_per_split

    def initial_restriction(self, path):
        return OffsetRange(0, len(read_lines(path)))

    def split(self, path, restriction):
        if self.lines_per_split <= 0:
            yield restriction
            return
        yield from restriction.split(self.lines_per_split, self.lines_per_split)

    def create_tracker(self, restriction):
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, path, restriction):
        return restriction.size()


class LineReaderFn(beam.DoFn):
    """Emit ``(path, line_number, text)`` for every line of the claimed range."""

    def __init__(self, lines_per_split: int = 0) -> None:
        self.lines_per_split = lines_per_split

    def process(self, path, tracker=beam.DoFn.RestrictionParam(LineRangeProvider())):
        restriction = tracker.current_restriction()
        lines = read_lines(path)
        pos = restriction.start
        while tracker.try_claim(pos):
            yield path, pos, lines[pos]
            pos += 1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="files to read")
    args, beam_args = parser.parse_known_args(argv)
    with beam.Pipeline(options=PipelineOptions(beam_args)) as p:
        _ = (
            p
            | beam.Create(args.paths)
            | beam.ParDo(LineReaderFn())
            | beam.combiners.Count.PerElement()
            | beam.Map(print)
        )


if __name__ == "__main__":
    main()

"""Beam word count: the demo pipeline of sparkbeam.

Reads text, splits it into words, counts each word and writes ``word: count``
lines. It is an ordinary Apache Beam pipeline; the runner is chosen by the
usual Beam flags:

    python examples/wordcount.py --runner=SparkCheckpointRunner --output out/wordcount
    python examples/wordcount.py --runner=DirectRunner --output out/wordcount

Any flag this script does not know is passed to Beam's PipelineOptions
(e.g. ``--spark_master_url local[2]``).
"""

from __future__ import annotations

import argparse
import os
import re

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

DEFAULT_INPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "sample.txt")
WORD_RE = re.compile(r"[\w']+", re.UNICODE)


def build(p: beam.Pipeline, input_pattern: str, output_prefix: str) -> None:
    """Add the word-count transforms to ``p``."""
    (
        p
        | "Read" >> beam.io.ReadFromText(input_pattern)
        | "Split" >> beam.FlatMap(WORD_RE.findall)
        | "Count" >> beam.combiners.Count.PerElement()
        | "Format" >> beam.MapTuple(lambda word, count: f"{word}: {count}")
        | "Write" >> beam.io.WriteToText(output_prefix)
    )


def run(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--input", default=DEFAULT_INPUT, help="File(s) to read. Default: %(default)s"
    )
    parser.add_argument(
        "--output", default="out/wordcount", help="Output prefix. Default: %(default)s"
    )
    args, beam_args = parser.parse_known_args(argv)
    with beam.Pipeline(options=PipelineOptions(beam_args)) as p:
        build(p, args.input, args.output)


if __name__ == "__main__":
    run()

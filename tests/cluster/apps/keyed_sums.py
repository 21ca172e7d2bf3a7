"""A small batch job for the cluster tests: sums of ``range(--count)`` by ``x % 5``.

Run by the tests as a script (``python keyed_sums.py`` or ``spark-submit keyed_sums.py``);
writes ``key total`` lines under ``--output``. Other flags go to Beam.
"""

import argparse

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", required=True)
    parser.add_argument("--count", type=int, default=100)
    known, beam_args = parser.parse_known_args(argv)
    with beam.Pipeline(options=PipelineOptions(beam_args)) as p:
        (
            p
            | beam.Create(list(range(known.count)))
            | beam.Map(lambda x: (x % 5, x))
            | beam.GroupByKey()
            | beam.MapTuple(lambda k, vs: f"{k} {sum(vs)}")
            | beam.io.WriteToText(known.output)
        )


if __name__ == "__main__":
    main()

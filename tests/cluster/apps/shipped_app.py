"""A job whose DoFn lives in a module next to this script (``cluster_user_fns``).

The tests copy both files to a directory no worker has on its path, and run this script
with ``--spark_master_url``: the executors can only import ``cluster_user_fns`` if sparkbeam
ships it. Writes one JSON line per element under ``--output``.
"""

import argparse

import apache_beam as beam
import cluster_user_fns
from apache_beam.options.pipeline_options import PipelineOptions


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", required=True)
    parser.add_argument("--count", type=int, default=40)
    known, beam_args = parser.parse_known_args(argv)
    with beam.Pipeline(options=PipelineOptions(beam_args)) as p:
        (
            p
            | beam.Create(list(range(known.count)))
            | beam.Reshuffle()
            | beam.ParDo(cluster_user_fns.SquareWhere())
            | beam.io.WriteToText(known.output)
        )


if __name__ == "__main__":
    main()

"""A user's main script: its DoFn comes from the user's own module (see __init__.py), and
every row passes through ``mylib.scale``, the package next to this script, whatever
``--dofn_module`` names."""

import argparse
import importlib
import json
import os
import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from mylib import scale


def with_own_module(row: dict) -> dict:
    """The row, plus where the executor found the package next to the main script."""
    return {**row, "z": scale.scale(row["x"]), "own_file": scale.__file__, "cwd": os.getcwd()}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", required=True)
    parser.add_argument("--dofn_module", default="mylib.probe")
    parser.add_argument("--lib_dir", default=None, help="on the driver's sys.path only")
    args, beam_args = parser.parse_known_args(argv)
    driver_only = [sys.path[0]]
    if args.lib_dir:
        sys.path.insert(0, args.lib_dir)
        driver_only.append(args.lib_dir)
    module = importlib.import_module(args.dofn_module)
    with beam.Pipeline(options=PipelineOptions(beam_args)) as p:
        (
            p
            | beam.Create(list(range(10)))
            | beam.Reshuffle()
            | beam.ParDo(module.Probe(driver_only))
            | beam.Map(with_own_module)
            | beam.Map(json.dumps)
            | beam.io.WriteToText(args.output, shard_name_template="")
        )


if __name__ == "__main__":
    main(sys.argv[1:])
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    if session is not None:
        session.stop()

"""A tiny pure-Python package shipped with --setup_file."""

import os
import sys

import apache_beam as beam


class Probe(beam.DoFn):
    def __init__(self, driver_only: list[str]) -> None:
        self.driver_only = driver_only

    def process(self, x):
        seen = sys.path + os.environ.get("PYTHONPATH", "").split(os.pathsep)
        yield {
            "x": x,
            "y": x * 11,
            "module_file": __file__,
            "leaked": sorted({p for p in self.driver_only if p in seen}),
        }

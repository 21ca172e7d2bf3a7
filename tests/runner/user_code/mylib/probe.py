"""A DoFn that lives in the user's package and reports where it runs from."""

import os
import sys

import apache_beam as beam
from mylib.scale import scale


class Probe(beam.DoFn):
    def __init__(self, driver_only: list[str]) -> None:
        self.driver_only = driver_only

    def process(self, x):
        seen = sys.path + os.environ.get("PYTHONPATH", "").split(os.pathsep)
        yield {
            "x": x,
            "y": scale(x),
            "module_file": __file__,
            "leaked": sorted({p for p in self.driver_only if p in seen}),
        }

"""The user module of ``shipped_app.py``: a DoFn that also says where it ran from."""

import json
import os

import apache_beam as beam


class SquareWhere(beam.DoFn):
    """``x`` -> JSON with ``x * x``, this module's file and the process's working directory."""

    def process(self, x):
        yield json.dumps({"x": x, "square": x * x, "module": __file__, "cwd": os.getcwd()})

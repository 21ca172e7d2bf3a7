"""The slowly updating global-window side input, as a new user writes it (issue 33).

Main input ``PeriodicImpulse`` ticks; the side input is another ``PeriodicImpulse`` mapped to a
version string, in the global window with ``Repeatedly(AfterCount(1))``, DISCARDING, read with
``AsSingleton``. Each main element writes the version it saw, one JSON line per element, to
``--out``. Run as a module by the kill-and-resume test; ``add_pattern`` is shared with the
in-process test. The start time is kept in ``<out>.start`` so that a resumed run builds the
same pipeline as the killed one.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import trigger, window
from apache_beam.transforms.periodicsequence import PeriodicImpulse


class RecordVersion(beam.DoFn):
    """Appends [main timestamp, version seen] to ``path`` (one write per line)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def process(self, tick, version):
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps([float(tick), version]) + "\n")


def add_pattern(p, start: float, main_stop: float, side_stop: float, intervals, out: str):
    """Main ticks at ``intervals[0]`` s, side versions at ``intervals[1]`` s."""
    main_every, side_every = intervals
    side = (
        p
        | "SideTicks" >> PeriodicImpulse(start, side_stop, side_every, apply_windowing=False)
        | "Version" >> beam.Map(lambda t: "v%.3f" % float(t))
        | "Global"
        >> beam.WindowInto(
            window.GlobalWindows(),
            trigger=trigger.Repeatedly(trigger.AfterCount(1)),
            accumulation_mode=trigger.AccumulationMode.DISCARDING,
        )
    )
    ticks = p | "MainTicks" >> PeriodicImpulse(start, main_stop, main_every, apply_windowing=False)
    _ = ticks | "Record" >> beam.ParDo(RecordVersion(out), beam.pvalue.AsSingleton(side))


def read_records(path: str) -> list[tuple[float, float]]:
    """(main timestamp, version time) of every line written."""
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [(tick, float(version[1:])) for tick, version in rows]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--main_for", type=float, default=12.0)  # seconds of main ticks
    parser.add_argument("--side_for", type=float, default=6.0)  # seconds of side versions
    known, rest = parser.parse_known_args(argv)
    start_file = known.out + ".start"
    if not os.path.exists(start_file):
        with open(start_file, "w", encoding="utf-8") as f:
            f.write(repr(time.time() + 1))
    with open(start_file, encoding="utf-8") as f:
        start = float(f.read())
    with beam.Pipeline(options=PipelineOptions(rest)) as p:
        stops = (start + known.main_for, start + known.side_for)
        add_pattern(p, start, *stops, (0.5, 1.5), known.out)


if __name__ == "__main__":
    main()

"""The slowly updating global-window side input, as a new user writes it (issue 33).

Main input ``PeriodicImpulse`` ticks; the side input is another ``PeriodicImpulse`` mapped to a
version string, in the global window with ``Repeatedly(AfterCount(1))``, DISCARDING, read with
``AsSingleton``. Each main element writes the version it saw, one JSON line per element, to
``--out``. Run as a module by the kill-and-resume test; ``add_pattern`` is shared with the
in-process test, which gives both impulses one start time. The module's impulses start when they
first run (``REBASE_ALL``), not when the pipeline is built, so a slow Spark start does not turn
the ticks into one catch-up round (each impulse from its own first run: the side's may start
later or earlier than the main's); a resumed run continues the killed run's ticks (the impulses
ran once, their residuals are stored).
"""

from __future__ import annotations

import argparse
import json
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import trigger, window
from apache_beam.transforms.periodicsequence import PeriodicImpulse, RebaseMode


class RecordVersion(beam.DoFn):
    """Appends [main timestamp, version seen, wall time] to ``path`` (one write per line)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def process(self, tick, version):
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps([float(tick), version, time.time()]) + "\n")


def add_pattern(p, main_for: float, side_for: float, intervals, out: str, start=None):
    """Main ticks every ``intervals[0]`` s for ``main_for`` s; side versions 0, 1, ... every
    ``intervals[1]`` s for ``side_for`` s; from ``start`` (None: each impulse's first run)."""
    main_every, side_every = intervals
    versions = list(range(round(side_for / side_every)))
    rebase = RebaseMode.REBASE_ALL if start is None else RebaseMode.REBASE_NONE
    base = 0 if start is None else start

    def _ticks(seconds: float, every: float, data=None) -> PeriodicImpulse:
        return PeriodicImpulse(
            base, base + seconds, every, apply_windowing=False, data=data, rebase=rebase
        )

    side = (
        p
        | "SideTicks" >> _ticks(side_for, side_every, versions)
        | "Version" >> beam.Map(lambda i: "v%d" % i)
        | "Global"
        >> beam.WindowInto(
            window.GlobalWindows(),
            trigger=trigger.Repeatedly(trigger.AfterCount(1)),
            accumulation_mode=trigger.AccumulationMode.DISCARDING,
        )
    )
    ticks = p | "MainTicks" >> _ticks(main_for, main_every)
    _ = ticks | "Record" >> beam.ParDo(RecordVersion(out), beam.pvalue.AsSingleton(side))


def read_records(path: str) -> list[tuple[float, int]]:
    """(main timestamp, version number) of every line written."""
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [(row[0], int(row[1][1:])) for row in rows]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--main_for", type=float, default=6.0)  # seconds of main ticks
    parser.add_argument("--side_for", type=float, default=4.0)  # seconds of side versions
    known, rest = parser.parse_known_args(argv)
    with beam.Pipeline(options=PipelineOptions(rest)) as p:
        add_pattern(p, known.main_for, known.side_for, (0.5, 1.0), known.out)


if __name__ == "__main__":
    main()

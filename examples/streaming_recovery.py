"""Kill a streaming job with ``kill -9``, run the same command again: every window once.

The job: an offset-style splittable DoFn that behaves like an unbounded source (each
call emits ``--per_round`` records, then defers the rest of its range by ``--delay_s``,
moving its watermark), one source per ``name:count`` in ``--sources``; record ``i`` has
event time ``i`` seconds. Then a ``--window_s`` fixed-window count per source, written
with ``sparkbeam.io.WriteToFilesOnCheckpoint``: a round's files appear only after its
checkpoint commits. The output is deterministic, so ``--check`` can tell a lost or a
duplicated window from a correct run.

    python examples/streaming_recovery.py --output out/recovery/counts \\
        --runner=SparkCheckpointRunner --streaming --checkpoint_dir ckpt/recovery &
    sleep 30; kill -9 $!                                   # mid-run, no clean-up at all
    sparkbeam checkpoints list --checkpoint_dir ckpt/recovery
    python examples/streaming_recovery.py --output out/recovery/counts \\
        --runner=SparkCheckpointRunner --streaming --checkpoint_dir ckpt/recovery
    python examples/streaming_recovery.py --output out/recovery/counts --check

The rerun restores the last committed checkpoint (pending source ranges, buffered
windows, the sink files of that round) and goes on from there. Other flags go to Beam
(``--spark_master_url``, ``--checkpoint_interval_s``, ``--parallelism``, ...).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time
from collections import Counter

import apache_beam as beam
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window
from apache_beam.transforms.core import WatermarkEstimatorProvider
from apache_beam.utils.timestamp import Duration, Timestamp

from sparkbeam.io import WriteToFilesOnCheckpoint
from sparkbeam.sdf import OffsetRangeProvider

DEFAULT_SOURCES = "clicks:1200,views:900"


class ManualWatermark(WatermarkEstimatorProvider):
    def initial_estimator_state(self, element, restriction):
        return None

    def create_watermark_estimator(self, state):
        return ManualWatermarkEstimator(state)


class ReadPositions(beam.DoFn):
    """For ``(name, count)``: emits ``(name, i)`` at event time ``i`` s, ``per_round`` a call."""

    def __init__(self, per_round: int, delay_s: float) -> None:
        self.per_round = per_round
        self.delay_s = delay_s

    def process(
        self,
        element,
        tracker=beam.DoFn.RestrictionParam(OffsetRangeProvider()),
        estimator=beam.DoFn.WatermarkEstimatorParam(ManualWatermark()),
    ):
        pos = tracker.current_restriction().start
        for _ in range(self.per_round):
            if not tracker.try_claim(pos):
                return
            yield window.TimestampedValue((element[0], pos), pos)
            pos += 1
        estimator.set_watermark(Timestamp(pos))  # every later record has event time >= pos
        if pos < tracker.current_restriction().stop:
            tracker.defer_remainder(Duration(seconds=self.delay_s))


class FormatWindow(beam.DoFn):
    def process(self, kv, win=beam.DoFn.WindowParam):
        yield f"{kv[0]} {int(win.start)} {kv[1]}"


def build(p, sources, output: str, window_s: int = 10, per_round: int = 50, delay_s=0.5):
    """The job: sources -> fixed-window count -> exactly-once files under ``output``."""
    return (
        p
        | "Sources" >> beam.Create(sources)
        | "Read" >> beam.ParDo(ReadPositions(per_round, delay_s))
        | "Window" >> beam.WindowInto(window.FixedWindows(window_s))
        | "Count" >> beam.combiners.Count.PerKey()
        | "Format" >> beam.ParDo(FormatWindow())
        | "Write" >> WriteToFilesOnCheckpoint(output)
    )


def parse_sources(text: str) -> list[tuple[str, int]]:
    return [(name, int(n)) for name, n in (s.split(":") for s in text.split(","))]


def expected_lines(sources, window_s: int = 10) -> list[str]:
    """'name window_start count' for every window of every source, sorted."""
    return sorted(
        f"{name} {start} {min(window_s, n - start)}"
        for name, n in sources
        for start in range(0, n, window_s)
    )


def visible_lines(output: str) -> list[str]:
    """Every line of every visible (committed) output file, sorted."""
    lines = []
    for path in glob.glob(output + "-*"):
        with open(path, encoding="utf-8") as f:
            lines.extend(line.rstrip("\n") for line in f if line.strip())
    return sorted(lines)


def check(output: str, sources, window_s: int = 10) -> tuple[list[str], list[str]]:
    """(missing, duplicated) lines of the output, compared with an uninterrupted run."""
    seen = Counter(visible_lines(output))
    want = expected_lines(sources, window_s)
    return [x for x in want if x not in seen], sorted(x for x, n in seen.items() if n > 1)


def start(output: str, sources, beam_args: list[str], window_s=10, per_round=50, delay_s=0.5):
    """Start the job; a ``--streaming`` run returns at once with a live result."""
    p = beam.Pipeline(options=PipelineOptions(beam_args))
    build(p, sources, os.path.abspath(output), window_s, per_round, delay_s)
    return p.run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, help="output file prefix")
    parser.add_argument("--sources", default=DEFAULT_SOURCES, help="name:count,...")
    parser.add_argument("--window_s", type=int, default=10)
    parser.add_argument("--per_round", type=int, default=50, help="records per source call")
    parser.add_argument("--delay_s", type=float, default=0.5, help="delay between calls")
    parser.add_argument("--check", action="store_true", help="only check the output")
    known, beam_args = parser.parse_known_args(argv)
    sources = parse_sources(known.sources)
    if known.check:
        missing, duplicated = check(known.output, sources, known.window_s)
        total = len(expected_lines(sources, known.window_s))
        print(f"{total - len(missing)} of {total} windows present, {len(duplicated)} duplicated")
        for line in missing[:10]:
            print(f"  missing:    {line}")
        for line in duplicated[:10]:
            print(f"  duplicated: {line}")
        return 1 if missing or duplicated else 0
    began = time.time()
    args = (known.window_s, known.per_round, known.delay_s)
    result = start(known.output, sources, beam_args, *args)
    result.wait_until_finish()
    print(f"{result.state} in {time.time() - began:.1f}s; check with --check", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

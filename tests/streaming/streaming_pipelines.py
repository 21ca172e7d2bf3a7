"""Streaming test pipelines: an unbounded-style offset SDF with event time and a windowed count.

Also runnable as a script, so the kill/restart tests can SIGKILL a real driver process:
``python -m tests.streaming.streaming_pipelines --output DIR --checkpoint_dir DIR ...``.
"""

from __future__ import annotations

import argparse
import time

import apache_beam as beam
from apache_beam.transforms import window
from apache_beam.utils.timestamp import Duration, Timestamp

from examples.streaming_recovery import ManualWatermark
from sparkbeam.sdf import OffsetRangeProvider


class EventTimeOffsets(beam.DoFn):
    """For (name, n): emits (name, i) at event time i seconds, i in [0, n).

    Claims ``per_round`` positions per call, then defers the rest by ``delay_s``
    with the watermark set to the next position: it behaves like an unbounded
    source that receives ``per_round`` records every ``delay_s`` seconds. ``claim_sleep_s``
    makes every claimed record take that long, after touching ``running_marker`` (a file): a
    test can then signal the driver while a round is surely running.
    """

    def __init__(
        self,
        per_round: int = 10,
        delay_s: float = 0.05,
        claim_sleep_s: float = 0.0,
        running_marker: str | None = None,
    ) -> None:
        self.per_round = per_round
        self.delay_s = delay_s
        self.claim_sleep_s = claim_sleep_s
        self.running_marker = running_marker

    WATERMARK = ManualWatermark()

    def process(
        self,
        element,
        tracker=beam.DoFn.RestrictionParam(OffsetRangeProvider()),
        estimator=beam.DoFn.WatermarkEstimatorParam(WATERMARK),
    ):
        yield from self.emit(element, tracker, estimator)

    def emit(self, element, tracker, estimator):
        name = element[0]
        pos = tracker.current_restriction().start
        for _ in range(self.per_round):
            if not tracker.try_claim(pos):
                return
            if self.claim_sleep_s:
                if self.running_marker:
                    open(self.running_marker, "w").close()
                time.sleep(self.claim_sleep_s)
            yield window.TimestampedValue((name, pos), pos)
            pos += 1
        estimator.set_watermark(Timestamp(pos))
        if pos < tracker.current_restriction().stop:
            tracker.defer_remainder(Duration(seconds=self.delay_s))


def windowed_counts(
    p, sources, window_s: int = 10, per_round: int = 10, delay_s: float = 0.05, **slow
):
    """'name window_start count' lines for every fixed window of every source.

    ``slow``: ``claim_sleep_s`` and ``running_marker`` of `EventTimeOffsets`."""
    return (
        p
        | "Sources" >> beam.Create(sources)
        | "Read" >> beam.ParDo(EventTimeOffsets(per_round, delay_s, **slow))
        | "Window" >> beam.WindowInto(window.FixedWindows(window_s))
        | "Count" >> beam.combiners.Count.PerKey()
        | "Format" >> beam.ParDo(_FormatWithWindow())
    )


class _FormatWithWindow(beam.DoFn):
    def process(self, kv, win=beam.DoFn.WindowParam):
        yield f"{kv[0]} {int(win.start)} {kv[1]}"


BOUNDED = 25


def expected_lines(sources, window_s: int = 10) -> list[str]:
    """What ``main`` writes: the windowed counts and the bounded lines, sorted."""
    return sorted(expected_counts(sources, window_s) + [f"bounded {i}" for i in range(BOUNDED)])


def expected_counts(sources, window_s: int = 10) -> list[str]:
    lines = []
    for name, n in sources:
        for start in range(0, n, window_s):
            lines.append(f"{name} {start} {min(window_s, n - start)}")
    return sorted(lines)


def main(argv=None) -> None:
    from apache_beam.options.pipeline_options import PipelineOptions

    from sparkbeam.io import WriteToFilesOnCheckpoint

    parser = argparse.ArgumentParser()
    parser.add_argument("--output", required=True)
    parser.add_argument("--sources", default="a:200,b:150")
    parser.add_argument("--per_round", type=int, default=10)
    parser.add_argument("--delay_s", type=float, default=0.05)
    parser.add_argument("--claim_sleep_s", type=float, default=0.0)
    parser.add_argument("--running_marker")
    known, rest = parser.parse_known_args(argv)
    sources = [(s.split(":")[0], int(s.split(":")[1])) for s in known.sources.split(",")]
    options = PipelineOptions(rest)
    start = time.time()
    with beam.Pipeline(options=options) as p:
        slow = {"claim_sleep_s": known.claim_sleep_s, "running_marker": known.running_marker}
        lines = windowed_counts(
            p, sources, per_round=known.per_round, delay_s=known.delay_s, **slow
        )
        # A bounded input flattened with the unbounded one: read exactly once across crashes.
        bounded = (
            p
            | "Bounded" >> beam.Create([f"bounded {i}" for i in range(BOUNDED)])
            | "WindowBounded" >> beam.WindowInto(window.FixedWindows(10))
        )
        _ = (lines, bounded) | beam.Flatten() | WriteToFilesOnCheckpoint(known.output + "/out")
    print(f"finished in {time.time() - start:.1f}s", flush=True)


if __name__ == "__main__":
    main()

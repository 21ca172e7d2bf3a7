"""A TestStream's virtual clock: an hourly trigger and 1-hour SDF resume delays take seconds.

Processing-time triggers and SDF resume delays follow ``advance_processing_time`` (and, once
the events are played out, the clock jumps to the next timer), so the pipeline below -- two
hours of processing time -- ends in seconds, with the same panes on every run.
"""

from __future__ import annotations

import json
import time

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import trigger, window
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Duration
from apache_beam.utils.windowed_value import PaneInfoTiming

from sparkbeam.sdf import OffsetRangeProvider
from tests.conftest import spark_test_options

pytestmark = [pytest.mark.spark, pytest.mark.slow]

HOUR = 3600


class DeferAnHourAfterEachClaim(beam.DoFn):
    """Emits (name, position) for each position of a ``(name, size)`` element, then waits an
    hour (``defer_remainder``) before the next one."""

    def process(self, element, tracker=beam.DoFn.RestrictionParam(OffsetRangeProvider())):
        position = tracker.current_restriction().start
        if tracker.try_claim(position):
            yield element[0], position
            if position + 1 < tracker.current_restriction().stop:
                tracker.defer_remainder(Duration(seconds=HOUR))


class WritePane(beam.DoFn):
    def __init__(self, path: str) -> None:
        self.path = path

    def process(self, kv, pane=beam.DoFn.PaneInfoParam):
        key, values = kv
        timing = PaneInfoTiming.to_string(pane.timing)
        line = json.dumps([key, sorted(values), pane.index, timing])
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def _run(tmp_path, name: str) -> list:
    out = str(tmp_path / f"{name}.jsonl")
    events = (
        TestStream(output_tags={"clicks", "jobs"})
        .add_elements(["x"], tag="clicks")
        .add_elements([TimestampedValue(("job", 3), 0)], tag="jobs")
        .advance_processing_time(HOUR)
        .add_elements(["y", "z"], tag="clicks")
        .advance_processing_time(HOUR)
        .advance_watermark_to_infinity(tag="clicks")
        .advance_watermark_to_infinity(tag="jobs")
    )
    p = beam.Pipeline(options=PipelineOptions(spark_test_options("--streaming")))
    streams = p | events
    _ = (
        streams["clicks"]
        | beam.WindowInto(
            window.GlobalWindows(),
            trigger=trigger.Repeatedly(trigger.AfterProcessingTime(HOUR)),
            accumulation_mode=trigger.AccumulationMode.DISCARDING,
        )
        | "ClickKey" >> beam.Map(lambda c: ("clicks", c))
        | "Clicks" >> beam.GroupByKey()
        | "WriteClicks" >> beam.ParDo(WritePane(out))
    )
    _ = (
        streams["jobs"]
        | beam.ParDo(DeferAnHourAfterEachClaim())
        | "Days" >> beam.WindowInto(window.FixedWindows(24 * HOUR))
        | "Jobs" >> beam.GroupByKey()
        | "WriteJobs" >> beam.ParDo(WritePane(out))
    )
    p.run().wait_until_finish()
    with open(out, encoding="utf-8") as f:
        return sorted(json.loads(line) for line in f)


def test_hourly_trigger_and_hour_long_resume_delays_take_seconds_and_repeat(tmp_path):
    started = time.monotonic()
    first = _run(tmp_path, "first")
    elapsed = time.monotonic() - started
    assert first == [
        ["clicks", ["x"], 0, "EARLY"],
        ["clicks", ["y", "z"], 1, "EARLY"],
        ["job", [0, 1, 2], 0, "ON_TIME"],
    ]
    # Two hours of processing time passed on the TestStream's clock, not the wall clock.
    assert elapsed < HOUR / 4
    assert _run(tmp_path, "second") == first

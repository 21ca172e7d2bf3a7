"""Known-late data and watermark holds with an OUTPUT_AT_EARLIEST timestamp combiner.

Elements behind the watermark when they arrive hold nothing (Beam's model, and Beam's trigger
transcript ``known_late_data_watermark``): with the watermark at 5, elements at 2, 3, 7 and 8
of window [0, 10) give a pane at 7, the earliest element that could still hold the output.
A CombinePerKey must agree with a GroupByKey: a combine lifted into a pre-combine before the
shuffle would merge 2 and 7 into one accumulator at 2, which holds nothing, and the pane would
come out at the end of the window (9) instead.
"""

from __future__ import annotations

import json

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import window
from apache_beam.transforms.window import TimestampCombiner, TimestampedValue

from tests.conftest import spark_test_options

pytestmark = [pytest.mark.spark, pytest.mark.slow]


class WritePane(beam.DoFn):
    def __init__(self, path: str, label: str) -> None:
        self.path, self.label = path, label

    def process(self, kv, timestamp=beam.DoFn.TimestampParam):
        key, values = kv
        values = sorted(values) if isinstance(values, list) else values
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps([self.label, key, values, float(timestamp)]) + "\n")


def test_known_late_elements_hold_nothing_in_a_group_and_a_combine(tmp_path):
    out = str(tmp_path / "panes.jsonl")
    events = (
        TestStream()
        .advance_watermark_to(5)
        .add_elements([TimestampedValue(("k", v), v) for v in (2, 3, 7, 8)])
        .advance_watermark_to(11)
        .advance_watermark_to_infinity()
    )
    with beam.Pipeline(options=PipelineOptions(spark_test_options("--streaming"))) as p:
        windowed = (
            p
            | events
            | beam.WindowInto(
                window.FixedWindows(10), timestamp_combiner=TimestampCombiner.OUTPUT_AT_EARLIEST
            )
        )
        _ = windowed | beam.GroupByKey() | "WriteGroup" >> beam.ParDo(WritePane(out, "group"))
        _ = (
            windowed
            | beam.CombinePerKey(sum)
            | "WriteCombine" >> beam.ParDo(WritePane(out, "combine"))
        )
    with open(out, encoding="utf-8") as f:
        panes = sorted(json.loads(line) for line in f)
    assert panes == [["combine", "k", 20, 7.0], ["group", "k", [2, 3, 7, 8], 7.0]]

"""Triggered side inputs in streaming: each window's view is its latest firing (issue 33).

Beam's programming guide: when a side input has several trigger firings, the main input reads
the value of the latest one. Under a TestStream (panes of a CombinePerKey with early firings),
with the slowly updating global-window ``AsSingleton`` pattern, and across a SIGKILL and resume.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import trigger, window
from apache_beam.transforms.window import TimestampedValue

from tests.conftest import TEST_MASTER, spark_test_options
from tests.streaming.side_input_pipelines import add_pattern, read_records

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _Record(beam.DoFn):
    def __init__(self, path: str) -> None:
        self.path = path

    def process(self, element, side):
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps([element, sorted(side)]) + "\n")


def test_each_main_element_reads_the_latest_accumulating_pane_of_its_window(spark, tmp_path):
    """Early panes 100, then 150 (ACCUMULATING) in window [0, 5): a2 reads [150], not both."""
    out = str(tmp_path / "seen.jsonl")
    events = (
        TestStream()
        .add_elements([TimestampedValue(("k", 100), 1)], tag="side")
        .add_elements([TimestampedValue("a1", 2)], tag="main")
        .add_elements([TimestampedValue(("k", 50), 3)], tag="side")
        .add_elements([TimestampedValue("a2", 4)], tag="main")
        .add_elements([TimestampedValue(("k", 400), 7)], tag="side")
        .add_elements([TimestampedValue("b1", 7)], tag="main")
        .advance_watermark_to_infinity(tag="main")
        .advance_watermark_to_infinity(tag="side")
    )
    with beam.Pipeline(options=PipelineOptions(spark_test_options("--streaming"))) as p:
        stream = p | events
        side = (
            stream["side"]
            | "Side"
            >> beam.WindowInto(
                window.FixedWindows(5),
                trigger=trigger.AfterWatermark(early=trigger.AfterCount(1)),
                accumulation_mode=trigger.AccumulationMode.ACCUMULATING,
            )
            | beam.CombinePerKey(sum)
            | beam.Values()
        )
        main = stream["main"] | "Main" >> beam.WindowInto(window.FixedWindows(5))
        _ = main | beam.ParDo(_Record(out), beam.pvalue.AsList(side))
    with open(out, encoding="utf-8") as f:
        seen = sorted(json.loads(line) for line in f)
    # a2 came after window [0, 5)'s second pane. (A main element waits until the side input
    # has a first pane in some window, not in its own: b1 comes after [5, 10)'s.)
    assert seen == [["a1", [100]], ["a2", [150]], ["b1", [400]]]


def _version(t: float) -> float:
    return float("%.3f" % t)  # as side_input_pipelines writes it


def _check_versions(records, side_start: float, side_every: float, side_stop: float):
    """Each main element saw one version; versions never go back as main time goes on."""
    by_tick: dict[float, set[float]] = {}
    for tick, version in records:
        by_tick.setdefault(tick, set()).add(version)
    assert all(len(v) == 1 for v in by_tick.values()), by_tick
    in_order = [next(iter(by_tick[t])) for t in sorted(by_tick)]
    assert in_order == sorted(in_order), in_order
    count = round((side_stop - side_start) / side_every)
    assert set(in_order) <= {_version(side_start + i * side_every) for i in range(count)}
    return by_tick, in_order


def test_global_window_singleton_sees_each_new_version_in_turn(spark, tmp_path):
    out = str(tmp_path / "seen.jsonl")
    start = time.time() + 0.5
    main_stop, side_stop = start + 7.5, start + 6  # side versions at 0, 1.5, 3, 4.5 s
    options = PipelineOptions(
        spark_test_options("--streaming", f"--checkpoint_dir={tmp_path / 'ckpt'}")
    )
    with beam.Pipeline(options=options) as p:
        add_pattern(p, start, main_stop, side_stop, (0.5, 1.5), out)
    by_tick, in_order = _check_versions(read_records(out), start, 1.5, side_stop)
    assert len(by_tick) == 15  # every main tick, once
    assert len(set(in_order)) >= 4, in_order  # at least 4 firings seen, in turn


def _run(tmp_path, crash_at: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable)
    env.pop("SPARKBEAM_CRASH_AT", None)
    if crash_at:
        env["SPARKBEAM_CRASH_AT"] = crash_at
    cmd = [
        sys.executable, "-m", "tests.streaming.side_input_pipelines",
        "--out", str(tmp_path / "seen.jsonl"), "--main_for", "12", "--side_for", "6",
        "--runner=SparkCheckpointRunner", f"--spark_master_url={TEST_MASTER}",
        "--streaming", "--checkpoint_dir", str(tmp_path / "ckpt"), "--parallelism=2",
    ]  # fmt: skip
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_killed_and_resumed_singleton_keeps_its_latest_version(tmp_path):
    killed = _run(tmp_path, crash_at="after-commit:3")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    before = read_records(str(tmp_path / "seen.jsonl"))
    assert before and len({t for t, _ in before}) < 24  # the kill interrupted the main ticks
    resumed = _run(tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    with open(tmp_path / "seen.jsonl.start", encoding="utf-8") as f:
        start = float(f.read())
    records = read_records(str(tmp_path / "seen.jsonl"))
    by_tick, in_order = _check_versions(records, start, 1.5, start + 6)
    assert len(by_tick) == 24  # every main tick: none lost across the kill
    assert in_order[-1] == _version(start + 4.5)  # the last version, read after the resume

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
            seen = sorted(side) if isinstance(side, list) else side
            f.write(json.dumps([element, seen]) + "\n")


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


def test_a_global_window_singleton_is_read_anew_in_each_round(spark, tmp_path):
    """Beam's invoker keeps globally windowed side-input arguments for the life of a bundle
    processor, and processors are reused across tasks: m2 would read the first version."""
    out = str(tmp_path / "seen.jsonl")
    events = (
        TestStream()
        .add_elements(["first"], tag="side")
        .add_elements(["m1"], tag="main")
        .add_elements(["second"], tag="side")
        .add_elements(["m2"], tag="main")
        .add_elements(["m3"], tag="main")
        .advance_watermark_to_infinity(tag="main")
        .advance_watermark_to_infinity(tag="side")
    )
    with beam.Pipeline(options=PipelineOptions(spark_test_options("--streaming"))) as p:
        stream = p | events
        side = stream["side"] | "Latest" >> beam.WindowInto(
            window.GlobalWindows(),
            trigger=trigger.Repeatedly(trigger.AfterCount(1)),
            accumulation_mode=trigger.AccumulationMode.DISCARDING,
        )
        _ = stream["main"] | beam.ParDo(_Record(out), beam.pvalue.AsSingleton(side))
    with open(out, encoding="utf-8") as f:
        seen = sorted(json.loads(line) for line in f)
    assert seen == [["m1", "first"], ["m2", "second"], ["m3", "second"]]


def _check_versions(records, ticks: int, versions: int) -> list[int]:
    """Each main tick saw one version (of the side's ``versions``), and versions never go back
    as main time goes on. Returns the versions in main-time order."""
    by_tick: dict[float, set[int]] = {}
    for tick, version in records:
        by_tick.setdefault(tick, set()).add(version)
    assert len(by_tick) == ticks  # every main tick, none lost
    assert all(len(v) == 1 for v in by_tick.values()), by_tick
    in_order = [next(iter(by_tick[t])) for t in sorted(by_tick)]
    assert in_order == sorted(in_order), in_order
    assert set(in_order) <= set(range(versions)), in_order
    return in_order


def test_global_window_singleton_sees_each_new_version_in_turn(spark, tmp_path):
    """4 side firings (0-3 s), 16 main ticks (0-7.5 s) from one start: each tick reads one
    version (AsSingleton raises if its view holds two), never an older one than the tick
    before; the last tick reads the 4th (a main task emits ticks due when it runs, so a tick
    can run rounds after a version it reads: 4.5 s of slack for a loaded machine)."""
    out = str(tmp_path / "seen.jsonl")
    options = PipelineOptions(
        spark_test_options("--streaming", f"--checkpoint_dir={tmp_path / 'ckpt'}")
    )
    start = time.time() + 0.5
    with beam.Pipeline(options=options) as p:
        add_pattern(p, 8.0, 4.0, (0.5, 1.0), out, start=start)
    in_order = _check_versions(read_records(out), ticks=16, versions=4)
    assert in_order[-1] == 3, in_order


def _run(tmp_path, crash_at: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable)
    env.pop("SPARKBEAM_CRASH_AT", None)
    if crash_at:
        env["SPARKBEAM_CRASH_AT"] = crash_at
    cmd = [
        sys.executable, "-m", "tests.streaming.side_input_pipelines",
        "--out", str(tmp_path / "seen.jsonl"), "--main_for", "6", "--side_for", "4",
        "--runner=SparkCheckpointRunner", f"--spark_master_url={TEST_MASTER}",
        "--streaming", "--checkpoint_dir", str(tmp_path / "ckpt"),
        "--checkpoint_interval_s", "0.05", "--parallelism=2",
    ]  # fmt: skip
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_killed_and_resumed_singleton_keeps_its_latest_version(tmp_path):
    """SIGKILLed after round 1's checkpoint, run again: it resumes from the checkpoint (the
    view as it was there), and every main tick, before and after the kill, read one version,
    none older than the tick before's."""
    killed = _run(tmp_path, crash_at="after-commit:1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    before = read_records(str(tmp_path / "seen.jsonl"))
    assert len({tick for tick, _ in before}) < 12  # the kill interrupted the main ticks
    resumed = _run(tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming pipeline-0 from checkpoint" in resumed.stderr
    _check_versions(read_records(str(tmp_path / "seen.jsonl")), ticks=12, versions=4)

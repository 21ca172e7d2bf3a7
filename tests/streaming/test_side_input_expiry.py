"""A streaming side input drops a window once no reader can need it (issue 43, 4).

Before, a side input without a trigger kept every chunk it ever received
(``side-rows/<buffer>``) and a triggered one every window's view (``side-view/<buffer>``):
the store and every reading worker grew with the job's age. Now a window's data goes once
the watermark of every stage that reads it has passed the window's end plus the largest
allowed lateness of the side input and of its readers' main inputs: readers leave it out at
once, and the range's next snapshot leaves it out of the store. A run that fails after windows
expired resumes exactly. A side input that stops getting data while its readers go on is
dropped too, once its last window expired: no new data need come for the store to shed it.
"""

from __future__ import annotations

import functools
import glob
import os
import re

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.checkpoint import open_store
from tests.conftest import spark_test_options
from tests.streaming.side_input_expiry_pipeline import add_pipeline, expected_lines

pytestmark = [pytest.mark.spark, pytest.mark.slow]

WINDOWS, FAIL_AT = 10, 7
_ELEMENT = re.compile(rb"(?<![A-Za-z0-9_])s(\d+)")


def _run(tmp_path, *flags: str, windows=WINDOWS, fail_at=FAIL_AT, side_windows=None) -> None:
    options = PipelineOptions(
        spark_test_options(
            "--streaming",
            f"--checkpoint_dir={tmp_path / 'ckpt'}",
            "--checkpoint_interval_s=0.05",
            "--parallelism=2",
            *flags,
        )  # fmt: skip
    )
    with beam.Pipeline(options=options) as p:
        out, marker = str(tmp_path / "out"), str(tmp_path / "failed")
        add_pipeline(p, windows, out, fail_at, marker, side_windows=side_windows)


def _kept(url: str, with_bytes: bool = False) -> dict[str, tuple]:
    """Per side-input namespace of the latest checkpoint: its entries as the tasks counted
    them, and the windows (side element numbers) its values hold (and their values' bytes)."""
    with open_store(url, break_lock=True) as store:
        (pipeline,) = store.list_pipelines()
        state = store.pipeline(pipeline)
        state.restore()
        kept = {}
        for ns in sorted(state.task_owned()):
            if ns.startswith(("side-rows/", "side-view/")):
                values = state.read_task_owned(ns).values()
                seen = {int(m) for v in values for m in _ELEMENT.findall(v)}
                kept[ns] = (state.task_owned_state(ns).entries, seen)
                if with_bytes:
                    kept[ns] += (len(values), sum(len(v) for v in values))
        state.close()
    return kept


def _lines(tmp_path) -> list[str]:
    lines = []
    for path in glob.glob(str(tmp_path / "out" / "out-*")):
        with open(path) as f:
            lines.extend(line.rstrip("\n") for line in f if line.strip())
    return sorted(lines)


def _broadcast_files(spark) -> int:
    return len(os.listdir(spark.sparkContext._temp_dir))


def test_expired_windows_leave_the_store_and_a_resume_after_expiry_is_exact(spark, tmp_path):
    with pytest.raises(Exception, match="injected failure"):
        _run(tmp_path, "--max_restores=0")
    kept = _kept(str(tmp_path / "ckpt"))
    assert sorted(ns.split("/")[0] for ns in kept) == ["side-rows", "side-view"]
    for ns, (entries, windows) in kept.items():
        # Window FAIL_AT - 1 is the last one a committed round brought; the ones before it
        # had expired (the watermark passed their end) when it was kept.
        assert windows and windows <= {FAIL_AT - 2, FAIL_AT - 1}, (ns, windows)
        assert 1 <= entries <= 2, (ns, entries)
    spilled = _broadcast_files(spark)
    _run(tmp_path)  # the same job again: it resumes from its last checkpoint
    assert _lines(tmp_path) == expected_lines(WINDOWS)
    # A round's side-input broadcasts go with the round: PySpark keeps a broadcast's pickle in
    # the driver's temp directory (and its blocks in the JVM) until it is destroyed.
    assert _broadcast_files(spark) - spilled <= 1, "the driver keeps a broadcast a round"
    for ns, (entries, windows) in _kept(str(tmp_path / "ckpt")).items():
        assert windows <= {WINDOWS - 2, WINDOWS - 1} and entries <= 2, (ns, entries, windows)


def test_a_side_input_that_stops_getting_data_leaves_the_store(tmp_path):
    # The side input gets data of windows 0-2 from a source that is then done; the main
    # input goes on to window 6. Once the readers' watermark passed window 2's end, its rows
    # and views go, though no stage writes the side input any more. The first run fails at
    # window 2, before that: the resumed run knows no end of what its checkpoint keeps.
    run = functools.partial(_run, tmp_path, windows=7, fail_at=2, side_windows=3)
    with pytest.raises(Exception, match="injected failure"):
        run("--max_restores=0")
    assert all(held[0] for held in _kept(str(tmp_path / "ckpt")).values())
    run()
    assert _lines(tmp_path) == expected_lines(7, side_windows=3)
    kept = _kept(str(tmp_path / "ckpt"), with_bytes=True)
    assert sorted(ns.split("/")[0] for ns in kept) == ["side-rows", "side-view"]
    for ns, held in kept.items():
        assert held == (0, set(), 0, 0), (ns, held)


def test_a_late_main_element_within_its_allowed_lateness_still_reads_its_window(tmp_path):
    """A reader's main input may still bring a window's elements until its watermark passed
    the window's end plus the main input's allowed lateness: the side input's window stays
    until then. It had gone at its own (zero) lateness, so a late pane read it empty (the
    soak's late panes: 25 lines of ``0`` side payloads out of 10)."""
    from apache_beam.testing.test_stream import TestStream
    from apache_beam.testing.util import assert_that, equal_to
    from apache_beam.transforms import window
    from apache_beam.transforms.window import TimestampedValue

    stream = (
        TestStream()
        .add_elements([TimestampedValue("s0", 1), TimestampedValue("m0", 5)])
        .advance_watermark_to(10)
        .add_elements([TimestampedValue("s1", 11), TimestampedValue("m1", 15)])
        .advance_watermark_to(25)  # window 0 ended 15 s ago: late, within its 30 s
        .add_elements([TimestampedValue("late0", 6)])
        .advance_watermark_to(35)
        .add_elements([TimestampedValue("late1", 16)])
        .advance_watermark_to_infinity()
    )
    options = PipelineOptions(
        spark_test_options(
            "--streaming", f"--checkpoint_dir={tmp_path / 'ckpt'}", "--parallelism=2"
        )
    )
    with beam.Pipeline(options=options) as p:
        events = p | stream
        side = (
            events
            | "Side" >> beam.Filter(lambda e: e.startswith("s"))
            | "SideWindows" >> beam.WindowInto(window.FixedWindows(10))
        )
        read = (
            events
            | "Main" >> beam.Filter(lambda e: not e.startswith("s"))
            | "MainWindows" >> beam.WindowInto(window.FixedWindows(10), allowed_lateness=30)
            | "Read" >> beam.Map(lambda e, s: f"{e} {sorted(s)}", s=beam.pvalue.AsList(side))
        )
        assert_that(
            read,
            equal_to(["m0 ['s0']", "m1 ['s1']", "late0 ['s0']", "late1 ['s1']"]),
        )

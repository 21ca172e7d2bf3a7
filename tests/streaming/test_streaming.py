"""Streaming runs on the shared local Spark: windowed GroupByKey with triggers, stateful
DoFns with timers, cancel, per-pipeline failure isolation. Each test's pipeline is small;
the rounds and checkpoints are real (a real store in a temp directory)."""

from __future__ import annotations

import glob
import os
import sys
import time

import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import trigger, userstate, window
from apache_beam.transforms.core import RestrictionProvider

from sparkbeam.checkpoint import open_store
from sparkbeam.io import WriteToFilesOnCheckpoint
from sparkbeam.runner import cli
from tests.conftest import spark_test_options
from tests.streaming.streaming_pipelines import EventTimeOffsets, expected_counts, windowed_counts
from tests.streaming.test_side_input_files import assert_kept_by_tasks, record_side_input_jobs

pytestmark = pytest.mark.spark


def _options(tmp_path, *extra):
    return PipelineOptions(
        spark_test_options(
            "--streaming",
            f"--checkpoint_dir={tmp_path / 'ckpt'}",
            "--checkpoint_interval_s=0.05",
            *extra,
        )
    )


def test_windowed_count_fires_each_window_once_as_the_watermark_passes(spark, tmp_path):
    sources = [("a", 40), ("b", 25)]
    with beam.Pipeline(options=_options(tmp_path)) as p:
        assert_that(windowed_counts(p, sources), equal_to(expected_counts(sources)))
    store = open_store(str(tmp_path / "ckpt"), read_only=True)
    (pipeline,) = store.list_pipelines()
    checkpoints = store.list_checkpoints(pipeline)
    assert len(checkpoints) >= 1  # retention keeps the last few of the 5+ rounds
    last = store.load_manifest(pipeline, checkpoints[-1].checkpoint_id)
    assert last.metadata["round"] >= 4  # 4 rounds of records, then the final firing
    assert last.metadata["pending_residuals"] == 0


def test_early_and_late_firings_accumulate_as_configured(spark, tmp_path):
    """AfterWatermark with an early count trigger: panes fire before the window closes."""
    with beam.Pipeline(options=_options(tmp_path)) as p:
        counts = (
            p
            | beam.Create([("k", 30)])
            | beam.ParDo(EventTimeOffsets(per_round=5))
            | beam.WindowInto(
                window.FixedWindows(15),
                trigger=trigger.AfterWatermark(early=trigger.AfterCount(5)),
                accumulation_mode=trigger.AccumulationMode.ACCUMULATING,
            )
            | beam.combiners.Count.PerKey()
            | beam.ParDo(_WithPane())
        )
        # Each round brings 5 records and fires an early pane (5, 10, 15; accumulating);
        # the round after, the watermark passes the window's end: the on-time pane.
        expected = [
            (0, 5, "EARLY"), (0, 10, "EARLY"), (0, 15, "EARLY"), (0, 15, "ON_TIME"),
            (15, 5, "EARLY"), (15, 10, "EARLY"), (15, 15, "EARLY"), (15, 15, "ON_TIME"),
        ]  # fmt: skip
        assert_that(counts, equal_to(expected))


class _WithPane(beam.DoFn):
    def process(self, kv, win=beam.DoFn.WindowParam, pane=beam.DoFn.PaneInfoParam):
        timing = {0: "EARLY", 1: "ON_TIME", 2: "LATE"}[pane.timing]
        yield int(win.start), kv[1], timing


class _BufferUntilWindowEnd(beam.DoFn):
    """Stateful: buffers values per key and emits their sum when an event-time timer fires."""

    BUFFER = userstate.BagStateSpec("buffer", VarIntCoder())
    FLUSH = userstate.TimerSpec("flush", userstate.TimeDomain.WATERMARK)

    def process(
        self,
        kv,
        win=beam.DoFn.WindowParam,
        buffer=beam.DoFn.StateParam(BUFFER),
        flush=beam.DoFn.TimerParam(FLUSH),
    ):
        buffer.add(kv[1])
        flush.set(win.end)

    @userstate.on_timer(FLUSH)
    def on_flush(self, key=beam.DoFn.KeyParam, buffer=beam.DoFn.StateParam(BUFFER)):
        values = list(buffer.read())
        buffer.clear()
        yield key, sum(values), len(values)


def test_stateful_dofn_keeps_state_and_event_timers_across_rounds(spark, tmp_path):
    with beam.Pipeline(options=_options(tmp_path)) as p:
        sums = (
            p
            | beam.Create([("a", 40), ("b", 20)])
            | beam.ParDo(EventTimeOffsets(per_round=7))
            | beam.WindowInto(window.FixedWindows(10))
            | beam.ParDo(_BufferUntilWindowEnd())
        )
        # Records arrive 7 per round, so every window's buffer spans two rounds or more.
        expected = [
            (name, sum(range(s, s + 10)), 10) for name, n in (("a", 40), ("b", 20))
            for s in range(0, n, 10)
        ]  # fmt: skip
        assert_that(sums, equal_to(expected))


def test_cancel_stops_an_unbounded_job_after_a_committed_round(spark, tmp_path):
    p = beam.Pipeline(options=_options(tmp_path))
    _ = (
        p
        | beam.Create([("forever", 10**9)])
        | beam.ParDo(EventTimeOffsets(per_round=5, delay_s=0.01))
        | beam.WindowInto(window.FixedWindows(10))
        | beam.combiners.Count.PerKey()
    )
    result = p.run()
    assert result.wait_until_finish(duration=3000) == PipelineState.RUNNING
    assert result.cancel() == PipelineState.CANCELLED
    store = open_store(str(tmp_path / "ckpt"), read_only=True)
    (pipeline,) = store.list_pipelines()
    last = store.list_checkpoints(pipeline)[-1]
    manifest = store.load_manifest(pipeline, last.checkpoint_id)
    assert manifest.metadata["pending_residuals"] == 1  # the source resumes from here
    assert not manifest.metadata.get("finished")


class _FailOnce(beam.DoFn):
    """Fails the first time it sees ``value`` (a marker file makes it once per test)."""

    def __init__(self, marker: str, value: int) -> None:
        self.marker = marker
        self.value = value

    def process(self, kv):
        if kv[1] == self.value and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            raise RuntimeError("injected failure")
        yield kv


def test_a_failed_pipeline_restores_alone_and_the_other_never_restarts(spark, tmp_path):
    from sparkbeam.io import WriteToFilesOnCheckpoint

    marker = str(tmp_path / "failed-once")
    p = beam.Pipeline(options=_options(tmp_path))
    for name, fail in (("healthy", None), ("flaky", 23)):
        records = (
            p
            | f"{name}Source" >> beam.Create([(name, 40)])
            | f"{name}Read" >> beam.ParDo(EventTimeOffsets(per_round=5))
        )
        if fail is not None:
            records = records | f"{name}Fail" >> beam.ParDo(_FailOnce(marker, fail))
        _ = (
            records
            | f"{name}Format" >> beam.Map(lambda kv: f"{kv[0]} {kv[1]}")
            | f"{name}Write" >> WriteToFilesOnCheckpoint(str(tmp_path / "out" / name))
        )
    result = p.run()
    assert result.wait_until_finish() == PipelineState.DONE
    assert os.path.exists(marker)  # the failure really happened
    loops = {loop.pipeline.id: loop for loop in result.executor.loops}
    assert sorted(loop.restores for loop in loops.values()) == [0, 1]
    for name in ("healthy", "flaky"):
        lines = []
        for path in glob.glob(str(tmp_path / "out" / f"{name}-*")):
            lines += open(path).read().split()
        values = sorted(int(v) for v in lines if v.isdigit())
        assert values == list(range(40)), name  # exactly once, despite the restore


class _StopOnDrain(RestrictionProvider):
    """Offsets without end; truncating (drain) keeps nothing of what is left."""

    def initial_restriction(self, element):
        return OffsetRange(0, sys.maxsize)

    def create_tracker(self, restriction):
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, element, restriction):
        return 1

    def truncate(self, element, restriction):
        return OffsetRange(restriction.start, restriction.start)


class _EndlessOffsets(EventTimeOffsets):
    def process(
        self,
        element,
        tracker=beam.DoFn.RestrictionParam(_StopOnDrain()),
        estimator=beam.DoFn.WatermarkEstimatorParam(EventTimeOffsets.WATERMARK),
    ):
        yield from self.emit(element, tracker, estimator)


@pytest.mark.parametrize("how", ["result.drain()", "sparkbeam drain"])
def test_drain_truncates_the_source_and_fires_the_open_window(spark, tmp_path, how):
    p = beam.Pipeline(options=_options(tmp_path))
    _ = (
        p
        | beam.Create([("s", 0)])
        | beam.ParDo(_EndlessOffsets(per_round=4, delay_s=0.01))
        | beam.WindowInto(window.FixedWindows(10))
        | beam.combiners.Count.PerKey()
        | beam.ParDo(_WithPane())
        | WriteToFilesOnCheckpoint(str(tmp_path / "out" / "counts"), format_fn=repr)
    )
    result = p.run()
    (loop,) = result.executor.loops
    deadline = time.monotonic() + 120
    while loop.rounds_run < 3 and time.monotonic() < deadline:
        assert result.wait_until_finish(duration=200) == PipelineState.RUNNING
    if how == "result.drain()":
        assert result.drain() == PipelineState.DRAINED
    else:
        assert cli.main(["drain", f"--checkpoint_dir={tmp_path / 'ckpt'}"]) == 0
        assert result.wait_until_finish() == PipelineState.DRAINED
    rows = []
    for path in glob.glob(str(tmp_path / "out" / "counts-*")):
        rows += [eval(line) for line in open(path).read().splitlines()]  # noqa: S307 - our tuples
    rows.sort()
    read = sum(count for _, count, _ in rows)
    assert read >= 8  # the source ran for a few rounds before the drain
    # Every position read is counted exactly once; windows are contiguous; the last,
    # still open when the drain came, fired too.
    assert [start for start, _, _ in rows] == list(range(0, read, 10))
    assert [count for _, count, _ in rows] == [min(10, read - s) for s in range(0, read, 10)]
    store = open_store(str(tmp_path / "ckpt"), read_only=True)
    (pipeline,) = store.list_pipelines()
    last = store.list_checkpoints(pipeline)[-1]
    assert store.load_manifest(pipeline, last.checkpoint_id).metadata["finished"]
    assert not os.path.exists(tmp_path / "ckpt" / "drain-request")


def test_periodic_impulse_fires_on_schedule_into_windows(spark, tmp_path):
    """Beam's own unbounded source: PeriodicImpulse (an SDF deferring with a delay)."""
    from apache_beam.transforms.periodicsequence import PeriodicImpulse

    start = time.time() + 1
    with beam.Pipeline(options=_options(tmp_path)) as p:
        counts = (
            p
            | PeriodicImpulse(start, start + 4, fire_interval=1, apply_windowing=True)
            | beam.Map(lambda _: ("tick", 1))
            | beam.CombinePerKey(sum)
        )
        assert_that(counts, equal_to([("tick", 1)] * 4))  # one per 1-second window
    assert time.time() >= start + 3  # the delays were honoured, not skipped


@pytest.mark.slow
def test_match_continuously_sees_a_file_created_while_running(spark, tmp_path):
    """Beam's fileio.MatchContinuously: a Watch splittable DoFn that dedups what it saw."""
    import threading

    from apache_beam.io import fileio
    from apache_beam.utils.timestamp import Timestamp

    watched = tmp_path / "in"
    watched.mkdir()
    (watched / "a.txt").write_text("1\n")
    later = threading.Timer(3.0, lambda: (watched / "b.txt").write_text("2\n"))
    later.start()
    # Beam's default start_timestamp is Timestamp.now() evaluated when fileio is imported: in a
    # long-lived test process that is minutes ago, and the watch polls once a second from then.
    start = Timestamp.now()
    stop = start + 8
    with beam.Pipeline(options=_options(tmp_path)) as p:
        names = (
            p
            | fileio.MatchContinuously(
                str(watched / "*.txt"), interval=1.0, start_timestamp=start, stop_timestamp=stop
            )
            | beam.Map(lambda m: os.path.basename(m.path))
        )
        assert_that(names, equal_to(["a.txt", "b.txt"]))  # each once: dedup state survived
    later.join()


class _FlushAfterAWhile(beam.DoFn):
    """Stateful: counts per key, emits the count from a processing-time timer 0.3 s later."""

    COUNT = userstate.ReadModifyWriteStateSpec("count", VarIntCoder())
    FLUSH = userstate.TimerSpec("flush", userstate.TimeDomain.REAL_TIME)

    def process(
        self,
        kv,
        count=beam.DoFn.StateParam(COUNT),
        flush=beam.DoFn.TimerParam(FLUSH),
    ):
        seen = count.read() or 0
        if seen == 0:
            flush.set(time.time() + 0.3)
        count.write(seen + 1)

    @userstate.on_timer(FLUSH)
    def on_flush(
        self,
        key=beam.DoFn.KeyParam,
        count=beam.DoFn.StateParam(COUNT),
        fire_at=beam.DoFn.TimestampParam,
    ):
        yield key, count.read(), time.time() - fire_at.micros / 1e6  # lateness of the firing
        count.clear()


def test_processing_time_timers_fire_in_a_later_round_after_their_time(spark, tmp_path):
    with beam.Pipeline(options=_options(tmp_path)) as p:
        flushed = (
            p
            | beam.Create([("a", 12), ("b", 6)])
            | beam.ParDo(EventTimeOffsets(per_round=3, delay_s=0.2))
            | beam.ParDo(_FlushAfterAWhile())
        )
        counts = flushed | beam.Map(lambda kv: kv[:2]) | beam.CombinePerKey(sum)
        assert_that(counts, equal_to([("a", 12), ("b", 6)]), label="all counted once")
        fired = flushed | beam.Map(lambda kv: kv[2] >= 0)  # never before the timer's time
        assert_that(
            fired | beam.Filter(lambda ok: not ok) | beam.combiners.Count.Globally(),
            equal_to([0]),
            label="no timer fired early",
        )


def test_side_input_from_a_bounded_create_serves_every_later_round(spark, tmp_path, monkeypatch):
    """...kept by the tasks of the round that made it (the driver gets handles, never the
    chunks: ``tests/streaming/test_side_input_files.py``)."""
    jobs = record_side_input_jobs(monkeypatch)
    with beam.Pipeline(options=_options(tmp_path)) as p:
        offset = p | "Offset" >> beam.Create([1000, 2000])
        shifted = (
            p
            | beam.Create([("a", 12)])
            | beam.ParDo(EventTimeOffsets(per_round=4))  # three rounds of records
            | beam.Map(lambda kv, extra: kv[1] + sum(extra), extra=beam.pvalue.AsList(offset))
        )
        assert_that(shifted, equal_to([3000 + i for i in range(12)]))
    assert_kept_by_tasks(str(tmp_path / "ckpt"), jobs)


def test_chained_group_by_keys_fire_in_order_through_their_holds(spark, tmp_path):
    """Count per key and window, then sum those counts per window: the second GroupByKey
    must wait for the first one's panes (its input watermark follows the first's holds)."""
    sources = [("a", 30), ("b", 20), ("c", 25)]
    with beam.Pipeline(options=_options(tmp_path)) as p:
        per_window = (
            p
            | beam.Create(sources)
            | beam.ParDo(EventTimeOffsets(per_round=5))
            | beam.WindowInto(window.FixedWindows(10))
            | "PerKey" >> beam.combiners.Count.PerKey()
            | beam.Map(lambda kv: ("all", kv[1]))
            | "PerWindow" >> beam.CombinePerKey(sum)
            | beam.ParDo(_WithPane())
        )
        # Windows [0,10) and [10,20): all three sources; [20,30): a (10) and c (5).
        assert_that(
            per_window, equal_to([(0, 30, "ON_TIME"), (10, 30, "ON_TIME"), (20, 15, "ON_TIME")])
        )


def test_elements_no_pane_carried_fire_as_the_final_pane_when_the_input_ends(spark, tmp_path):
    """A processing-time trigger that never came due: the window's elements are not dropped
    when the input ends (watermark at +inf) — they fire as the final, ON_TIME pane."""
    with beam.Pipeline(options=_options(tmp_path)) as p:
        counts = (
            p
            | beam.Create([("k", 40)])
            | beam.ParDo(EventTimeOffsets(per_round=8))
            | beam.WindowInto(
                window.GlobalWindows(),
                trigger=trigger.Repeatedly(trigger.AfterProcessingTime(3600)),
                accumulation_mode=trigger.AccumulationMode.DISCARDING,
            )
            | beam.combiners.Count.PerKey()
            | beam.ParDo(_LastPane())
        )
        assert_that(counts, equal_to([("k", 40, True, "ON_TIME")]))


class _LastPane(beam.DoFn):
    def process(self, kv, pane=beam.DoFn.PaneInfoParam):
        timing = {0: "EARLY", 1: "ON_TIME", 2: "LATE"}[pane.timing]
        yield kv[0], kv[1], pane.is_last, timing


def test_write_to_text_waits_for_its_side_inputs_and_writes_everything(spark, tmp_path):
    """Beam's WriteToText finalizes through side inputs that fill only when its GroupByKey
    fires: the finalize step must wait for them (pushed back), not run on empty ones."""
    words = [f"w{i % 7}" for i in range(50)]
    with beam.Pipeline(options=_options(tmp_path)) as p:
        _ = (
            p
            | beam.Create(words)
            | beam.combiners.Count.PerElement()
            | beam.MapTuple(lambda w, n: f"{w}: {n}")
            | beam.io.WriteToText(str(tmp_path / "text" / "counts"))
        )
    written = sorted(
        line for path in glob.glob(str(tmp_path / "text" / "counts-*")) for line in open(path)
    )
    assert written == sorted(f"w{i}: {words.count(f'w{i}')}\n" for i in range(7))


def test_a_drain_request_left_from_an_earlier_job_is_ignored(spark, tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "drain-request").write_bytes(b"drain")
    sources = [("a", 20)]
    p = beam.Pipeline(options=_options(tmp_path))
    assert_that(windowed_counts(p, sources), equal_to(expected_counts(sources)))
    result = p.run()
    assert result.wait_until_finish() == PipelineState.DONE  # ran to the end, not drained

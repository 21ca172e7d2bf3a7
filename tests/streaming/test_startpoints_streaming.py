"""Startpoints in --streaming runs: the operator's set / restart / verify, on a growing log.

Each run is a real streaming job on the shared Spark session with a real store; between runs
the job is cancelled (its last round commits), the operator sets a startpoint with the CLI and
the log grows. The source is ``tests.streaming.tail_source``: output lines are positions, written
through the exactly-once sink into one directory per run, so each run's reads are visible.
"""

from __future__ import annotations

import time
from collections import Counter

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState

from sparkbeam.checkpoint import open_store
from sparkbeam.io import WriteToFilesOnCheckpoint
from sparkbeam.runner.cli import main as cli
from sparkbeam.sdf.startpoints.session import UnknownStartpointTransformError
from tests.conftest import spark_test_options
from tests.streaming.tail_source import PIPELINE, SOURCE, positions, tail, visible, write

pytestmark = pytest.mark.spark

TIMEOUT_S = 90.0


class Job:
    """One streaming job over ``partitions`` of ``tmp/data``; run ``n`` writes to ``tmp/out<n>``."""

    def __init__(self, tmp_path, partitions: str) -> None:
        self.tmp, self.partitions, self.runs = tmp_path, partitions, 0
        self.ckpt, self.data = str(tmp_path / "ckpt"), str(tmp_path / "data")

    def start(self):
        self.runs += 1
        self.out = str(self.tmp / f"out{self.runs}")
        options = PipelineOptions(
            spark_test_options(
                "--streaming",
                f"--checkpoint_dir={self.ckpt}",
                "--checkpoint_interval_s=0.05",
                "--parallelism=2",
            )  # fmt: skip
        )
        p = beam.Pipeline(options=options)
        _ = tail(p, self.data, self.partitions) | WriteToFilesOnCheckpoint(self.out + "/out")
        return p.run()

    def output(self) -> Counter:
        return visible(self.out)

    def set(self, *args: str) -> None:
        cmd = ["startpoints", "set", "--checkpoint_dir", self.ckpt, "--pipeline", PIPELINE]
        assert cli([*cmd, "--transform", SOURCE, *args]) == 0

    def pending(self) -> list[tuple[str | None, str]]:
        with open_store(self.ckpt, read_only=True) as store:
            return [(s.element_key_text, s.kind.value) for s in store.startpoints.list()]


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.slow
def test_rewind_after_restart_replays_the_range_once_for_every_partition(spark, tmp_path, capsys):
    job = Job(tmp_path, "ab")
    for name in "ab":
        write(job.data, name, 30, stop=45)
    # Run 1 reads 0..29 of each partition, then waits for more; the operator stops it.
    run = job.start()
    first = positions("a", 0, 30) + positions("b", 0, 30)
    wait_for(lambda: job.output() == first, "run 1 to read 0..29")
    assert run.cancel() == PipelineState.CANCELLED
    # Rewind the whole transform to offset 10 while the job is down; the log grows to 40.
    job.set("--kind", "offset", "--value", "10")
    assert job.pending() == [(None, "offset")]
    for name in "ab":
        write(job.data, name, 40)
    run = job.start()
    second = positions("a", 10, 40) + positions("b", 10, 40)  # 10..29 again, then 30..39
    wait_for(lambda: job.output() == second, "run 2 to replay 10..39")
    assert job.pending() == []  # consumed: deleted once its checkpoint committed
    run.cancel()
    assert job.output() == second  # nothing else was read twice
    # Verify: the checkpoint list still works and shows the pipeline; a second restart does not
    # rewind again: run 3 reads only the new records and ends at the stop.
    assert cli(["checkpoints", "list", "--checkpoint_dir", job.ckpt]) == 0
    assert PIPELINE in capsys.readouterr().out
    for name in "ab":
        write(job.data, name, 45)
    run = job.start()
    assert run.wait_until_finish(TIMEOUT_S * 1000) == PipelineState.DONE
    assert job.output() == positions("a", 40, 45) + positions("b", 40, 45)


@pytest.mark.slow
def test_upcoming_skips_the_backlog_and_waits_for_a_partition_with_no_data(spark, tmp_path):
    job = Job(tmp_path, "abc")
    write(job.data, "a", 10, stop=20)
    write(job.data, "b", 10, stop=25)
    write(job.data, "c", 0, stop=5)
    (tmp_path / "data" / "c").unlink()  # partition c has no log yet
    run = job.start()
    wait_for(lambda: job.output() == positions("a", 0, 10) + positions("b", 0, 10), "run 1")
    run.cancel()
    # b skips what piled up while the job was down; c has no data, so it keeps its startpoint.
    job.set("--key", "b", "--kind", "upcoming")
    job.set("--key", "c", "--kind", "upcoming")
    write(job.data, "a", 20)
    write(job.data, "b", 20)
    run = job.start()
    wait_for(lambda: job.pending() == [("c", "upcoming")], "b's startpoint to be consumed")
    wait_for(lambda: job.output() == positions("a", 10, 20), "a to read its backlog")
    assert job.pending() == [("c", "upcoming")]  # rounds go by, c still has no data
    run.cancel()
    assert job.output() == positions("a", 10, 20)  # b skipped 10..19; c read nothing
    assert job.pending() == [("c", "upcoming")]  # kept through the stop too
    # c's log appears with 3 records while the job is down: upcoming skips them at the restart.
    # (Records that reach a waiting element while it runs are read: they came after the
    # startpoint, and the element reads them before the startpoint can resolve.)
    write(job.data, "c", 3)
    run = job.start()
    wait_for(lambda: job.pending() == [], "c's startpoint to be consumed")
    write(job.data, "b", 25)
    write(job.data, "c", 5)
    assert run.wait_until_finish(TIMEOUT_S * 1000) == PipelineState.DONE
    assert job.output() == positions("b", 20, 25) + positions("c", 3, 5)


def test_bad_transform_name_fails_run_before_any_round(spark, tmp_path):
    job = Job(tmp_path, "a")
    write(job.data, "a", 1, stop=1)
    job.set("--kind", "oldest")
    cmd = ["startpoints", "set", "--checkpoint_dir", job.ckpt, "--pipeline", PIPELINE]
    assert cli([*cmd, "--transform", "ReadTial", "--kind", "oldest"]) == 0
    with pytest.raises(UnknownStartpointTransformError, match=r"'ReadTial'.*Known.*'ReadTail'"):
        job.start()
    assert len(job.pending()) == 2

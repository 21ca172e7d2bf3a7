"""Real jobs restart past a damaged task-owned file exactly (issue 43, defect 2).

One streaming job (an offset SDF's residuals, a windowed count's GroupByKey, a stateful
DoFn's user state) runs a few rounds and is cancelled; its store and output are kept. Each
test copies them, damages one file of the newest checkpoint (a segment: block index, one
block, cut short, deleted; a snapshot: flipped byte, cut, deleted) in one namespace, and runs
the job again on the shared Spark session: it restores the checkpoint `sparkbeam checkpoints
verify` names, and the output is exact. Before, the restart restored the damaged checkpoint
and failed on it until --max_restores ran out. The store of each restart is a copy at its own
URL, so no worker holds a read of another test's store. Also: a file damaged between rounds
of a running job, a batch job's SDF residuals, and a failed round's cause at WARNING.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import time

import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.transforms import userstate, window
from apache_beam.utils.timestamp import Duration

from sparkbeam.checkpoint import open_store
from sparkbeam.checkpoint.cli import main as cli
from sparkbeam.checkpoint.layout import pipeline_dir
from sparkbeam.io import WriteToFilesOnCheckpoint
from sparkbeam.runner.errors import StageFailedError
from sparkbeam.runner.rounds.loop import RoundLoop
from sparkbeam.sdf import OffsetRangeProvider
from tests.checkpoint.test_task_file_damage import (
    SEGMENT_DAMAGE,
    SNAPSHOT_DAMAGE,
    damage,
    damage_target,
)
from tests.conftest import spark_test_options
from tests.streaming.streaming_pipelines import EventTimeOffsets, _FormatWithWindow

pytestmark = pytest.mark.spark

SOURCES = [("a", 30), ("b", 20)]
PER_ROUND = 5
KEYS = 5
NAMESPACES = ("gbk/", "user-state/", "sdf-residual/")
PIPELINE = "pipeline-0"


def _claimed(marker: str) -> bool:
    """True for the one task that removes ``marker``: two tasks may both see it exist, so
    checking then removing let the second fail on the remove instead of the injection."""
    try:
        os.remove(marker)
    except FileNotFoundError:
        return False
    return True


class _Count(beam.DoFn):
    """Stateful: '<key> <elements of the key so far>'. Fails once while ``marker`` exists."""

    SEEN = userstate.ReadModifyWriteStateSpec("seen", VarIntCoder())

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def process(self, kv, seen=beam.DoFn.StateParam(SEEN)):
        if _claimed(self.marker):
            raise ValueError(f"injected failure at {kv!r}")
        count = (seen.read() or 0) + 1
        seen.write(count)
        yield f"{kv[0]} {count}"


def _pipeline(ckpt: str, out: str, marker: str) -> beam.Pipeline:
    flags = ["--streaming", f"--checkpoint_dir={ckpt}", "--checkpoint_interval_s=0.05"]
    p = beam.Pipeline(options=PipelineOptions(spark_test_options(*flags, "--parallelism=2")))
    read = (
        p
        | "Sources" >> beam.Create(SOURCES)
        | "Read" >> beam.ParDo(EventTimeOffsets(PER_ROUND, delay_s=0.05))
    )
    _ = (
        read
        | "Window" >> beam.WindowInto(window.FixedWindows(10))
        | "Count" >> beam.combiners.Count.PerKey()
        | "Format" >> beam.ParDo(_FormatWithWindow())
        | "WriteCounts" >> WriteToFilesOnCheckpoint(f"{out}/counts")
    )
    _ = (
        read
        | "Key" >> beam.Map(lambda kv: (f"k{kv[1] % KEYS}", kv[1]))
        | "Stateful" >> beam.ParDo(_Count(marker))
        | "WriteStates" >> WriteToFilesOnCheckpoint(f"{out}/states")
    )
    return p


def _expected() -> list[str]:
    lines = [
        f"{name} {start} {min(10, n - start)}" for name, n in SOURCES for start in range(0, n, 10)
    ]
    per_key: dict[str, int] = {}
    for _, n in SOURCES:
        for i in range(n):
            per_key[f"k{i % KEYS}"] = per_key.get(f"k{i % KEYS}", 0) + 1
    lines += [f"{k} {c}" for k, n in per_key.items() for c in range(1, n + 1)]
    return sorted(lines)


def _lines(out: str) -> list[str]:
    lines = []
    for path in glob.glob(f"{out}/*-*"):
        with open(path) as f:
            lines += f.read().splitlines()
    return sorted(lines)


class FirstRun:
    """The cancelled run: its store and output, kept pristine for each test to copy."""

    def __init__(self, root) -> None:
        self.root = root
        self.out = str(root / "out")  # every run writes here: the store names these paths
        self.store = str(root / "pristine-ckpt")
        self.published = str(root / "pristine-out")
        self.marker = str(root / "fail-once")
        self.warnings: list[str] = []

    def restore_output(self) -> None:
        shutil.rmtree(self.out, ignore_errors=True)
        shutil.copytree(self.published, self.out)

    def copy_store(self, tmp_path) -> str:
        ckpt = str(tmp_path / "ckpt")
        shutil.copytree(self.store, ckpt)
        return ckpt


@pytest.fixture(scope="session")  # not "module": conftest groups those for xdist
def first_run(spark, tmp_path_factory):
    """The job until its newest checkpoint names a tail and a snapshot in every namespace;
    its first round fails once (the stateful DoFn raises) and is restored."""
    run = FirstRun(tmp_path_factory.mktemp("task-file-fallback"))
    ckpt = str(run.root / "ckpt")
    open(run.marker, "w").close()
    handler = _Records()
    logging.getLogger("sparkbeam").addHandler(handler)
    try:
        result = _pipeline(ckpt, run.out, run.marker).run()
        (loop,) = result.executor.loops
        deadline = time.monotonic() + 300
        while (loop.rounds_run < 4 or not _has_tails_and_snapshots(ckpt)) and (
            time.monotonic() < deadline
        ):
            assert result.wait_until_finish(duration=100) == PipelineState.RUNNING
        assert result.cancel() == PipelineState.CANCELLED
    finally:
        logging.getLogger("sparkbeam").removeHandler(handler)
    run.warnings = handler.lines
    assert _has_tails_and_snapshots(ckpt)
    assert _lines(run.out) and _lines(run.out) != _expected()  # published some, not all
    shutil.copytree(ckpt, run.store)
    shutil.copytree(run.out, run.published)
    return run


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _has_tails_and_snapshots(ckpt: str) -> bool:
    if not os.path.isdir(ckpt):
        return False
    with open_store(ckpt, read_only=True) as store:
        infos = store.list_checkpoints(PIPELINE)
        if not infos:
            return False
        spaces = store.load_manifest(PIPELINE, infos[-1].checkpoint_id).task_state.namespaces
    for prefix in NAMESPACES:
        (chains,) = [s for ns, s in spaces.items() if ns.startswith(prefix)]
        if not chains.log or not any(r.base for r in chains.ranges):
            return False
    return True


def _namespace(ckpt: str, prefix: str) -> str:
    with open_store(ckpt, read_only=True) as store:
        newest = store.list_checkpoints(PIPELINE)[-1].checkpoint_id
        names = store.load_manifest(PIPELINE, newest).task_state.namespaces
    (ns,) = [n for n in names if n.startswith(prefix)]
    return ns


def _restart_choice(ckpt: str, capsys) -> int:
    """The checkpoint `sparkbeam checkpoints verify` says a restart uses (and it exits 1)."""
    assert cli(["checkpoints", "verify", "--checkpoint_dir", ckpt, "--json"]) == 1
    docs = json.loads(capsys.readouterr().out)
    (choice,) = [d["checkpoint_id"] for d in docs if d["restart"]]
    return choice


def test_a_failed_round_logs_its_cause_first_in_one_warning_line(first_run):
    (line,) = [w for w in first_run.warnings if "injected failure" in w]
    assert line.startswith("ValueError: injected failure at ("), line
    assert "\n" not in line and "; restoring " in line
    assert f"round 0 of pipeline {PIPELINE} failed in 'Stateful'" in line


KINDS = [(p, k) for p in NAMESPACES for k in SEGMENT_DAMAGE + SNAPSHOT_DAMAGE]


@pytest.mark.parametrize("prefix, kind", KINDS, ids=[f"{p[:-1]}-{k}" for p, k in KINDS])
def test_a_restart_past_a_damaged_task_file_is_exact(
    first_run, tmp_path, caplog, capsys, prefix, kind
):
    ckpt = first_run.copy_store(tmp_path)
    first_run.restore_output()
    path = damage_target(ckpt, PIPELINE, _namespace(ckpt, prefix), kind)
    damage(path, kind)
    sound = _restart_choice(ckpt, capsys)
    with caplog.at_level(logging.WARNING, logger="sparkbeam"):
        _pipeline(ckpt, first_run.out, first_run.marker).run().wait_until_finish()
    assert _lines(first_run.out) == _expected()
    messages = [r.getMessage() for r in caplog.records]
    fallbacks = [m for m in messages if "restoring checkpoint" in m and "set aside" in m]
    assert len(fallbacks) == 1, fallbacks  # one fallback, no retry of the damaged checkpoint
    assert fallbacks[0].startswith(f"TaskStateDamagedError: Checkpoint file {path!r} is corrupt")
    assert f"restoring checkpoint {sound}, the newest sound one" in fallbacks[0]
    assert not [m for m in messages if "restore 1 of at most" in m], messages


def _newest_only(ckpt: str, prefix: str) -> tuple[str, int] | None:
    """A file of ``prefix``'s namespace the newest checkpoint names and the one before it does
    not (a snapshot or segment it just took), and the newest checkpoint's id."""
    with open_store(ckpt, read_only=True) as store:
        (pid,) = store.list_pipelines()
        ids = [i.checkpoint_id for i in store.list_checkpoints(pid)]
        if len(ids) < 2:
            return None
        before, newest = (store.load_manifest(pid, c).task_state for c in ids[-2:])
        (ns,) = [n for n in newest.namespaces if n.startswith(prefix)]
        older = (
            {f.name for f in before.namespaces[ns].files()} if ns in before.namespaces else set()
        )
        new = [f.name for f in newest.namespaces[ns].files() if f.name not in older]
    return (os.path.join(ckpt, pipeline_dir(pid), new[0]), ids[-1]) if new else None


def test_a_file_damaged_between_rounds_falls_back_mid_run(spark, tmp_path, monkeypatch, caplog):
    """After the first checkpoint that took a new snapshot of the user state, that snapshot
    is damaged; the next round reads it (a new base is read whole), falls back to the
    checkpoint before, and the job ends exact."""
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    damaged: list[tuple[str, int]] = []
    commit = RoundLoop.commit

    def commit_then_damage(loop, ledger, meta):
        commit(loop, ledger, meta)
        found = None if damaged else _newest_only(ckpt, "user-state/")
        if found and found[0].endswith(".arrow"):
            damage(found[0], "flipped")
            damaged.append(found)

    monkeypatch.setattr(RoundLoop, "commit", commit_then_damage)
    with caplog.at_level(logging.WARNING, logger="sparkbeam"):
        _pipeline(ckpt, out, str(tmp_path / "no-failure")).run().wait_until_finish()
    ((path, newest),) = damaged
    assert _lines(out) == _expected()
    messages = [r.getMessage() for r in caplog.records]
    (line,) = [m for m in messages if "restoring checkpoint" in m and "set aside" in m]
    assert line.startswith(f"TaskStateDamagedError: Checkpoint file {path!r} is corrupt")
    assert f"checkpoints {newest} of pipeline" in line
    assert f"restoring checkpoint {newest - 1}, the newest sound one" in line


class _Chunks(beam.DoFn):
    """An offset SDF: 3 positions a call, then defers the rest by 0.05 s; fails once, at
    position 9, while ``marker`` exists (a batch job stops at its first failed round)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def process(self, element, tracker=beam.DoFn.RestrictionParam(OffsetRangeProvider())):
        pos = tracker.current_restriction().start
        for _ in range(3):
            if not tracker.try_claim(pos):
                return
            if pos == 9 and _claimed(self.marker):
                raise ValueError("injected failure")
            yield f"{element[0]},{pos}"
            pos += 1
        if pos < tracker.current_restriction().stop:
            tracker.defer_remainder(Duration(seconds=0.05))


BATCH = [("a", 15), ("b", 12)]


def _batch(ckpt: str, out: str, marker: str) -> beam.Pipeline:
    flags = [f"--checkpoint_dir={ckpt}", "--parallelism=2"]
    p = beam.Pipeline(options=PipelineOptions(spark_test_options(*flags)))
    _ = (
        p
        | beam.Create(BATCH)
        | beam.ParDo(_Chunks(marker))
        | beam.io.WriteToText(out, shard_name_template="")
    )
    return p


@pytest.fixture(scope="session")  # not "module": conftest groups those for xdist
def failed_batch(spark, tmp_path_factory) -> str:
    """A batch job's store after it failed in its fourth round (rounds 0-2 committed)."""
    root = tmp_path_factory.mktemp("failed-batch")
    marker = str(root / "fail-once")
    open(marker, "w").close()
    with pytest.raises(StageFailedError, match="injected failure"):
        _batch(str(root / "ckpt"), str(root / "out.txt"), marker).run().wait_until_finish()
    return str(root / "ckpt")


@pytest.mark.parametrize("prefix", ["sdf-residual/", "stage-output/"])
def test_a_batch_restart_past_a_damaged_task_file_is_exact(
    failed_batch, tmp_path, caplog, capsys, prefix
):
    """A durable batch SDF stage's residuals (read by its next round) and its kept output
    chunks (read by the resumed stage's consumers)."""
    ckpt = str(tmp_path / "ckpt")
    shutil.copytree(failed_batch, ckpt)
    found = _newest_only(ckpt, prefix)
    assert found, f"the newest checkpoint took no new file of {prefix}"
    damage(found[0], "flipped" if found[0].endswith(".arrow") else "one-block")
    sound = _restart_choice(ckpt, capsys)
    out = str(tmp_path / "out.txt")
    with caplog.at_level(logging.WARNING, logger="sparkbeam"):
        _batch(ckpt, out, str(tmp_path / "no-failure")).run().wait_until_finish()
    with open(out) as f:
        assert sorted(f.read().splitlines()) == sorted(
            f"{name},{i}" for name, n in BATCH for i in range(n)
        )
    messages = [r.getMessage() for r in caplog.records]
    (line,) = [m for m in messages if "restoring checkpoint" in m and "set aside" in m]
    assert f"restoring checkpoint {sound}, the newest sound one" in line
    assert os.path.basename(found[0]) in line

"""Two-phase commit of sink files: tasks stage them, the driver renames committed ones.

Owns both halves of the protocol behind ``sparkbeam.io.WriteToFilesOnCheckpoint``:

- Task side: while ``collect_sink_files`` pulls a stage task's records, a sink DoFn in that
  task can ``stage()`` a written file under its final name; the task ends with one
  ``SinkFilesRecord``. Spark returns only successful attempts' records, so a failed or
  retried attempt's files never reach the driver.
- Driver side: ``record_pending`` puts a round's pairs into the state its checkpoint commits;
  ``finalize_pending`` renames them (idempotently) after it commits, and again on restore, so
  a crash in between loses and duplicates nothing. A restore that falls back past a lost
  checkpoint first deletes the files the lost rounds published (``unpublish_after``: final
  names carry the round); the replay writes their data again.

Leaves to others: writing file contents (``sparkbeam.io``) and deciding when a round is
committed (the loops). Every path goes through Beam's ``FileSystems``.
"""

from __future__ import annotations

import contextvars
import itertools
import logging
import re
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from apache_beam.io.filesystems import FileSystems

from sparkbeam.checkpoint import state_layout
from sparkbeam.runner.task.records import SinkFilesRecord

_LOG = logging.getLogger(__name__)

STAGING_DIR = ".sparkbeam-staging"
pending_namespace = state_layout.SINK_PENDING
"""Checkpoint-store namespace of staged files awaiting their rename (key: final path)."""
DIRECTORY_ANNOTATION = "sparkbeam:sink_directory"
"""Transform annotation naming a sink's output directory (set by ``sparkbeam.io``)."""


class SinkFileLostError(FileNotFoundError):
    """A committed sink file is neither staged nor final: its data would be lost."""

    def __init__(self, staged: str, final: str) -> None:
        super().__init__(
            f"Sink file {final!r} cannot be finalized: neither it nor its staged copy "
            f"{staged!r} exists. Something deleted the staging directory or the output after "
            "the commit; rerun the pipeline from scratch to rewrite this output."
        )
        self.staged, self.final = staged, final


class TaskInfo(NamedTuple):
    """Which stage task is running: what a deterministic final file name is made of."""

    stage: str
    round: int
    partition: int


class _Collector:
    """The staged files of one running stage task."""

    def __init__(self, task: TaskInfo) -> None:
        self.task = task
        self.pairs: list[tuple[str, str]] = []
        self.sequence = itertools.count()


_ACTIVE: contextvars.ContextVar[_Collector | None] = contextvars.ContextVar(
    "sparkbeam_sink_collector", default=None
)


# --- task side ------------------------------------------------------------------------------


def collect_sink_files(records: Iterable, stage_id: str, round_no: int) -> Iterator:
    """Pass a stage task's records through, then yield one SinkFilesRecord if files were staged.
    The collector is active only while user code runs, so chained stages' do not mix up."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    collector = _Collector(TaskInfo(stage_id, round_no, partition))
    records = iter(records)
    while True:
        token = _ACTIVE.set(collector)
        try:
            record = next(records)
        except StopIteration:
            break
        finally:
            _ACTIVE.reset(token)
        yield record
    if collector.pairs:
        yield SinkFilesRecord(stage_id, tuple(collector.pairs))


def current_task() -> TaskInfo | None:
    """The running sparkbeam stage task, or None outside one (e.g. on DirectRunner)."""
    collector = _ACTIVE.get()
    return collector.task if collector is not None else None


def next_sequence() -> int:
    """A number unique within the running task, deterministic across its attempts."""
    collector = _ACTIVE.get()
    if collector is None:
        raise RuntimeError("next_sequence() needs a running sparkbeam stage task")
    return next(collector.sequence)


def stage(staged: str, final: str) -> bool:
    """Register a written staged file under its final path; False if no task collects it."""
    collector = _ACTIVE.get()
    if collector is None:
        return False
    collector.pairs.append((staged, final))
    return True


def staging_path(final_dir: str, name: str) -> str:
    """Where a file that will become visible in ``final_dir`` is staged."""
    return FileSystems.join(final_dir, STAGING_DIR, name)


# --- driver side ----------------------------------------------------------------------------


def finalize(pairs: Iterable[tuple[str, str]]) -> int:
    """Rename each staged file to its final path (replacing an earlier run's); safe to repeat
    (``SinkFileLostError`` if neither exists). Returns files renamed."""
    renamed = 0
    for staged, final in pairs:
        if _exists(staged):
            if _exists(final):
                FileSystems.delete([final])  # some filesystems refuse to overwrite
            FileSystems.rename([staged], [final])
            renamed += 1
        elif not _exists(final):
            raise SinkFileLostError(staged, final)
    return renamed


def _exists(path: str) -> bool:
    """``FileSystems.exists``; an absent ``azfs://`` blob is False, which Beam's Azure
    filesystem raises as a 404 instead (its ``exists`` catches the wrong exception class)."""
    from apache_beam.io.filesystem import BeamIOError

    try:
        return FileSystems.exists(path)
    except BeamIOError as e:
        causes = e.exception_details.values()
        if causes and all(getattr(c, "code", None) == 404 for c in causes):
            return False
        raise


def discard_staging(directory: str, keep: Iterable[str] = ()) -> int:
    """Best effort: delete failed or retried attempts' staged files in ``directory`` (not in
    ``keep``), so concurrent jobs must not share an output directory. Returns files deleted."""
    kept = set(keep)
    return _delete_in(directory, lambda path: path not in kept)


def discard_stage_files(directory: str, stage_ids: Iterable[str]) -> int:
    """Best effort: delete the staged files of ``stage_ids`` in ``directory``. Returns how many.

    After a restore whatever its checkpoint named is finalized, so these are a lost round's.
    Staged names carry the stage, so other pipelines' files are left alone."""
    tags = tuple(f"-{s}-" for s in stage_ids)
    return _delete_in(directory, lambda path: any(t in FileSystems.split(path)[1] for t in tags))


def _delete_in(directory: str, garbage: Callable[[str], bool]) -> int:
    """Best effort: delete the files in staging ``directory`` whose path is ``garbage``."""
    try:
        matched = FileSystems.match([FileSystems.join(directory, "*")])[0].metadata_list
        paths = [m.path for m in matched if garbage(m.path)]
        if paths:
            FileSystems.delete(paths)
        return len(paths)
    except Exception as e:  # noqa: BLE001 - leftover garbage must not fail a run or a restore
        _LOG.warning("Could not clean sink staging directory %r: %s", directory, e)
        return 0


def staging_dirs(pairs: Iterable[tuple[str, str]]) -> set[str]:
    """The staging directories the staged files of ``pairs`` live in."""
    return {FileSystems.split(staged)[0] for staged, _ in pairs}


def final_name(round_no: int, stage: str, partition: int, sequence: int) -> str:
    """The part of a final file name a task contributes: ``<round>-<stage>-<part>-<seq>``."""
    return f"{round_no:08d}-{stage}-{partition:05d}-{sequence:05d}"


def unpublish_after(directories: Iterable[str], stage_ids: Iterable[str], round_no: int) -> int:
    """Delete final files of ``stage_ids`` written by rounds after ``round_no``, published by
    checkpoints now lost (the replay writes their data again); how many."""
    stages = "|".join(re.escape(s) for s in stage_ids)
    if not stages:
        return 0
    name = re.compile(rf"-(\d{{8}})-(?:{stages})-\d{{5}}-\d{{5}}")
    lost = []
    for directory in set(directories):
        try:
            matched = FileSystems.match([FileSystems.join(directory, "*")])[0].metadata_list
        except Exception:  # noqa: BLE001 - a directory never written has nothing to unpublish
            continue
        for m in matched:
            found = name.search(FileSystems.split(m.path)[1])
            if found and int(found.group(1)) > round_no:
                lost.append(m.path)
    if lost:
        _LOG.warning(
            "Removing %d sink file(s) published by checkpoints after round %d, which are "
            "lost; the replayed rounds write their data again.", len(lost), round_no,
        )  # fmt: skip
        FileSystems.delete(lost)
    return len(lost)


def output_directories(components: bytes, staging_dirs: Iterable[str]) -> set[str]:
    """Where a pipeline's sinks publish: the plan's annotated sinks, and the parents of the
    staging directories its checkpoints recorded."""
    from apache_beam.portability.api import beam_runner_api_pb2

    transforms = beam_runner_api_pb2.Components.FromString(components).transforms.values()
    found = {
        t.annotations[DIRECTORY_ANNOTATION].decode("utf-8")
        for t in transforms
        if DIRECTORY_ANNOTATION in t.annotations
    }
    return found | {FileSystems.split(d)[0] for d in staging_dirs}


def record_pending(pipeline_store, pairs: Iterable[tuple[str, str]]) -> None:
    """Round commit, step 1: put the round's pairs into the state its checkpoint commits."""
    for staged, final in pairs:
        pipeline_store.put(pending_namespace, *state_layout.encode_sink_pending(final, staged))


def finalize_pending(pipeline_store) -> int:
    """After a checkpoint commits, and on restore: finalize every pending pair, then forget it."""
    pending = [
        state_layout.decode_sink_pending(key, value)
        for _, key, value in pipeline_store.items(pending_namespace)
    ]
    renamed = finalize(pending)
    for _, final in pending:
        pipeline_store.delete(pending_namespace, final.encode("utf-8"))
    return renamed


def record_staging_dir(pipeline_store, directory: str) -> None:
    """Remember a staging directory in the state, so a restore cleans what is left in it."""
    pipeline_store.put(state_layout.SINK_STAGING_DIRS, *state_layout.encode_staging_dir(directory))


def recorded_staging_dirs(pipeline_store) -> list[str]:
    """The staging directories `record_staging_dir` put into the (restored) state."""
    return [
        state_layout.decode_staging_dir(key, value)
        for _, key, value in pipeline_store.items(state_layout.SINK_STAGING_DIRS)
    ]

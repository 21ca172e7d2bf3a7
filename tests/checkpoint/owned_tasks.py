"""The task side of task-owned keyed state, run in this process as a Spark task runs it.

A GroupByKey task (`runner/streaming/group.py` `GroupTask.finish`) and a stateful DoFn task
(`runner/streaming/stateful.py` `KeyedState.finish`) each hold a `task_range.TaskRange` per
namespace: read as of a checkpoint, its changes staged with a real `StagedWriter` with the
range's size and a snapshot when one is due (written in the round, or by a background thread
that a later round's task reports), then kept with its changes as the next round's read.
Only Spark's TaskContext is left out: the test names the partition and attempt, and where
the task runs (`Executors`: which executor's local directory, which Python worker's state).
`damage` does to a task's file what a disk, a cleaner or a partial copy would.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections import OrderedDict
from dataclasses import dataclass

from sparkbeam.checkpoint.staging import CommitMessage, StagedWriter
from sparkbeam.runner.task import held_state, shared_reads, staged_state
from sparkbeam.runner.task.staged_state import StateRound
from sparkbeam.runner.task.task_range import TaskRange, finish

Changes = dict[bytes, bytes | None]  # None: deleted


@dataclass(frozen=True)
class Attempt:
    """One task attempt of a keyed stage: which round, subtask and attempt, as of which
    checkpoint, at which parallelism; ``flush_bytes`` small stages several segments."""

    url: str
    pipeline: str
    stage: str
    round_no: int
    subtask: int
    attempt: int
    checkpoint_id: int | None
    parallelism: int
    max_key_groups: int
    flush_bytes: int
    memory_bytes: int  # past it a read is held in a RocksDB on the executor's disk

    @property
    def spec(self) -> StateRound:
        return StateRound(
            pipeline=self.pipeline, url=self.url, checkpoint_id=self.checkpoint_id,
            round_no=self.round_no, parallelism=self.parallelism,
            max_key_groups=self.max_key_groups, memory_bytes=self.memory_bytes,
        )  # fmt: skip

    def writer(self) -> StagedWriter:
        return StagedWriter(
            self.url, self.pipeline, self.stage, self.round_no, self.subtask, self.attempt,
            max_key_groups=self.max_key_groups, flush_bytes=self.flush_bytes,
        )  # fmt: skip


def _change(task_range: TaskRange, wanted: Changes) -> None:
    """Stage of ``wanted`` what the tasks would: a delete only of a key the range holds, a put
    only of a new value (as the GroupByKey and stateful tasks do)."""
    for key, value in wanted.items():
        old = task_range.stored.get(key)
        if value is None and old is not None:
            task_range.delete(key)
        elif value is not None and old != value:
            task_range.put(key, value)


def gbk_task(
    attempt: Attempt, namespace: str, wanted: Changes, dies: bool = False
) -> tuple[dict[bytes, bytes], CommitMessage | None]:
    """``GroupTask.finish``: the task's read (a copy) and its commit message; ``dies``: the
    task dies after staging its changes' segments, before its report (no message)."""
    reads, staged = stateful_task(attempt, {namespace: wanted}, dies)
    return reads[namespace], staged


def stateful_task(
    attempt: Attempt, wanted: dict[str, Changes], dies: bool = False
) -> tuple[dict[str, dict[bytes, bytes]], CommitMessage | None]:
    """``KeyedState.finish``: one writer for the stage's namespaces (cells and timers), each
    a `TaskRange` that stages its changes and is kept with them after the writer finished;
    per namespace the task's read (a copy), and its commit message (None: it died after
    staging its segments)."""
    ranges = [TaskRange(attempt.spec, attempt.subtask, ns) for ns in wanted]
    reads = {r.namespace: dict(r.stored) for r in ranges}
    writer = attempt.writer()
    for task_range in ranges:
        _change(task_range, wanted[task_range.namespace])
        if dies:  # what it flushed so far stays, named by no commit
            writer.write_all(task_range.namespace, task_range.changes)
        else:
            task_range.stage(writer)
    if dies:
        for task_range in ranges:
            task_range.release()
        return reads, None
    return reads, finish(writer, *ranges)


def join_background_snapshots(timeout_s: float = 30.0) -> None:
    """Wait for the snapshots this process's threads are writing (`background_snapshots`):
    the next attempt finds them done, in every run of an example alike."""
    for thread in threading.enumerate():
        if thread.name.startswith("sparkbeam-snapshot-"):
            thread.join(timeout_s)
            assert not thread.is_alive(), f"{thread.name} still writing after {timeout_s} s"


class Executors:
    """Where a job's tasks run: executors, each a Spark local directory (shared reads, ranges
    held on disk, finished background snapshots), each with Python workers, each its own kept
    reads and what it saw of the shared ones (`staged_state`'s and `shared_reads`' process
    state). `enter` before a task; the caller restores those modules' state after the test."""

    def __init__(self, root: str, executors: int = 2, workers: int = 2) -> None:
        self.root, self.count, self.per_executor = root, executors, workers
        self.generation = 0
        self.restart()

    def restart(self) -> None:
        """A new job: new executors, in new directories."""
        held_state.release()
        self.generation += 1
        self.dirs = [f"{self.root}/exec-{self.generation}-{e}" for e in range(self.count)]
        self.workers = [self._workers() for _ in range(self.count)]

    def _workers(self) -> list[tuple[OrderedDict, dict]]:
        return [(OrderedDict(), {}) for _ in range(self.per_executor)]

    def enter(self, executor: int, worker: int) -> None:
        """Run what follows as a task on ``worker`` of ``executor``."""
        os.environ["SPARK_LOCAL_DIRS"] = self.dirs[executor]
        staged_state._READS, shared_reads._SEEN = self.workers[executor][worker]

    def lose(self, executor: int, worker: int | None) -> None:
        """A Python worker died (its reads are gone), or (None) its whole executor: its
        directory too."""
        if worker is not None:
            self.workers[executor][worker] = (OrderedDict(), {})
            return
        held_state.release()
        self.workers[executor] = self._workers()
        shutil.rmtree(self.dirs[executor], ignore_errors=True)


def damage(path: str, kind: str) -> bytes:
    """Damage the file at ``path``: "deleted", "flipped" (a byte) or "cut" (its second half);
    returns its bytes as they were."""
    with open(path, "rb") as f:
        data = f.read()
    if kind == "deleted":
        os.remove(path)
        return data
    damaged = bytearray(data)
    if kind == "flipped":
        damaged[len(damaged) // 2] ^= 0xFF
    else:
        del damaged[len(damaged) // 2 :]
    with open(path, "wb") as f:
        f.write(damaged)
    return data

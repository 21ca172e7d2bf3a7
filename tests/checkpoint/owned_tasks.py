"""The task side of task-owned keyed state, run in this process as a Spark task runs it.

A GroupByKey task (`runner/streaming/group.py` `GroupTask.finish`) and a stateful DoFn task
(`runner/streaming/stateful.py` `KeyedState.finish`) read their key groups' state as of a
checkpoint (`staged_state.read_task_state`), stage the round's changes with a real
`StagedWriter`, and report their range's size and a snapshot when one is due
(`range_staging.stage_range`: written in the round, or by a background thread that a later
round's task reports); the GroupByKey task keeps its read with its changes (`keep_staged`).
Only Spark's TaskContext is left out: the test names the partition and attempt, and where
the task runs (`Executors`: which executor's local directory, which Python worker's state).
`damage` does to a task's file what a disk, a cleaner or a partial copy would.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from sparkbeam.checkpoint.staging import CommitMessage, StagedWriter
from sparkbeam.runner.task import held_state, shared_reads, staged_state
from sparkbeam.runner.task.range_staging import stage_range
from sparkbeam.runner.task.staged_state import StateRound, keep_staged, read_task_state, release

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

    def read(self, namespace: str) -> Mapping[bytes, bytes]:
        if self.checkpoint_id is None:
            return {}
        return read_task_state(self.spec, self.subtask, namespace)


def _effective(before: Mapping[bytes, bytes], wanted: Changes) -> Changes:
    """What a task stages of ``wanted``: a delete only of a key it holds, a put only of a
    new value (as the GroupByKey and stateful tasks do)."""
    return {
        k: v
        for k, v in wanted.items()
        if (v is None and k in before) or (v is not None and before.get(k) != v)
    }


def _held(before: Mapping[bytes, bytes], changes: Changes) -> int:
    """The keys the range holds after ``changes``: counted, as the tasks count them."""
    added = sum(1 for k, v in changes.items() if v is not None and k not in before)
    return len(before) + added - sum(1 for v in changes.values() if v is None)


def gbk_task(
    attempt: Attempt, namespace: str, wanted: Changes, dies: bool = False
) -> tuple[dict[bytes, bytes], CommitMessage | None]:
    """``GroupTask.finish``: the task's read (a copy) and its commit message; ``dies``: the
    task dies after staging its changes' segments, before its report (no message)."""
    writer = attempt.writer()
    stored = attempt.read(namespace)
    read = dict(stored)
    changes = _effective(stored, wanted)
    writer.write_all(namespace, changes)
    if dies:
        release(stored)
        return read, None
    stage_range(writer, attempt.spec, attempt.subtask, namespace, stored, changes,
                _held(stored, changes))  # fmt: skip
    staged = writer.finish()
    if attempt.checkpoint_id is not None:
        keep_staged(attempt.spec, attempt.subtask, namespace, stored, changes, staged.files)
    release(stored)
    return read, staged


def stateful_task(
    attempt: Attempt, wanted: dict[str, Changes], dies: bool = False
) -> tuple[dict[str, dict[bytes, bytes]], CommitMessage | None]:
    """``KeyedState.finish``: one writer for the stage's namespaces (cells and timers), a put
    or delete per changed key, then each namespace's ``stage_range``; per namespace the
    task's read (a copy), and its commit message (None: it died after staging)."""
    before = {ns: attempt.read(ns) for ns in wanted}
    reads = {ns: dict(state) for ns, state in before.items()}
    writer = attempt.writer()
    for ns, changes in ((ns, _effective(before[ns], w)) for ns, w in wanted.items()):
        for key, value in changes.items():
            if value is None:
                writer.delete(ns, key)
            else:
                writer.put(ns, key, value)
        if dies:
            continue
        stage_range(writer, attempt.spec, attempt.subtask, ns, before[ns], changes,
                    _held(before[ns], changes))  # fmt: skip
    if dies:  # what it flushed so far stays, named by no commit
        release(*before.values())
        return reads, None
    staged = writer.finish()
    release(*before.values())
    return reads, staged


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

"""Task-side half of the two-phase commit: staged writers and their commit messages.

Owns: `StagedWriter`, used by one Spark task attempt named by (pipeline, stage, round,
partition, attempt): it writes the attempt's changes as staged changelog segments (and its
ranges' snapshots) under unique names, and `finish()` returns a small picklable
`CommitMessage`. Every task may run twice: attempts never share a file, and files no manifest
names are garbage (``CheckpointStore.clean``). Leaves to others: committing one message per
(stage, round, partition) (`commit`).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from enum import Enum

from sparkbeam.checkpoint import state_layout
from sparkbeam.checkpoint.changelog import DEFAULT_FLUSH_BYTES, ChangelogWriter, Op
from sparkbeam.checkpoint.filesystem import Storage, open_storage
from sparkbeam.checkpoint.ids import FileEntry, PipelineId
from sparkbeam.checkpoint.keygroups import DEFAULT_MAX_KEY_GROUPS, key_group
from sparkbeam.checkpoint.layout import pipeline_dir, staged_prefix
from sparkbeam.checkpoint.materialization import write_snapshot
from sparkbeam.checkpoint.task_state import TaskSnapshot

SPLIT_BYTES = 8 << 20  # a range's snapshot larger than this is split by key-group sub-range,
SPLITS = 8  # into at most this many (a restore at 2x the parallelism reads no other half)


class CommitStatus(Enum):
    """State of one checkpoint commit: STARTED -> PREPARED -> COMMITTED, or ABORTED."""

    STARTED = "started"
    PREPARED = "prepared"
    COMMITTED = "committed"
    ABORTED = "aborted"


@dataclass(frozen=True)
class CommitMessage:
    """What one finished task attempt staged; the driver names its files in a manifest."""

    pipeline_id: PipelineId
    stage: str
    round: int
    partition: int
    attempt: int
    files: tuple[FileEntry, ...]
    """Staged changelog segments, names relative to the pipeline directory."""
    completed: frozenset[str] = frozenset()
    source_positions: tuple[tuple[str, bytes], ...] = ()
    max_key_groups: int = DEFAULT_MAX_KEY_GROUPS
    namespaces: frozenset[str] = frozenset()
    """The namespaces its files change."""
    snapshots: tuple[TaskSnapshot, ...] = ()
    """Snapshots of task-owned key-group ranges as of this attempt's changes, or (``since``)
    of an earlier round's, written in the background."""
    counts: tuple[tuple[str, int, int, int], ...] = ()
    """(namespace, kg start, kg stop, keys): a task-owned range's size after this attempt."""

    @property
    def task_owned(self) -> bool:
        """Whether it changes task-owned namespaces only: the driver keeps its handles and
        reads none of its files. (A message that changes nothing is not.)"""
        names = self.namespaces | {c[0] for c in self.counts}
        return bool(names) and all(state_layout.is_task_owned(ns) for ns in names)

    @property
    def task(self) -> tuple[str, int, int]:
        """(stage, round, partition): the unit of which exactly one attempt may commit."""
        return (self.stage, self.round, self.partition)


def check_key(namespace: str, key: bytes, value: bytes | None = None) -> None:
    """TypeError with a clear message for non-str namespaces or non-bytes keys/values."""
    if type(namespace) is not str:
        raise TypeError(f"state namespace must be str, got {type(namespace).__name__}.")
    if type(key) is not bytes:
        raise TypeError(
            f"state key must be bytes, got {type(key).__name__} ({key!r:.40}); encode keys "
            "with the key coder first."
        )
    if value is not None and type(value) is not bytes:
        raise TypeError(
            f"state value for key {key!r:.40} must be bytes, got {type(value).__name__}; "
            "encode values with the state coder first."
        )


class StagedWriter:
    """Stages one task attempt's changes; a task opens one with the store URL, not the lock."""

    def __init__(
        self,
        storage: Storage | str,
        pipeline_id: str,
        stage: str,
        round: int,
        partition: int,
        attempt: int,
        *,
        max_key_groups: int = DEFAULT_MAX_KEY_GROUPS,
        flush_bytes: int = DEFAULT_FLUSH_BYTES,
    ):
        self.storage = open_storage(storage)
        self.pipeline_id = PipelineId(pipeline_id)
        self.stage, self.round, self.partition, self.attempt = stage, round, partition, attempt
        self.max_key_groups = max_key_groups
        self._log = ChangelogWriter(
            self.storage,
            pipeline_dir(pipeline_id),
            writer="seg",
            flush_bytes=flush_bytes,
            name_prefix=staged_prefix(stage, round, partition, attempt),
        )
        self._files: list[FileEntry] = []
        self._namespaces: set[str] = set()
        self._completed: set[str] = set()
        self._positions: dict[str, bytes] = {}
        self._snapshots: list[TaskSnapshot] = []
        self._counts: list[tuple[str, int, int, int]] = []
        self._finished = False
        self._message: CommitMessage | None = None
        self._finishing = threading.Event()

    def put(self, namespace: str, key: bytes, value: bytes) -> None:
        check_key(namespace, key, value)
        self.write_all(namespace, {key: value})

    def delete(self, namespace: str, key: bytes) -> None:
        check_key(namespace, key)
        self.write_all(namespace, {key: None})

    def write_all(self, namespace: str, changes: dict[bytes, bytes | None]) -> None:
        """``put`` each key's new value, ``delete`` each key mapped to None: one call for a
        task's changes to one namespace (a GroupByKey's keys), in the dict's order."""
        check_key(namespace, b"")
        self._check_open()
        if changes:
            self._namespaces.add(namespace)
        append, files, max_key_groups = self._log.append, self._files, self.max_key_groups
        for key, value in changes.items():
            if type(key) is not bytes or not (value is None or type(value) is bytes):
                check_key(namespace, key, value)  # raises, naming what is wrong
            op, data = (Op.DELETE, b"") if value is None else (Op.PUT, value)
            entry = append(op, key_group(key, max_key_groups), namespace, key, data)
            if entry is not None:
                files.append(entry)

    def _check_open(self) -> None:
        if self._finished:
            raise RuntimeError(
                f"StagedWriter for {self.pipeline_id!r} stage {self.stage!r} partition "
                f"{self.partition} attempt {self.attempt} is finished; open a new one."
            )

    def snapshot(
        self, namespace: str, start: int, stop: int, items: Iterable[tuple[bytes, bytes]],
        file_bytes: int, keep: tuple[FileEntry, ...] = (), kept_entries: int = 0,
    ) -> None:  # fmt: skip
        """`write_range_snapshot` as of this attempt's changes (files of at most ``file_bytes``:
        the task's budget decides, `StateRound.snapshot_file_bytes`). ``keep``: committed snapshot
        files, holding ``kept_entries`` other keys, that stay part of it (an append-only
        namespace writes only what its range's tail added)."""
        self._check_open()
        snap = write_range_snapshot(
            self.storage, pipeline_dir(self.pipeline_id), self._log.name_prefix,
            self.max_key_groups, namespace, start, stop, items, file_bytes,
        )  # fmt: skip
        if keep:
            snap = replace(snap, files=keep + snap.files, entries=kept_entries + snap.entries)
        self.add_snapshot(snap)
        self.count(namespace, start, stop, snap.entries)

    def add_snapshot(self, snapshot: TaskSnapshot) -> None:
        """Commit ``snapshot`` with this attempt (one written in the background, ``since``)."""
        self._check_open()
        self._snapshots.append(snapshot)

    def count(self, namespace: str, start: int, stop: int, entries: int) -> None:
        """Report that a task-owned ``namespace`` holds ``entries`` keys in ``[start, stop)``."""
        self._counts.append((namespace, start, stop, entries))

    def mark_completed(self, marker: str) -> None:
        self._completed.add(marker)

    def set_source_position(self, name: str, value: bytes) -> None:
        self._positions[name] = bytes(value)

    def finish(self) -> CommitMessage:
        """Write what is buffered and describe it; the driver commits or ignores it."""
        entry = self._log.flush()
        if entry is not None:
            self._files.append(entry)
        self._finished = True
        self._message = CommitMessage(
            pipeline_id=self.pipeline_id,
            stage=self.stage,
            round=self.round,
            partition=self.partition,
            attempt=self.attempt,
            files=tuple(self._files),
            completed=frozenset(self._completed),
            source_positions=tuple(sorted(self._positions.items())),
            max_key_groups=self.max_key_groups,
            namespaces=frozenset(self._namespaces),
            snapshots=tuple(self._snapshots),
            counts=tuple(self._counts),
        )
        self._finishing.set()
        return self._message

    def finished(self, timeout_s: float) -> CommitMessage | None:
        """The message ``finish`` returned, once it has (another thread), else None."""
        return self._message if self._finishing.wait(timeout_s) else None


open_staged_writer = StagedWriter


def write_range_snapshot(
    storage: Storage, directory: str, prefix: str, max_key_groups: int, namespace: str,
    start: int, stop: int, items: Iterable[tuple[bytes, bytes]], file_bytes: int,
) -> TaskSnapshot:  # fmt: skip
    """Write ``items``, all of a task-owned ``namespace`` in key groups ``[start, stop)``, as
    that range's snapshot: past `SPLIT_BYTES` in files by key-group sub-range (a restore at
    another parallelism reads only its own), each of about ``file_bytes`` at most, so a range
    larger than memory is written a part at a time."""
    files, entries = [], 0
    for lo, hi, columns in _snapshot_parts(items, max_key_groups, start, stop, file_bytes):
        entry = write_snapshot(storage, directory, prefix, namespace, lo, hi, columns)
        files.append(entry)
        entries += entry.records
    return TaskSnapshot(namespace, start, stop, tuple(files), entries)


_Columns = tuple[list[int], list[bytes], list[bytes]]


def _snapshot_parts(
    items: Iterable[tuple[bytes, bytes]], max_key_groups: int, start: int, stop: int,
    file_bytes: int,
) -> Iterator[tuple[int, int, _Columns]]:  # fmt: skip
    """(kg_start, kg_stop, columns) of a range's snapshot: one part ``[start, stop)`` when its
    rows total at most ``min(file_bytes, SPLIT_BYTES)`` (even none); else up to `SPLITS`
    key-group sub-ranges, each written whenever it holds ``file_bytes / SPLITS``."""
    n = min(SPLITS, stop - start)
    bounds = [start + (stop - start) * i // n for i in range(n + 1)]
    part_of = [min(n - 1, max(0, bisect.bisect_right(bounds, kg) - 1)) for kg in range(stop)]
    parts: list[_Columns] = [([], [], []) for _ in range(n)]
    sizes = [0] * n
    whole, split = min(file_bytes, SPLIT_BYTES), False
    per_part = max(1, file_bytes // n)
    total = 0
    for key, value in items:
        kg = key_group(key, max_key_groups)
        i = part_of[kg] if kg < stop else n - 1
        kgs, keys, values = parts[i]
        kgs.append(kg)
        keys.append(key)
        values.append(value)
        size = len(key) + len(value)
        sizes[i] += size
        total += size
        if total > whole:
            split = True
        if split and sizes[i] >= per_part:
            yield bounds[i], bounds[i + 1], parts[i]
            parts[i], sizes[i] = ([], [], []), 0
    if not split:
        merged: _Columns = ([], [], [])
        for part in parts:
            merged[0].extend(part[0])
            merged[1].extend(part[1])
            merged[2].extend(part[2])
        yield start, stop, merged
        return
    for i, part in enumerate(parts):
        if part[0]:
            yield bounds[i], bounds[i + 1], part

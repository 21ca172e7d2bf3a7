"""A task's key-group range of a task-owned namespace in one round: read, change, stage; or
append rows to it.

Every keyed task (GroupByKey buffers, stateful cells and timers, SDF residuals, a triggered
side input's view) reads its range as of the round's checkpoint (``staged_state``), changes
some keys, stages the changes with the range's count or snapshot (`TaskRange.stage`; a grown
tail is snapshotted in the background, ``background_snapshots``), and once the writer finished
keeps the read, changes applied, as the next round's read. `TaskRange` is that sequence; a
task says only what is special to it. Several ranges may stage into one writer: `finish`.

Append-only rows (`RowKeeper`: a durable batch SDF stage's output chunks, a streaming stage's
pushed-back input, `state_layout.APPEND_ONLY_PREFIXES`) are kept in the task's own key groups
without reading the range, two-phase: only the committed attempt's rows count, and the driver
holds handles, never rows. A range due a snapshot rewrites only what its tail added since the
base (each row is rewritten about once), or the whole range when the commit asked for a
fallback (the next checkpoint then shares no file with the retained one). One task per subtask
keeps rows (``as_subtasks``): two tasks snapshotting one range would each miss the other's.
Rows with an end (`RowExpiry`) leave the snapshot once expired, and a quarter expired makes
one due, so the store shrinks as windows expire.

Leaves to others: how a read is kept (``staged_state``), when a range is due a snapshot
(``task_state.snapshot_due``), what the values mean (``state_layout``).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from sparkbeam.checkpoint import key_group_range, open_staged_writer, state_layout
from sparkbeam.checkpoint.ids import FileEntry
from sparkbeam.checkpoint.keygroups import KeyGroupRange, key_in_groups
from sparkbeam.checkpoint.layout import pipeline_dir
from sparkbeam.checkpoint.reader import iter_appended, namespace_files
from sparkbeam.checkpoint.staging import CommitMessage
from sparkbeam.checkpoint.task_state import Due, NamespaceState
from sparkbeam.runner.spark.filesystem_options import apply_in_task
from sparkbeam.runner.task import background_snapshots, held_state
from sparkbeam.runner.task.staged_state import (
    StateRound,
    keep_staged,
    namespace_chains,
    range_slot,
    read_task_state,
    task_store,
    with_changes,
)


class TaskRange:
    """The key groups ``subtask`` owns of ``namespace``, as of the round's checkpoint, and the
    round's changes to them (``changes``: key -> new value, None: deleted)."""

    def __init__(
        self, spec: StateRound, subtask: int, namespace: str,
        stored: Mapping[bytes, bytes] | None = None,
    ) -> None:  # fmt: skip
        """Read the range (``stored``: already read, or a test's state; not kept then)."""
        self.spec, self.subtask, self.namespace = spec, subtask, namespace
        self.groups = key_group_range(subtask, spec.parallelism, spec.max_key_groups)
        self._read = stored is None and spec.checkpoint_id is not None
        if stored is None:
            stored = read_task_state(spec, subtask, namespace) if self._read else {}
        self.stored: Mapping[bytes, bytes] = stored  # read-only: the worker keeps it
        self.changes: dict[bytes, bytes | None] = {}
        self._ids: Iterator[bytes] | None = None

    def get(self, key: bytes) -> bytes | None:
        if key in self.changes:
            return self.changes[key]
        return self.stored.get(key)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """The range as of its changes (streamed: ``stored`` may be on disk)."""
        return with_changes(self.stored.items(), self.changes)

    def put(self, key: bytes, value: bytes) -> None:
        self.changes[key] = value

    def delete(self, key: bytes) -> None:
        if key in self.stored:
            self.changes[key] = None
        else:
            self.changes.pop(key, None)  # put and deleted in this round: nothing to stage

    def update(self, key: bytes, old: bytes | None, new: bytes | None) -> None:
        """``key`` from ``old`` to ``new`` (None: absent), staging only a change."""
        if new is None:
            if old is not None:
                self.delete(key)
        elif new != old:
            self.put(key, new)

    def new_key(self, prefix: bytes) -> bytes:
        """``prefix`` + 0x00 + an id unique to this attempt whose key group is in the range (it
        stays with this subtask, and follows its key group when the parallelism changes)."""
        if self._ids is None:
            tag = uuid.uuid4().bytes[:12]
            self._ids = (tag + i.to_bytes(4, "big") for i in itertools.count())
        return key_in_groups(prefix + b"\x00", self._ids, self.groups, self.spec.max_key_groups)

    def held(self) -> int:
        """Keys the range holds after the changes: counted from them, not listed."""
        stored = self.stored
        added = sum(1 for k, v in self.changes.items() if v is not None and k not in stored)
        return len(stored) + added - sum(1 for v in self.changes.values() if v is None)

    def stage(self, writer, keys: int | None = None) -> None:
        """Write the changes to ``writer``, with the range's count (``keys``, or `held`) or,
        when one is due, its snapshot (written in the background when the tail has grown)."""
        writer.write_all(self.namespace, self.changes)
        held = self.held() if keys is None else keys
        spec, groups, namespace = self.spec, self.groups, self.namespace
        chains = namespace_chains(spec, namespace)
        due = None
        if chains is not None:
            slot = range_slot(spec, namespace, groups)
            due = chains.snapshot_due(groups)
            if due is Due.GROWN and (
                background_snapshots.report(writer, slot, chains, groups)  # or being written
                or background_snapshots.start(
                    writer, slot, chains, groups, namespace, self.stored, self.changes,
                    spec.snapshot_file_bytes,
                )
            ):  # fmt: skip
                due = None
        if due is None:
            writer.count(namespace, groups.start, groups.stop, held)
        else:  # streamed from the read: it may be on disk
            writer.snapshot(namespace, groups.start, groups.stop, self.items(),
                            spec.snapshot_file_bytes)  # fmt: skip

    def keep(self, staged: CommitMessage) -> None:
        """After the writer finished as ``staged``: keep the read, changes applied, as the read
        of the checkpoint that commits ``staged``, and release it (not to be used after)."""
        if self._read:
            files = staged.files if self.namespace in staged.namespaces else ()
            keep_staged(self.spec, self.subtask, self.namespace, self.stored, self.changes, files)
        self.release()

    def release(self) -> None:
        """Done with the read without keeping it (a task that failed or staged nothing)."""
        held_state.release(self.stored)


def finish(writer, *ranges: TaskRange) -> CommitMessage:
    """Finish ``writer``, into which ``ranges`` staged, and keep each range's read."""
    staged = writer.finish()
    for task_range in ranges:
        task_range.keep(staged)
    return staged


def staged_writer_for_task(spec: StateRound, stage: str):
    """The round's staged writer of ``stage``, named by this Spark task's partition and attempt."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("staged_writer_for_task runs inside a Spark task only")
    apply_in_task()
    return open_staged_writer(
        spec.url, spec.pipeline, stage, spec.round_no, ctx.partitionId(), ctx.attemptNumber(),
        max_key_groups=spec.max_key_groups,
    )  # fmt: skip


EXPIRED_SHARE = 4
"""A range whose expired rows are this share of its rows (a quarter) snapshots without them."""


@dataclass(frozen=True)
class RowExpiry:
    """Rows that carry their windows' latest end: those that ended by ``horizon`` go."""

    horizon: int
    rows: Callable[[FileEntry, bool, KeyGroupRange], list[tuple[bytes, int, bytes | None]]]
    """(key, latest end, chunk or None) of a committed file's rows in the key groups (a
    snapshot file or not): the worker's read (``task.side_input_files``)."""
    name: str
    """The rows' name (a side input's buffer): a row's value holds it, its chunk and end."""


class RowKeeper:
    """The rows one task (``subtask``) keeps in ``namespace`` this round, staged by
    ``writer``; `finish` before the writer does. With ``expiry``, rows carry an end."""

    def __init__(
        self, spec: StateRound, namespace: str, subtask: int, writer,
        expiry: RowExpiry | None = None,
    ) -> None:  # fmt: skip
        self.spec, self.namespace, self.subtask, self.writer = spec, namespace, subtask, writer
        self.groups = key_group_range(subtask, spec.parallelism, spec.max_key_groups)
        self.chains = namespace_chains(spec, namespace)
        self.due = self.chains.snapshot_due(self.groups) if self.chains is not None else None
        self.expiry = expiry
        self.committed: list = []  # with expiry: per committed file of the range, its rows
        self.expired = False  # enough rows expired: the range snapshots without them
        if expiry is not None and self.chains is not None:
            self.committed = [
                (entry, snapshot, expiry.rows(entry, snapshot, sub))
                for sub, entry, snapshot in namespace_files(self.chains, self.groups)
            ]
            rows = [end for _, _, held in self.committed for _, end, _ in held]
            gone = sum(1 for end in rows if end <= expiry.horizon)
            self.expired = gone > 0 and gone * EXPIRED_SHARE >= len(rows)
        self.made: list[tuple[bytes, bytes]] = []  # this round's rows, kept only for a snapshot
        self._ids = itertools.count()
        self.rows = 0

    def add(self, name: str, data: bytes, end: int | None = None) -> None:
        """One row; ``end``: its windows' latest end (a side input's row, with expiry)."""
        spec = self.spec
        prefix = state_layout.row_key(spec.round_no, self.subtask, self.rows, round_width=8)
        ids = (i.to_bytes(4, "big") for i in self._ids)
        key = key_in_groups(prefix, ids, self.groups, spec.max_key_groups)
        if end is None:
            value = state_layout.encode_row(name, data)
        else:
            value = state_layout.encode_side_row(name, data, end)
        self.writer.put(self.namespace, key, value)
        if self.due is not None or self.expired:
            self.made.append((key, value))
        self.rows += 1

    def finish(self) -> None:
        """The range's snapshot when one is due (or enough rows expired), else its count."""
        groups = self.groups
        if self.due is None and not self.expired:
            if self.rows:
                known = _counted(self.chains, groups)
                self.writer.count(self.namespace, groups.start, groups.stop, known + self.rows)
            return
        whole = self.due is Due.REQUESTED
        items, keep, kept = self._unexpired(whole) if self.expiry else self._appended(whole)
        self.writer.snapshot(
            self.namespace, groups.start, groups.stop, items, self.spec.snapshot_file_bytes,
            keep=tuple(keep), kept_entries=kept,
        )  # fmt: skip

    def _appended(self, whole: bool) -> tuple[Iterable, list[FileEntry], int]:
        """(rows, base files kept, their rows): what the tail added and this round's rows, in
        new files beside the base's (``whole``: the range anew). Read a file at a time."""
        spec, chains, groups = self.spec, self.chains, self.groups
        assert chains is not None  # a range is due only as of a checkpoint's ranges
        committed = iter_appended(
            task_store(spec.url).storage, pipeline_dir(spec.pipeline), self.namespace, chains,
            groups, bases=whole,
        )  # fmt: skip
        keep: dict[str, FileEntry] = {}
        for _, r, _ in () if whole else chains.plan(groups):
            keep.update((f.name, f) for f in r.base)
        kept = sum(f.records for f in keep.values() if _inside(f.kg_start, f.kg_stop, groups))
        return itertools.chain(committed, self.made), list(keep.values()), kept

    def _unexpired(self, whole: bool) -> tuple[Iterable, list[FileEntry], int]:
        """`_appended` without the rows that expired: the base's files that hold none are
        kept; the other files' rows that did not expire, and this round's, are written anew."""
        expiry = self.expiry
        assert expiry is not None
        horizon = expiry.horizon
        dirty = {
            entry.name
            for entry, snapshot, rows in self.committed
            if whole or not snapshot or any(end <= horizon for _, end, _ in rows)
        }
        keep: dict[str, FileEntry] = {}
        items: list[tuple[bytes, bytes]] = []
        kept = 0
        for entry, _, rows in self.committed:
            if entry.name not in dirty:
                keep[entry.name] = entry
                kept += len(rows)
                continue
            for key, end, chunk in rows:
                if end > horizon:
                    if chunk is None:  # a worker drops a chunk only once it expired
                        raise RuntimeError(f"{self.namespace}: row {key!r} held no chunk")
                    items.append((key, state_layout.encode_side_row(expiry.name, chunk, end)))
        items.extend(self.made)  # not expired: `add` was given only those
        return items, list(keep.values()), kept


def _inside(start: int, stop: int, groups: KeyGroupRange) -> bool:
    return groups.start <= start < stop <= groups.stop


def _counted(chains: NamespaceState | None, groups: KeyGroupRange) -> int:
    """Rows the ranges inside ``groups`` held, as their tasks last counted them."""
    ranges = chains.plan(groups) if chains is not None else ()
    return sum(r.entries for _, r, _ in ranges if _inside(r.start, r.stop, groups))


def read_rows(spec: StateRound, namespace: str, subtask: int) -> Iterator[tuple[str, bytes]]:
    """(name, data) of the rows in ``subtask``'s key groups, as of the round's checkpoint."""
    store = task_store(spec.url)
    manifest = store.load_manifest(spec.pipeline, spec.checkpoint_id)
    groups = key_group_range(subtask, spec.parallelism, manifest.max_key_groups)
    chains = manifest.task_state.namespaces.get(namespace)
    if chains is None:
        return
    directory = pipeline_dir(spec.pipeline)
    for _, value in iter_appended(store.storage, directory, namespace, chains, groups):
        yield state_layout.decode_row(value, namespace)


def reading_rows(spec: StateRound, namespace: str, as_record: Callable) -> Callable:
    """The task body ``(subtask, rows)`` of a dataset of the kept rows, each ``as_record``."""

    def read(subtask: int, _rows) -> Iterator:
        for name, data in read_rows(spec, namespace, subtask):
            yield as_record(name, data)

    return read

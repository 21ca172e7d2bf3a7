"""Task side of a streaming side input kept in the store: its tasks write it, readers read files.

A side input fills over rounds. Rather than collecting it on the driver and broadcasting all of
it each round, the round that first reads a side input has its tasks keep what its writers
emitted, each in its own key groups, and the driver learns only the staged files' handles.
Without a trigger, every chunk stays part of it (``side-rows/<buffer>``, task-owned and
append-only: ``task.kept_rows``, one task per subtask, `keeping_side_input`); a triggered side
input is per window its latest firing (``side-view/<buffer>``: ``task.side_input_view``). A
reading task gets `SideInputFiles` -- the checkpoint's files of the namespace and the ones this
round staged, never a chunk -- and reads them (`side_input_chunks`). Each Python worker keeps
what it read per file (files are immutable), so a round reads only the files that are new
since the worker's last read: about one per writing subtask, and a range's snapshot once
after it is written.

Leaves which buffers are kept how, and the handles, to the driver
(``streaming.side_input_store``); serving the chunks to the SDK to ``task.side_input_state``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from sparkbeam.checkpoint import state_layout
from sparkbeam.checkpoint.changelog import Op, iter_records, read_segment
from sparkbeam.checkpoint.ids import FileEntry
from sparkbeam.checkpoint.keygroups import KeyGroupRange
from sparkbeam.checkpoint.layout import pipeline_dir
from sparkbeam.checkpoint.materialization import read_materialization
from sparkbeam.checkpoint.reader import namespace_files
from sparkbeam.checkpoint.task_state import NamespaceState
from sparkbeam.runner.task.kept_rows import RowKeeper
from sparkbeam.runner.task.range_staging import staged_writer_for_task
from sparkbeam.runner.task.records import CommitRecord
from sparkbeam.runner.task.staged_state import StateRound, task_store

COMMIT_PREFIX = "side:"  # the commit stage of a side input's keeping tasks: this, the buffer


@dataclass(frozen=True)
class FilePart:
    """One file of a kept side input, and the key groups of it that belong to the read."""

    entry: FileEntry
    snapshot: bool  # a range's snapshot (a materialization file), else a changelog segment
    start: int
    stop: int


@dataclass(frozen=True)
class SideInputFiles:
    """A kept side input as a reading task gets it: handles only (the driver reads no chunk)."""

    url: str
    pipeline: str
    namespace: str
    parts: tuple[FilePart, ...]
    rows: int  # chunks in it: a side input with none is not ready (``streaming.pushback``)
    view: bool = False  # a triggered side input's view: a chunk per window, replaced by later
    # files (``task.side_input_view``); else every chunk (`encode_row`), in key order

    def __bool__(self) -> bool:
        return self.rows > 0


def files_of(state: NamespaceState | None, staged: Iterable[FileEntry], max_key_groups: int):
    """The parts of a namespace: its checkpoint's files (per range, the base, then the tail),
    then ``staged`` changelog segments of the running round."""
    parts: list[FilePart] = []
    if state is not None:
        every = KeyGroupRange(0, state.max_key_groups)
        for sub, entry, snapshot in namespace_files(state, every):
            parts.append(FilePart(entry, snapshot, sub.start, sub.stop))
    parts.extend(FilePart(entry, False, 0, max_key_groups) for entry in staged)
    return tuple(parts)


def keeping_side_input(
    spec: StateRound, buffer: str, subtask: int, chunks, writer=None
) -> Iterator[CommitRecord]:
    """Task body: keep this subtask's share of the round's new chunks of ``buffer`` (staged
    by ``writer``, by default this Spark task's); yields its `CommitRecord`."""
    stage = commit_stage(buffer)
    if writer is None:
        writer = staged_writer_for_task(
            spec.url, spec.pipeline, stage, spec.round_no, spec.max_key_groups
        )
    keeper = RowKeeper(spec, state_layout.side_rows(buffer), subtask, writer)
    for chunk in chunks:
        keeper.add(buffer, chunk)
    keeper.finish()
    yield CommitRecord(stage, writer.finish())


def commit_stage(buffer: str) -> str:
    return f"{COMMIT_PREFIX}{buffer}"


def side_input_chunks(value) -> list[bytes]:
    """A side input's chunks as a task loads them: a list as it is; `SideInputFiles` read
    through this worker's cache, in key order (round, then subtask, then sequence)."""
    if not isinstance(value, SideInputFiles):
        return value or []
    return _CACHE.chunks(value)


class _ReadFiles:
    """Per worker process: what each kept side input's files held (a file at most once
    while it stays part of the side input), and the last merged list per side input."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[tuple, dict[FileEntry, list[tuple[Op, int, bytes, bytes]]]] = {}
        self._merged: dict[tuple, tuple[tuple[FilePart, ...], list[bytes]]] = {}

    def chunks(self, files: SideInputFiles) -> list[bytes]:
        which = (files.url, files.pipeline, files.namespace)
        with self._lock:
            merged = self._merged.get(which)
            if merged is not None and merged[0] == files.parts:
                return merged[1]
            held = self._rows.get(which, {})
            rows: dict[FileEntry, list] = {}
            for part in files.parts:
                read = rows.get(part.entry)
                if read is None:
                    read = held.get(part.entry)
                rows[part.entry] = read if read is not None else list(_read_file(files, part))
            self._rows[which] = rows  # files no longer named are dropped
            chunks = _merged(files, rows)
            self._merged[which] = (files.parts, chunks)
            return chunks


def _merged(files: SideInputFiles, rows: dict[FileEntry, list]) -> list[bytes]:
    """The side input's chunks from its files' rows (each part: its key groups only)."""
    if not files.view:
        every = sorted(
            (key, value)
            for part in files.parts
            for _, kg, key, value in rows[part.entry]
            if part.start <= kg < part.stop
        )
        return [state_layout.decode_row(v, files.namespace)[1] for _, v in every]
    windows: dict[bytes, bytes] = {}
    for part in files.parts:  # in order: a later file's firing replaces an earlier one's
        for op, kg, key, value in rows[part.entry]:
            if part.start <= kg < part.stop:
                if op is Op.PUT:
                    windows[key] = value
                else:
                    windows.pop(key, None)
    return [state_layout.decode_side_input(windows[k], files.namespace) for k in sorted(windows)]


def _read_file(files: SideInputFiles, part: FilePart) -> Iterator[tuple[Op, int, bytes, bytes]]:
    """(op, key group, key, value) of ``files.namespace`` in ``part``'s file, all key groups."""
    storage = task_store(files.url).storage
    path = f"{pipeline_dir(files.pipeline)}/{part.entry.name}"
    if part.snapshot:
        for kg, ns, key, value in read_materialization(storage, path, part.entry):
            if ns == files.namespace:
                yield Op.PUT, kg, key, value
        return
    for op, kg, ns, key, value in iter_records(read_segment(storage, path, part.entry), path):
        if ns == files.namespace:
            yield op, kg, key, value


_CACHE = _ReadFiles()

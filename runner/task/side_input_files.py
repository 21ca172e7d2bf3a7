"""Task side of a streaming side input kept in the store: its tasks write it, readers read files.

Rather than collecting a side input on the driver and broadcasting all of it each round, the
tasks of the round that first reads it keep what its writers emitted, each in its own key
groups: every chunk (``side-rows/<buffer>``, append-only, `keeping_side_input`), or for a
triggered side input per window its latest firing (``side-view/<buffer>``,
``task.side_input_view``). A reading task gets `SideInputFiles` -- handles, never a chunk --
and reads them (`side_input_chunks`); each Python worker keeps what it read per (immutable)
file, so a round reads only the files new since: about one per writing subtask.

A window is needed until every reader's watermark passed its end plus the largest allowed
lateness (a late main element reads its window): the driver passes that horizon
(`SideInputFiles.horizon`). Every row carries its windows' latest end: workers drop the chunks
that ended by it, and a keeping task leaves them out of its range's snapshot
(``task.task_range`` `RowExpiry`). The global window never ends. A keeping task reports the
latest end it kept (`SideInputHeld`), so the driver knows when a side input no stage writes
any more has expired (``task.side_input_expiry``).

Leaves which buffers are kept how, and the handles, to the driver
(``streaming.side_input_store``); serving the chunks to the SDK to ``task.side_input_state``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from apache_beam.transforms.window import GlobalWindow

from sparkbeam.checkpoint import state_layout
from sparkbeam.checkpoint.changelog import Op
from sparkbeam.checkpoint.ids import FileEntry
from sparkbeam.checkpoint.keygroups import KeyGroupRange
from sparkbeam.checkpoint.layout import pipeline_dir
from sparkbeam.checkpoint.reader import file_records, namespace_files
from sparkbeam.checkpoint.task_state import NamespaceState
from sparkbeam.runner.task.records import CommitRecord
from sparkbeam.runner.task.staged_state import StateRound, task_store
from sparkbeam.runner.task.task_range import RowExpiry, RowKeeper, staged_writer_for_task
from sparkbeam.runner.task.worker_context import plan_context, register_plan

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
    rows: int  # chunks in it, as its tasks counted them
    view: bool = False  # a triggered side input's view: a chunk per window, replaced by later
    # files (``task.side_input_view``); else every chunk (`encode_side_row`), in key order
    horizon: int | None = None  # rows whose windows all ended by this (micros) are dropped
    seen: bool = False  # data arrived once (its windows may have expired since)

    def __bool__(self) -> bool:
        """Ready: data has arrived (``streaming.pushback``)."""
        return self.rows > 0 or self.seen


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


def window_end(window) -> int:
    """A window's end (micros); `state_layout.END_NEVER` for the global window."""
    if isinstance(window, GlobalWindow):
        return state_layout.END_NEVER
    return window.max_timestamp().micros + 1


def latest_end(coder_impl, chunk: bytes) -> int:
    """The latest end of the windows of a chunk's elements (Beam-encoded, ``coder_impl``)."""
    ends = (window_end(w) for value in coder_impl.decode_all(chunk) for w in value.windows)
    return max(ends, default=-state_layout.END_NEVER)


@dataclass(frozen=True)
class Keeping:
    """What the task that keeps a side input's new chunks needs besides them: its coder (the
    chunks' windows), and its checkpoint's files with the round's horizon (what expired)."""

    buffer: str
    files: SideInputFiles
    plan_key: str
    components: Any  # broadcast of the plan's serialized components
    coder: str


class SideInputHeld(NamedTuple):
    """A keeping task's report of the latest unexpired window end (micros) it keeps of a side
    input (None: nothing), so the driver learns when it expires: ``complete``, of all its range
    holds (a round that only drops expired windows), else of the round's new data."""

    buffer: str
    latest: int | None
    complete: bool


def later(a: int | None, b: int | None) -> int | None:
    """The later of two ends (None: no end)."""
    return b if a is None else a if b is None else max(a, b)


def keeping_side_input(
    spec: StateRound, keeping: Keeping, subtask: int, chunks, writer=None, report=False
) -> Iterator:
    """Task body: keep this subtask's share of the round's unexpired new chunks, each with its
    windows' latest end (``writer``: by default this Spark task's). Yields its `CommitRecord`
    (with ``report``, then a `SideInputHeld` of the new chunks)."""
    buffer, files = keeping.buffer, keeping.files
    stage = commit_stage(buffer)
    if writer is None:
        writer = staged_writer_for_task(spec, stage)
    register_plan(keeping.plan_key, keeping.components.value)
    impl = plan_context(keeping.plan_key).coders[keeping.coder].get_impl()
    horizon = files.horizon
    expiry = None
    if horizon is not None:

        def rows(entry: FileEntry, snapshot: bool, groups: KeyGroupRange):
            part = FilePart(entry, snapshot, groups.start, groups.stop)
            return [(key, end, chunk) for _, _, key, end, chunk in _CACHE.part_rows(files, part)]

        expiry = RowExpiry(horizon, rows, buffer)
    keeper = RowKeeper(spec, files.namespace, subtask, writer, expiry)
    latest = None
    for chunk in chunks:
        end = latest_end(impl, chunk)
        if horizon is None or end > horizon:
            keeper.add(buffer, chunk, end)
            latest = later(latest, end)
    keeper.finish()
    yield CommitRecord(stage, writer.finish())
    if report:
        yield SideInputHeld(buffer, latest, complete=False)


def held_latest(files: SideInputFiles, groups: KeyGroupRange) -> int | None:
    """The latest end of the rows (or view windows) ``files`` hold in key groups ``groups``
    that did not expire by its horizon (None: none), read through this worker's cache."""
    held: dict[bytes, int | None] = {}
    for part in files.parts:  # in order: a view's later file replaces or deletes a window
        if part.stop <= groups.start or groups.stop <= part.start:
            continue
        for op, kg, key, end, _ in _CACHE.part_rows(files, part):
            if groups.start <= kg < groups.stop:
                held[key] = end if op is Op.PUT else None
    horizon = MIN if files.horizon is None else files.horizon
    return max((e for e in held.values() if e is not None and e > horizon), default=None)


def commit_stage(buffer: str) -> str:
    return f"{COMMIT_PREFIX}{buffer}"


def side_input_chunks(value) -> list[bytes]:
    """A side input's chunks as a task loads them: a list as it is; `SideInputFiles` read
    through this worker's cache, in key order (round, then subtask, then sequence)."""
    if not isinstance(value, SideInputFiles):
        return value or []
    return _CACHE.chunks(value)


# What a worker holds of a row: op, key group, key, its windows' latest end (None: a deleted
# row), and its chunk (None: deleted, or expired).
Row = tuple[Op, int, bytes, "int | None", "bytes | None"]


@dataclass
class _Held:
    """A worker's rows per file of one kept side input, as of ``horizon``, and its last merge."""

    horizon: int | None = None
    files: dict[FileEntry, list[Row]] = field(default_factory=dict)
    merged: tuple | None = None  # (parts, horizon, chunks)


class _ReadFiles:
    """Per worker process: each kept side input's files' rows (a file read once, expired
    chunks dropped) and its last merged list."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[tuple, _Held] = {}

    def chunks(self, files: SideInputFiles) -> list[bytes]:
        with self._lock:
            held = self._of(files)
            merged = held.merged
            if merged is not None and merged[:2] == (files.parts, files.horizon):
                return merged[2]
            rows = {part.entry: self._rows(files, held, part) for part in files.parts}
            held.files = rows  # files no longer named are dropped
            chunks = _merged(files, rows)
            held.merged = (files.parts, files.horizon, chunks)
            return chunks

    def part_rows(self, files: SideInputFiles, part: FilePart) -> list[Row]:
        """The rows of ``part``'s file in its key groups (for the task that keeps them)."""
        with self._lock:
            rows = self._rows(files, self._of(files), part)
        return [row for row in rows if part.start <= row[1] < part.stop]

    def _of(self, files: SideInputFiles) -> _Held:
        """What this worker holds of ``files``' side input, its chunks dropped by its horizon
        (held anew if the horizon went back, as after a restore)."""
        which = (files.url, files.pipeline, files.namespace)
        held = self._held.get(which)
        horizon = files.horizon
        back = (
            held is not None
            and held.horizon is not None
            and (MIN if horizon is None else horizon) < held.horizon
        )
        if held is None or back:
            held = self._held[which] = _Held(horizon)
        elif horizon != held.horizon:
            held.files = {e: _expired(rows, horizon) for e, rows in held.files.items()}
            held.horizon = horizon
        return held

    def _rows(self, files: SideInputFiles, held: _Held, part: FilePart) -> list[Row]:
        rows = held.files.get(part.entry)
        if rows is None:
            rows = held.files[part.entry] = _expired(list(_read_file(files, part)), held.horizon)
        return rows


MIN = -state_layout.END_NEVER


def _expired(rows: list[Row], horizon: int | None) -> list[Row]:
    """``rows`` without the chunks of those whose windows all ended by ``horizon``."""
    if horizon is None:
        return rows
    return [
        (op, kg, key, end, None) if chunk is not None and end is not None and end <= horizon
        else (op, kg, key, end, chunk)
        for op, kg, key, end, chunk in rows
    ]  # fmt: skip


def _merged(files: SideInputFiles, rows: dict[FileEntry, list[Row]]) -> list[bytes]:
    """The side input's chunks in key order from its files' rows (each part: its key groups
    only). Rows' keys are unique; a view's later file replaces or deletes a window's."""
    chunks: dict[bytes, bytes] = {}
    for part in files.parts:  # in order
        for _, kg, key, _, chunk in rows[part.entry]:
            if part.start <= kg < part.stop:
                if chunk is not None:
                    chunks[key] = chunk
                elif files.view:  # deleted, or expired
                    chunks.pop(key, None)
    return [chunks[k] for k in sorted(chunks)]


def _read_file(files: SideInputFiles, part: FilePart) -> Iterator[Row]:
    """The rows of ``files.namespace`` in ``part``'s file, all key groups."""
    storage = task_store(files.url).storage
    path = f"{pipeline_dir(files.pipeline)}/{part.entry.name}"
    ns = files.namespace
    records = file_records(storage, path, part.entry, part.snapshot, ns)
    for op, kg, key, value in records:
        if op is not Op.PUT:
            yield op, kg, key, None, None
        elif files.view:
            chunk, end = state_layout.decode_side_view(value, ns)
            yield op, kg, key, end, chunk
        else:
            _, chunk, end = state_layout.decode_side_row(value, ns)
            yield op, kg, key, end, chunk


_CACHE = _ReadFiles()

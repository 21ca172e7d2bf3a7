"""Reading a committed checkpoint back: replay, per-subtask reads, verification.

Owns: replaying a manifest into a sink (materialization first, then the changelog after it,
each file checked against the manifest before any of its records are used), reading task-owned
namespaces a file at a time, and verifying every file of a checkpoint. `SegmentCache` keeps
checked segments so a process that restores several subtasks reads each once. Leaves to
others: which checkpoint to read and falling back past damaged ones (`restore`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from sparkbeam.checkpoint import state_layout
from sparkbeam.checkpoint.changelog import (
    RANGED_READ_MIN_BYTES,
    DeleteFn,
    Op,
    PutFn,
    apply_records,
    iter_records,
    read_records,
    read_segment,
)
from sparkbeam.checkpoint.errors import CheckpointCorruptError
from sparkbeam.checkpoint.filesystem import Storage
from sparkbeam.checkpoint.ids import CheckpointId, FileEntry, PipelineId
from sparkbeam.checkpoint.keygroups import KeyGroupRange
from sparkbeam.checkpoint.manifest import Manifest
from sparkbeam.checkpoint.materialization import read_materialization
from sparkbeam.checkpoint.task_state import NamespaceState

DEFAULT_CACHE_BYTES = 64 << 20


class SegmentCache:
    """Checked changelog segments keyed by (path, checksum), least recently used evicted."""

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES):
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._bytes = 0

    def read(self, storage: Storage, path: str, entry: FileEntry) -> bytes:
        key = (path, entry.checksum)
        data = self._items.get(key)
        if data is not None:
            self._items.move_to_end(key)
            return data
        data = read_segment(storage, path, entry)
        if len(data) <= self.max_bytes:
            self._items[key] = data
            self._bytes += len(data)
            while self._bytes > self.max_bytes:
                _, old = self._items.popitem(last=False)
                self._bytes -= len(old)
        return data


def replay(
    storage: Storage,
    directory: str,
    manifest: Manifest,
    put: PutFn,
    delete: DeleteFn,
    key_groups: KeyGroupRange | None = None,
    cache: SegmentCache | None = None,
    *,
    driver_only: bool = False,
) -> None:
    """Apply the state of ``manifest`` in ``key_groups`` through put/delete: the driver's
    files, then (unless ``driver_only``) each task-owned namespace. `CheckpointCorruptError`
    names the first damaged file; the caller discards what was applied so far."""
    driver_put, driver_delete = _driver_owned(put), _driver_owned(delete)
    for entry in manifest.materialization:
        if not may_hold(entry, key_groups):
            continue
        path = f"{directory}/{entry.name}"
        for kg, ns, key, value in read_materialization(storage, path, entry, key_groups):
            driver_put(ns, key, value, kg)
    replay_changelog(
        storage, directory, manifest.changelog, driver_put, driver_delete, key_groups, cache
    )
    if driver_only:
        return
    for ns, state in sorted(manifest.task_state.namespaces.items()):
        replay_namespace(storage, directory, ns, state, put, delete, key_groups, cache)


def _driver_owned(change):
    def driver_owned(ns: str, *args) -> None:
        if not state_layout.is_task_owned(ns):
            change(ns, *args)

    return driver_owned


def replay_namespace(
    storage: Storage,
    directory: str,
    namespace: str,
    state: NamespaceState,
    put: PutFn,
    delete: DeleteFn,
    key_groups: KeyGroupRange | None = None,
    cache: SegmentCache | None = None,
) -> None:
    """Apply one task-owned namespace in ``key_groups``: per range, its base then its tail."""
    groups = key_groups or KeyGroupRange(0, state.max_key_groups)
    records = namespace_records(storage, directory, namespace, state, groups, cache=cache)
    apply_records(((op, kg, namespace, k, v) for op, kg, k, v, _ in records), put, delete)


def namespace_records(
    storage: Storage,
    directory: str,
    namespace: str,
    state: NamespaceState,
    groups: KeyGroupRange,
    bases: bool = True,
    cache: SegmentCache | None = None,
) -> Iterator[tuple[Op, int, bytes, bytes, str]]:
    """(op, key group, key, value, path) of one task-owned namespace in ``groups``, a file at
    a time: per range its base (unless not ``bases``) then its tail."""
    for sub, entry, snapshot in namespace_files(state, groups, bases):
        path = f"{directory}/{entry.name}"
        for op, kg, key, value in file_records(
            storage, path, entry, snapshot, namespace, sub, cache
        ):
            yield op, kg, key, value, path


def file_records(
    storage: Storage,
    path: str,
    entry: FileEntry,
    snapshot: bool,
    namespace: str,
    groups: KeyGroupRange | None = None,
    cache: SegmentCache | None = None,
) -> Iterator[tuple[Op, int, bytes, bytes]]:
    """(op, key group, key, value) of ``namespace`` in one task-owned file, checked against its
    manifest entry: a snapshot's rows as puts, a segment's records; of ``groups``, else all."""
    if snapshot:
        rows = read_materialization(storage, path, entry, groups)
        return ((Op.PUT, kg, key, value) for kg, ns, key, value in rows if ns == namespace)
    if groups is None:
        records = iter_records(read_segment(storage, path, entry), path)
    else:
        records = _segment_records(storage, path, entry, groups, cache)
    return ((op, kg, key, value) for op, kg, ns, key, value in records if ns == namespace)


def _segment_records(storage, path, entry: FileEntry, groups: KeyGroupRange, cache):
    """The records of ``groups`` in a segment: a large one of other key groups as well by its
    blocks of these (`changelog.read_records`), any other whole, through ``cache``."""
    inside = groups.start <= entry.kg_start and entry.kg_stop <= groups.stop
    if entry.kg_stop > entry.kg_start and not inside and entry.size >= RANGED_READ_MIN_BYTES:
        return read_records(storage, path, entry, groups)
    data = cache.read(storage, path, entry) if cache else read_segment(storage, path, entry)
    return iter_records(data, path, groups)


def namespace_files(
    state: NamespaceState, groups: KeyGroupRange, bases: bool = True
) -> Iterator[tuple[KeyGroupRange, FileEntry, bool]]:
    """(key groups to read, file, whether a snapshot) of one task-owned namespace in ``groups``
    in the order they apply, leaving out parts of split snapshots of other key groups."""
    for sub, r, tail in state.plan(groups):
        for entry in r.base if bases else ():
            if may_hold(entry, sub):
                yield sub, entry, True
        for entry in tail:
            yield sub, entry, False


def iter_appended(
    storage: Storage,
    directory: str,
    namespace: str,
    state: NamespaceState,
    key_groups: KeyGroupRange,
    bases: bool = True,
) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) of an append-only task-owned namespace (every key put once, never deleted)
    in ``key_groups``, a file at a time: per range its base (unless not ``bases``), its tail."""
    for op, _, key, value, path in namespace_records(
        storage, directory, namespace, state, key_groups, bases
    ):
        if op is not Op.PUT:
            raise ValueError(
                f"{path} deletes key {key[:32]!r} of {namespace!r}, whose keys are put once "
                "and never deleted; the store was written by another program."
            )
        yield key, value


def may_hold(entry: FileEntry, key_groups: KeyGroupRange | None) -> bool:
    """Whether a file may hold records of ``key_groups`` (None: all; no recorded range: any)."""
    return (
        key_groups is None
        or entry.kg_stop <= entry.kg_start
        or key_groups.overlaps(entry.kg_start, entry.kg_stop)
    )


def replay_changelog(
    storage: Storage,
    directory: str,
    entries: tuple[FileEntry, ...],
    put: PutFn,
    delete: DeleteFn,
    key_groups: KeyGroupRange | None = None,
    cache: SegmentCache | None = None,
) -> None:
    """Apply changelog ``entries`` in order (a manifest's, or the tail a reader has not seen)."""
    for entry in entries:
        if not may_hold(entry, key_groups):
            continue  # another subtask's segment (a task's segment holds only its key groups)
        path = f"{directory}/{entry.name}"
        data = cache.read(storage, path, entry) if cache else read_segment(storage, path, entry)
        apply_records(iter_records(data, path, key_groups), put, delete)


def read_state(
    storage: Storage,
    directory: str,
    manifest: Manifest,
    key_groups: KeyGroupRange | None,
    cache: SegmentCache | None = None,
) -> dict[tuple[str, bytes], bytes]:
    """The state of ``manifest`` in ``key_groups`` as a dict."""
    state: dict[tuple[str, bytes], bytes] = {}

    def put(ns: str, key: bytes, value: bytes, kg: int) -> None:
        state[(ns, key)] = value

    def delete(ns: str, key: bytes, kg: int) -> None:
        state.pop((ns, key), None)

    replay(storage, directory, manifest, put, delete, key_groups, cache)
    return state


@dataclass(frozen=True)
class VerificationResult:
    """Outcome of checking every file of one checkpoint."""

    pipeline_id: PipelineId
    checkpoint_id: CheckpointId
    ok: bool
    problems: tuple[str, ...]
    """One line per damaged file: the path and the reason."""
    files_checked: int
    bytes_checked: int


def verify_files(storage: Storage, directory: str, manifest: Manifest) -> VerificationResult:
    """Read every file named by ``manifest`` and check sizes, checksums and framing."""
    problems: list[str] = []
    nbytes = 0
    spaces = manifest.task_state.namespaces.values()
    snapshots = [*manifest.materialization, *(f for s in spaces for r in s.ranges for f in r.base)]
    segments = [*manifest.changelog, *(f for s in spaces for _, f in s.log)]
    files = {f.name: (f, True) for f in snapshots} | {f.name: (f, False) for f in segments}
    for entry, snapshot in files.values():
        path = f"{directory}/{entry.name}"
        try:
            if snapshot:
                for _ in read_materialization(storage, path, entry, KeyGroupRange(0, 0)):
                    pass
            else:
                read_segment(storage, path, entry)  # checks size, checksum and framing
            nbytes += entry.size
        except CheckpointCorruptError as e:
            problems.append(f"{path}: {e.reason}")
    return VerificationResult(
        pipeline_id=manifest.pipeline_id,
        checkpoint_id=manifest.checkpoint_id,
        ok=not problems,
        problems=tuple(problems),
        files_checked=len(manifest.files),
        bytes_checked=nbytes,
    )

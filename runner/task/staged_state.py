"""Task side of keyed state: read a subtask's key groups, keep the read for the next round.

A keyed stage's task reads the key groups it owns as of the last committed checkpoint and
stages its changes for the round's (two-phase: only the attempt whose report reaches the
driver is committed). Each worker process keeps a read-only store per URL (a segment is
fetched and checked once per process) and its last read per (namespace, key groups): when the
checkpoint extends that read (same materialization, its changelog a prefix; files are
immutable), only the segments committed since are applied. A task keeps its read with its
changes applied (``keep_staged``): when the next checkpoint names exactly the files it staged,
that is the next read, with no replay.

Within the memory budget (``--task_state_memory_mb``) a read is a dict, which another Python
worker of the executor catches up from (``shared_reads``); past it, a RocksDB on the
executor's disk (``held_state``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from sparkbeam.checkpoint import key_group_range, open_store, state_layout
from sparkbeam.checkpoint.errors import CheckpointCorruptError, TaskStateDamagedError
from sparkbeam.checkpoint.ids import FileEntry
from sparkbeam.checkpoint.layout import pipeline_dir
from sparkbeam.checkpoint.reader import may_hold, replay_changelog, replay_namespace
from sparkbeam.checkpoint.task_state import NamespaceState
from sparkbeam.runner.spark.filesystem_options import apply_in_task
from sparkbeam.runner.task import held_state, shared_reads

_LOCK = threading.Lock()
_STORES: dict[str, object] = {}


def task_store(url: str):
    """This worker's read-only store of ``url`` (one per process, its segment cache shared)."""
    apply_in_task()
    with _LOCK:
        store = _STORES.get(url)
        if store is None:
            store = open_store(url, read_only=True, materialization_interval_s=None)
            _STORES[url] = store
        return store


DEFAULT_MEMORY_BYTES = 256 << 20  # a worker's kept reads; past it a read spills to disk
CATCH_UP_SHARE = 10_000  # records replayed from the store after which a read is shared whole


@dataclass(frozen=True, kw_only=True)
class StateRound:
    """What every task of a keyed stage needs of one round to read and stage its state."""

    pipeline: str
    url: str
    checkpoint_id: int | None  # state as of this checkpoint; None: no state yet
    round_no: int
    parallelism: int
    max_key_groups: int
    memory_bytes: int = DEFAULT_MEMORY_BYTES  # --task_state_memory_mb of a worker

    @property
    def snapshot_file_bytes(self) -> int:
        """A range's snapshot is written in files of at most this size (a quarter of the
        memory budget: the writer holds one file's rows at a time)."""
        return self.memory_bytes // 4


@dataclass
class _Read:
    """The state of one (namespace, key groups) as of a manifest's (immutable) files, by name."""

    materialization: tuple[str, ...]
    changelog: tuple[str, ...]
    state: Mapping[bytes, bytes]  # a dict, or a `SpilledState`
    size: int  # bytes of keys and values
    staged: tuple[str, ...] | None = None
    """Files an attempt staged whose changes ``state`` already holds (``keep_staged``); they
    count as read once a manifest names them all after ``changelog``."""


def namespace_chains(spec: StateRound, namespace: str) -> NamespaceState | None:
    """``namespace``'s ranges in the checkpoint the round's state is as of (None: none yet)."""
    if spec.checkpoint_id is None:
        return None
    manifest = task_store(spec.url).load_manifest(spec.pipeline, spec.checkpoint_id)
    return manifest.task_state.namespaces.get(namespace) if manifest.task_state else None


def range_slot(spec: StateRound, namespace: str, groups) -> tuple:
    """What names one key-group range's state in a worker and its executor."""
    return (spec.url, spec.pipeline, namespace, groups.start, groups.stop)


def _names(entries) -> tuple[str, ...]:
    return tuple(e.name for e in entries)


_READS: OrderedDict[tuple, _Read] = OrderedDict()


def read_task_state(spec: StateRound, subtask: int, namespace: str) -> Mapping[bytes, bytes]:
    """{key: value} of task-owned ``namespace`` in ``subtask``'s key groups as of the round's
    checkpoint: a dict, or a `SpilledState` past the memory budget. Kept for the next round:
    not to be changed, only handed to ``keep_staged`` and released (`task_range.TaskRange`).
    A damaged or missing file raises `TaskStateDamagedError`, naming it and the checkpoint:
    the driver then falls back to a sound checkpoint."""
    try:
        return _read_task_state(spec, subtask, namespace)
    except CheckpointCorruptError as e:
        raise TaskStateDamagedError.of(e, spec.url, spec.pipeline, spec.checkpoint_id) from e


def _read_task_state(spec: StateRound, subtask: int, namespace: str) -> Mapping[bytes, bytes]:
    held_state.release_earlier()
    store = task_store(spec.url)
    checkpoint_id = spec.checkpoint_id
    manifest = store.load_manifest(spec.pipeline, checkpoint_id)
    groups = key_group_range(subtask, spec.parallelism, manifest.max_key_groups)
    chains = manifest.task_state.namespaces.get(namespace)
    if chains is None:
        return {}  # nothing committed yet
    view = _ChainView(checkpoint_id, namespace, chains, groups)
    slot = range_slot(spec, namespace, groups)
    budget = spec.memory_bytes
    with _LOCK:
        last = _READS.pop(slot, None)  # re-inserted only once this read succeeded
    tail = _Tail.of(last, view, groups)
    if (tail is None or tail.rest) and shared_reads.changed(slot):
        # Another Python worker of this executor read this slot since: its read may be later.
        loaded = shared_reads.load(slot)
        shared = _Tail.of(_Read(*loaded) if loaded else None, view, groups)
        if shared is not None and (tail is None or len(shared.rest) < len(tail.rest)):
            tail = shared
    spilled = None if tail is not None else held_state.open_spilled(slot, budget)
    if spilled is not None and spilled.identity is not None:  # larger than the budget: kept
        materialization, changelog, staged, _, size = spilled.identity
        tail = _Tail.of(_Read(materialization, changelog, spilled, size, staged), view, groups)
    where = f"checkpoint {checkpoint_id} of pipeline {spec.pipeline!r} in store {spec.url!r}"
    read = _Apply(store, spec.pipeline, namespace, groups, slot, budget, where)
    if tail is None or not read.extend(tail):
        if spilled is not None:
            spilled.close()  # its directory is emptied if the read spills again
        read.whole(view)
    elif spilled is not None and read.state is not spilled:
        spilled.close()
    if isinstance(read.state, held_state.SpilledState):
        read.state.claim(_names(view.materialization), _names(view.changelog), None)
    elif read.size <= budget:
        kept = _Read(_names(view.materialization), _names(view.changelog), *read.result)
        _keep(slot, kept, budget)
        if read.replayed >= CATCH_UP_SHARE:  # a long way from the last whole read shared
            shared_reads.save(slot, kept.materialization, kept.changelog, *read.result, None)
    return read.state


@dataclass(frozen=True)
class _Handle:
    name: str


class _ChainView:
    """A task-owned namespace's files for some key groups, in a manifest's shape: the ranges'
    identities (bounds, base files, tail start) as ``materialization``, their tails' segments
    in commit order as ``changelog``, so a read of the same ranges extends by later ones."""

    def __init__(self, checkpoint_id: int | None, namespace: str, chains, groups) -> None:
        self.checkpoint_id = checkpoint_id
        self.namespace, self.chains, self.groups = namespace, chains, groups
        plan = chains.plan(groups)
        self.materialization = tuple(
            _Handle(f"{r.start}-{r.stop}@{r.since}:{','.join(f.name for f in r.base)}")
            for _, r, _ in plan
        )
        order = {f.name: seq for seq, f in chains.log}
        tails = {f.name: f for _, _, tail in plan for f in tail}
        self.changelog = tuple(sorted(tails.values(), key=lambda f: order[f.name]))


def replay_whole(storage, directory: str, view: _ChainView, put, delete, groups, cache) -> None:
    """Replay a task-owned namespace's state in ``groups``: per range its base, then its tail."""
    replay_namespace(storage, directory, view.namespace, view.chains, put, delete, groups, cache)


@dataclass(frozen=True)
class _Tail:
    """What a kept read lacks of a manifest: ``rest``, applied on top, after ``unchecked``
    files, which come before the last file the read's attempt staged and must not change the
    namespace (else its changes would apply out of order: read whole)."""

    base: _Read
    unchecked: tuple[FileEntry, ...]
    rest: tuple[FileEntry, ...]

    @classmethod
    def of(cls, read: _Read | None, manifest, groups) -> _Tail | None:
        """None when ``read`` cannot be built on: another materialization or changelog, or its
        staged files not all committed after its changelog (another attempt, or not yet)."""
        if read is None or read.materialization != _names(manifest.materialization):
            return None
        seen = len(read.changelog)
        if _names(manifest.changelog[:seen]) != read.changelog:
            return None
        staged = set(read.staged or ())
        tail = [e for e in manifest.changelog[seen:] if may_hold(e, groups) or e.name in staged]
        if read.staged is None:
            return cls(read, (), tuple(tail))
        at = [i for i, e in enumerate(tail) if e.name in staged]
        if len(at) != len(staged):
            return None
        last = at[-1] if at else -1
        before = tuple(e for e in tail[:last] if e.name not in staged)
        return cls(read, before, tuple(tail[last + 1 :]))


class _Apply:
    """One read's replay of ``namespace``: into a dict, past the budget onto the executor's
    disk; a segment another worker of the executor staged, from its delta if there is one."""

    def __init__(
        self, store, pipeline: str, namespace: str, groups, slot: tuple, budget: int, where: str
    ) -> None:
        self.store, self.directory = store, pipeline_dir(pipeline)
        self.namespace, self.groups, self.slot, self.budget = namespace, groups, slot, budget
        self.state: Any = {}  # a dict, or a `SpilledState` once it outgrew the budget
        self.size = 0  # of a dict's keys and values
        self.replayed = 0  # records of the namespace replayed from the store (not deltas)
        self.where = where  # which checkpoint, for errors

    @property
    def result(self) -> tuple[dict[bytes, bytes], int]:
        return self.state, self.size

    def extend(self, tail: _Tail) -> bool:
        """Build on a kept read; False (and nothing kept) if an unchecked file changes it."""
        self.state, self.size = tail.base.state, tail.base.size
        found = []

        def touched(ns: str, key: bytes, *_: object) -> None:
            if ns == self.namespace:
                found.append(key)

        self._replay(tail.unchecked, touched, touched)
        if found:  # only the stage's own tasks write its namespace: not expected
            return False
        for entry in tail.rest:
            delta = shared_reads.load_delta(self.slot, entry.name)
            if delta is None:
                self._replay((entry,), self._counted(self._put), self._counted(self._delete))
            else:
                self._apply(delta)
        return True

    def whole(self, view: _ChainView) -> None:
        self.state, self.size = {}, 0
        cache = self.store._segment_cache
        storage = self.store.storage
        replay_whole(storage, self.directory, view, self._put, self._delete, self.groups, cache)
        self.replayed = CATCH_UP_SHARE

    def _counted(self, change):
        def counted(ns: str, *args) -> None:
            if ns == self.namespace:
                self.replayed += 1
            change(ns, *args)

        return counted

    def _replay(self, entries, put, delete) -> None:
        if entries:
            cache = self.store._segment_cache
            storage = self.store.storage
            replay_changelog(storage, self.directory, entries, put, delete, self.groups, cache)

    def _apply(self, delta: dict[bytes, bytes | None]) -> None:
        for key, value in delta.items():
            if value is None:
                self._delete(self.namespace, key, 0)
            else:
                self._put(self.namespace, key, value, 0)

    def _put(self, ns: str, key: bytes, value: bytes, kg: int) -> None:
        if ns != self.namespace:
            return
        state_layout.check_value(value, ns, self.where)
        state = self.state
        if type(state) is not dict:
            state.put(key, value)
            return
        old = state.get(key)
        self.size += len(value) - (len(old) if old is not None else -len(key))
        state[key] = value
        if self.size > self.budget:
            self._spill()

    def _delete(self, ns: str, key: bytes, kg: int) -> None:
        if ns != self.namespace:
            return
        state = self.state
        if type(state) is not dict:
            state.delete(key)
            return
        old = state.pop(key, None)
        if old is not None:
            self.size -= len(key) + len(old)

    def _spill(self) -> None:
        """Move the dict to the executor's disk (where there is none, it stays in memory)."""
        spilled = held_state.empty_spilled(self.slot, self.budget)
        if spilled is not None:
            spilled.put_all(self.state.items())
            self.state, self.size = spilled, 0


def with_changes(
    pairs: Iterable[tuple[bytes, bytes]], changes: Mapping[bytes, bytes | None]
) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) of ``pairs`` with ``changes`` applied (None: deleted), streamed."""
    for key, value in pairs:
        if key not in changes:
            yield key, value
    for key, change in changes.items():
        if change is not None:
            yield key, change


def keep_staged(
    spec: StateRound,
    subtask: int,
    namespace: str,
    state: Mapping[bytes, bytes],
    changes: dict[bytes, bytes | None],
    staged: tuple[FileEntry, ...],
) -> None:
    """Apply ``changes`` (None: deleted), staged in the files ``staged``, to ``state`` (from
    ``read_task_state``, if it was kept) and keep it as the read of the checkpoint that
    commits this attempt (the files' names are unique to it)."""
    groups = key_group_range(subtask, spec.parallelism, spec.max_key_groups)
    slot = range_slot(spec, namespace, groups)
    if isinstance(state, held_state.SpilledState):
        if state.read_as and state.is_open:
            for key, value in changes.items():
                if value is None:
                    state.delete(key)
                else:
                    state.put(key, value)
            state.claim(*state.read_as, _names(staged))
        return
    with _LOCK:
        read = _READS.pop(slot, None)
    if read is None or read.state is not state:
        return
    held = read.state  # the dict this module read (a spilled one returned above): its own
    assert isinstance(held, dict)
    size = read.size
    for key, value in changes.items():
        old = held.pop(key, None)
        if old is not None:
            size -= len(key) + len(old)
        if value is not None:
            held[key] = value
            size += len(key) + len(value)
    if size <= spec.memory_bytes:
        kept = _Read(read.materialization, read.changelog, held, size, _names(staged))
        _keep(slot, kept, spec.memory_bytes)
    if len(staged) == 1:  # for the worker that runs this slot next (a segment, one delta)
        shared_reads.save_delta(slot, staged[0].name, changes)


def _keep(slot: tuple, read: _Read, budget: int) -> None:
    """Keep ``read`` as ``slot``'s; drop the least recently read while over ``budget``."""
    with _LOCK:
        _READS[slot] = read
        total = sum(r.size for r in _READS.values())
        while total > budget and len(_READS) > 1:
            _, old = _READS.popitem(last=False)
            total -= old.size

"""Task side of streaming state: read a subtask's key groups, stage its changes.

A streaming stage with state (GroupByKey buffers, later user state) keeps no
state in executors between rounds: each round's task reads the key groups it
owns from the previous round's committed checkpoint and stages its changes for
the round's checkpoint (two-phase commit: only the attempt whose report reaches
the driver is committed). Each worker process keeps one read-only store per
URL, whose segment cache means a changelog segment is fetched and checked
once per process, not once per round, and the last state it read per
(namespace, key groups): the next round's read applies only the changelog
segments committed since, when the checkpoint extends the one it read (same
materialization, its changelog a prefix; files are immutable and named with
their checksums in the manifest), instead of replaying the whole state. A task that staged
changes keeps its read with them applied (``keep_staged``): when the next checkpoint names
exactly the files this attempt staged, that is the next read, with no replay at all. Another
Python worker of the executor, which runs the slot next more often than not, catches up from
what the workers share (``shared_reads``: whole reads now and then, a delta per round).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from sparkbeam.checkpoint import key_group_range, open_staged_writer, open_store, state_layout
from sparkbeam.checkpoint.ids import FileEntry
from sparkbeam.checkpoint.layout import pipeline_dir
from sparkbeam.checkpoint.reader import may_hold, replay, replay_changelog, replay_namespace
from sparkbeam.runner.spark.filesystem_options import apply_in_task
from sparkbeam.runner.task import shared_reads

_LOCK = threading.Lock()
_STORES: dict[str, object] = {}


def _store(url: str):
    apply_in_task()
    with _LOCK:
        store = _STORES.get(url)
        if store is None:
            store = open_store(url, read_only=True, materialization_interval_s=None)
            _STORES[url] = store
        return store


@dataclass
class _Read:
    """The state of one (namespace, key groups) as of a manifest's files (by name: a file is
    immutable and named by its content)."""

    materialization: tuple[str, ...]
    changelog: tuple[str, ...]
    state: dict[bytes, bytes]
    size: int  # bytes of keys and values
    staged: tuple[str, ...] | None = None
    """Files an attempt staged whose changes ``state`` already holds (``keep_staged``); they
    count as read once a manifest names them all after ``changelog``."""


def _names(entries) -> tuple[str, ...]:
    return tuple(e.name for e in entries)


_READS: OrderedDict[tuple, _Read] = OrderedDict()
READ_CACHE_BYTES = 256 << 20  # per worker process; a larger state is read whole every round
CATCH_UP_SHARE = 10_000  # records replayed from the store after which a read is shared whole


def read_task_state(
    url: str,
    pipeline: str,
    checkpoint_id: int,
    subtask: int,
    parallelism: int,
    namespace: str,
) -> dict[bytes, bytes]:
    """{key: value} of ``namespace`` in the key groups ``subtask`` owns at ``parallelism``.

    The caller must not change the dict (but may hand it to ``keep_staged``): this process
    keeps it for the next round's read."""
    store = _store(url)
    manifest = store.load_manifest(pipeline, checkpoint_id)
    groups = key_group_range(subtask, parallelism, manifest.max_key_groups)
    if _in_task_state(manifest, namespace):
        chains = manifest.task_state.namespaces.get(namespace)
        if chains is None:
            return {}  # nothing committed yet
        manifest = _ChainView(checkpoint_id, namespace, chains, groups)
    slot = (url, pipeline, namespace, groups.start, groups.stop)
    with _LOCK:
        last = _READS.pop(slot, None)  # re-inserted only once this read succeeded
    tail = _Tail.of(last, manifest, groups)
    if (tail is None or tail.rest) and shared_reads.changed(slot):
        # Another Python worker of this executor read this slot since: its read may be later.
        loaded = shared_reads.load(slot)
        shared = _Tail.of(_Read(*loaded) if loaded else None, manifest, groups)
        if shared is not None and (tail is None or len(shared.rest) < len(tail.rest)):
            tail = shared
    read = _Apply(store, pipeline, namespace, groups, slot)
    if tail is None or not read.extend(tail):
        read.whole(manifest)
    where = f"checkpoint {checkpoint_id} of pipeline {pipeline!r} in store {url!r}"
    for value in read.changed.values():
        state_layout.check_value(value, namespace, where)
    if read.size <= READ_CACHE_BYTES:
        kept = _Read(_names(manifest.materialization), _names(manifest.changelog), *read.result)
        _keep(slot, kept)
        if read.replayed >= CATCH_UP_SHARE:  # a long way from the last whole read shared
            shared_reads.save(slot, kept.materialization, kept.changelog, *read.result, None)
    return read.state


def _in_task_state(manifest, namespace: str) -> bool:
    """Whether ``manifest`` keeps ``namespace`` in its task-owned ranges; else its driver's
    files hold it (a version-1 manifest, or a namespace an older layout's driver kept:
    `state_layout.task_owned_since`; the restore that moved it wrote no manifest yet)."""
    if manifest.task_state is None or not state_layout.is_task_owned(namespace):
        return False
    moved = state_layout.task_owned_since(state_layout.layout_of(manifest.metadata))
    return not namespace.startswith(moved)


@dataclass(frozen=True)
class _Handle:
    name: str


class _ChainView:
    """A task-owned namespace's files for some key groups, in a manifest's shape: its ranges'
    identities (bounds, base files, where their tails start) as ``materialization``, the
    segments of their tails in commit order as ``changelog``; a read of the same ranges
    extends by the segments committed after it."""

    def __init__(self, checkpoint_id: int, namespace: str, chains, groups) -> None:
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


def replay_whole(storage, directory: str, source, put, delete, groups, cache) -> None:
    """Replay a manifest's state in ``groups``, or a task-owned namespace's (`_ChainView`)."""
    if isinstance(source, _ChainView):
        replay_namespace(
            storage, directory, source.namespace, source.chains, put, delete, groups, cache
        )
    else:
        replay(storage, directory, source, put, delete, groups, cache)


def stage_range(
    writer, spec, subtask: int, namespace: str, before: dict[bytes, bytes],
    changes: dict[bytes, bytes | None], keys: int,
) -> None:  # fmt: skip
    """After a task staged ``changes`` to ``before`` (its read of ``namespace``): report how
    many ``keys`` its key groups hold, or write their snapshot when one is due. ``spec`` has
    the round's ``url``, ``pipeline``, ``checkpoint_id``, ``parallelism``, ``max_key_groups``."""
    groups = key_group_range(subtask, spec.parallelism, spec.max_key_groups)
    args = (spec.url, spec.pipeline, spec.checkpoint_id, subtask, spec.parallelism, namespace)
    if not snapshot_due(*args):
        writer.count(namespace, groups.start, groups.stop, keys)
        return
    state = dict(before)
    for key, value in changes.items():
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    writer.snapshot(namespace, groups.start, groups.stop, state)


def snapshot_due(
    url: str, pipeline: str, checkpoint_id: int | None, subtask: int, parallelism: int,
    namespace: str,
) -> bool:  # fmt: skip
    """Whether the task owning ``subtask``'s key groups should snapshot ``namespace`` after
    this round (its ranges' tails have grown, or the commit asked for a fallback)."""
    if checkpoint_id is None:
        return False
    manifest = _store(url).load_manifest(pipeline, checkpoint_id)
    chains = manifest.task_state.namespaces.get(namespace) if manifest.task_state else None
    if chains is None:
        return False
    return chains.snapshot_due(key_group_range(subtask, parallelism, manifest.max_key_groups))


@dataclass(frozen=True)
class _Tail:
    """What a kept read lacks of a manifest: ``unchecked`` files come before the last file
    the read's attempt staged and must not change the namespace (if one does, an attempt's
    changes would apply out of order: read whole); ``rest`` is applied on top."""

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
    """One read's replay into a state dict: puts and deletes of ``namespace`` only; a segment
    another worker of the executor staged is applied from its delta when there is one."""

    def __init__(self, store, pipeline: str, namespace: str, groups, slot: tuple) -> None:
        self.store, self.directory = store, pipeline_dir(pipeline)
        self.namespace, self.groups, self.slot = namespace, groups, slot
        self.state: dict[bytes, bytes] = {}
        self.changed: dict[bytes, bytes] = {}
        self.size = 0
        self.replayed = 0  # records of the namespace replayed from the store (not deltas)

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

    def whole(self, manifest) -> None:
        self.state, self.changed, self.size = {}, {}, 0
        cache = self.store._segment_cache
        storage = self.store.storage
        replay_whole(storage, self.directory, manifest, self._put, self._delete, self.groups, cache)
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
        if ns == self.namespace:
            old = self.state.get(key)
            self.size += len(value) - (len(old) if old is not None else -len(key))
            self.state[key] = self.changed[key] = value

    def _delete(self, ns: str, key: bytes, kg: int) -> None:
        if ns == self.namespace:
            old = self.state.pop(key, None)
            if old is not None:
                self.size -= len(key) + len(old)
            self.changed.pop(key, None)


def keep_staged(
    url: str,
    pipeline: str,
    subtask: int,
    parallelism: int,
    max_key_groups: int,
    namespace: str,
    state: dict[bytes, bytes],
    changes: dict[bytes, bytes | None],
    staged: tuple[FileEntry, ...],
) -> None:
    """After a task staged ``changes`` (None: deleted) to ``namespace`` in the files ``staged``:
    apply them to ``state``, the dict ``read_task_state`` returned it, and keep that as this
    slot's read, valid for the checkpoint that commits this attempt (the files' names are
    unique to it). Not kept if the read was not (too large)."""
    groups = key_group_range(subtask, parallelism, max_key_groups)
    slot = (url, pipeline, namespace, groups.start, groups.stop)
    with _LOCK:
        read = _READS.pop(slot, None)
    if read is None or read.state is not state:
        return
    size = read.size
    for key, value in changes.items():
        old = state.pop(key, None)
        if old is not None:
            size -= len(key) + len(old)
        if value is not None:
            state[key] = value
            size += len(key) + len(value)
    if size <= READ_CACHE_BYTES:
        kept = _Read(read.materialization, read.changelog, state, size, _names(staged))
        _keep(slot, kept)
    if len(staged) == 1:  # for the worker that runs this slot next (a segment, one delta)
        shared_reads.save_delta(slot, staged[0].name, changes)


def _keep(slot: tuple, read: _Read) -> None:
    with _LOCK:
        _READS[slot] = read
        _evict()


def _evict() -> None:
    """Drop the least recently read states while the cache is over its bytes (under _LOCK)."""
    total = sum(r.size for r in _READS.values())
    while total > READ_CACHE_BYTES and len(_READS) > 1:
        _, old = _READS.popitem(last=False)
        total -= old.size


def staged_writer_for_task(url: str, pipeline: str, stage: str, round_no: int, max_key_groups: int):
    """A staged writer named by this Spark task's partition and attempt."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("staged_writer_for_task runs inside a Spark task only")
    apply_in_task()
    return open_staged_writer(
        url,
        pipeline,
        stage,
        round_no,
        ctx.partitionId(),
        ctx.attemptNumber(),
        max_key_groups=max_key_groups,
    )

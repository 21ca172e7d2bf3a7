"""Task side of a durable batch SDF stage's output: each task keeps the chunks it made.

A batch SDF stage with a store runs one task per subtask (``residual_state``). Each task stages
every output chunk it yields in ``stage-output/<stage>``, a task-owned, append-only namespace
(`state_layout.APPEND_ONLY_PREFIXES`), under a key in its own key groups (the chunk's round,
partition and sequence number, and an id), in the round's checkpoint: two-phase, only the
committed attempt's chunks count. The driver holds the segments' handles, never the chunks.

When the task's range is due a snapshot (`task_state.Due`, from the checkpoint the round is
as of), the task reads back what its range's tail added since its base and writes it, with
this round's chunks, into new files; the base's files stay part of the range's snapshot, so
each chunk is rewritten about once. When the commit asked for a fallback (`Due.REQUESTED`)
it rewrites the whole range instead: the next checkpoint then shares no file with the
retained one.

On resume, one task per subtask reads its key groups' chunks back (`read_outputs`), streamed
a file at a time: the consumers' input from the rounds committed before the kill. A
checkpoint of an older layout keeps them in the driver's files; each task then reads those,
filtered to its key groups.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Iterator

from sparkbeam.checkpoint import key_group_range, state_layout
from sparkbeam.checkpoint.ids import FileEntry
from sparkbeam.checkpoint.keygroups import KeyGroupRange, key_in_groups
from sparkbeam.checkpoint.layout import pipeline_dir
from sparkbeam.checkpoint.reader import iter_appended, replay
from sparkbeam.checkpoint.task_state import Due, NamespaceState
from sparkbeam.runner.task.range_staging import staged_writer_for_task
from sparkbeam.runner.task.records import CommitRecord, OutputRecord
from sparkbeam.runner.task.staged_state import StateRound, in_task_state, task_store


def stage_outputs(records: Iterable, spec: StateRound, stage: str) -> Iterator:
    """Pass ``records`` through, staging every output chunk in this task's key groups; end
    with the commit message (and the range's snapshot when one is due)."""
    from pyspark import TaskContext

    subtask = TaskContext.get().partitionId()  # one task per subtask (``as_subtasks``)
    m = spec.max_key_groups
    writer = staged_writer_for_task(spec.url, spec.pipeline, stage, spec.round_no, m)
    yield from keep_outputs(records, spec, stage, subtask, writer)


def keep_outputs(records: Iterable, spec: StateRound, stage: str, subtask: int, writer):
    """`stage_outputs` as ``subtask``, staging with ``writer``."""
    m = spec.max_key_groups
    groups = key_group_range(subtask, spec.parallelism, m)
    namespace = state_layout.stage_output(stage)
    chains = _chains(spec, namespace)
    due = chains.snapshot_due(groups) if chains is not None else None
    made: list[tuple[bytes, bytes]] = []  # this round's chunks, kept only for a snapshot
    ids = itertools.count()
    seq = 0
    for record in records:
        if isinstance(record, OutputRecord):
            prefix = state_layout.row_key(spec.round_no, subtask, seq, round_width=8)
            key = key_in_groups(prefix, (i.to_bytes(4, "big") for i in ids), groups, m)
            value = state_layout.encode_row(record.buffer, record.data)
            writer.put(namespace, key, value)
            if due is not None:
                made.append((key, value))
            seq += 1
        yield record
    if due is not None:
        _snapshot(writer, spec, namespace, chains, groups, due, made)
    elif seq:
        writer.count(namespace, groups.start, groups.stop, _counted(chains, groups) + seq)
    yield CommitRecord(stage, writer.finish())


def _snapshot(
    writer, spec: StateRound, namespace: str, chains: NamespaceState, groups: KeyGroupRange,
    due: Due, made: list,
) -> None:  # fmt: skip
    """The range's snapshot as of this round: what its tail added and ``made``, in new files
    beside its base's; the whole range when asked for a fallback. Read a file at a time."""
    whole = due is Due.REQUESTED
    storage = task_store(spec.url).storage
    committed = iter_appended(
        storage, pipeline_dir(spec.pipeline), namespace, chains, groups, bases=whole
    )
    keep: dict[str, FileEntry] = {}
    for _, r, _ in () if whole else chains.plan(groups):
        keep.update((f.name, f) for f in r.base)
    kept = sum(f.records for f in keep.values() if _inside(f.kg_start, f.kg_stop, groups))
    writer.snapshot(
        namespace, groups.start, groups.stop, itertools.chain(committed, made),
        spec.memory_bytes // 4, keep=tuple(keep.values()), kept_entries=kept,
    )  # fmt: skip


def _inside(start: int, stop: int, groups: KeyGroupRange) -> bool:
    return groups.start <= start < stop <= groups.stop


def _counted(chains: NamespaceState | None, groups: KeyGroupRange) -> int:
    """Chunks the ranges inside ``groups`` held, as their tasks last counted them."""
    ranges = chains.plan(groups) if chains is not None else ()
    return sum(r.entries for _, r, _ in ranges if _inside(r.start, r.stop, groups))


def _chains(spec: StateRound, namespace: str) -> NamespaceState | None:
    """``namespace``'s ranges as of the round's checkpoint (None: none, or an older layout's
    driver files hold it: nothing to snapshot)."""
    if spec.checkpoint_id is None:
        return None
    manifest = task_store(spec.url).load_manifest(spec.pipeline, spec.checkpoint_id)
    if not in_task_state(manifest, namespace):
        return None
    return manifest.task_state.namespaces.get(namespace)


def read_outputs(spec: StateRound, stage: str, subtask: int) -> Iterator[OutputRecord]:
    """The committed output chunks in ``subtask``'s key groups, as of the round's checkpoint."""
    store = task_store(spec.url)
    manifest = store.load_manifest(spec.pipeline, spec.checkpoint_id)
    groups = key_group_range(subtask, spec.parallelism, manifest.max_key_groups)
    namespace = state_layout.stage_output(stage)
    directory = pipeline_dir(spec.pipeline)
    if in_task_state(manifest, namespace):
        chains = manifest.task_state.namespaces.get(namespace)
        rows = iter_appended(store.storage, directory, namespace, chains, groups) if chains else ()
    else:  # an older layout: the driver's files, filtered to these key groups
        found: list[tuple[bytes, bytes]] = []

        def put(ns: str, key: bytes, value: bytes, kg: int) -> None:
            if ns == namespace:
                found.append((key, value))

        replay(store.storage, directory, manifest, put, lambda *_: None, groups)
        rows = found
    for _, value in rows:
        buffer, data = state_layout.decode_row(value, namespace)
        yield OutputRecord(buffer, data)


def reading_outputs(spec: StateRound, stage: str) -> Callable:
    """The task body ``(subtask, rows)`` of a resumed stage's restored output."""
    return functools.partial(_read, spec, stage)


def _read(spec: StateRound, stage: str, subtask: int, _rows) -> Iterator[OutputRecord]:
    return read_outputs(spec, stage, subtask)

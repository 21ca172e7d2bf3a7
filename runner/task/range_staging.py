"""Task side of keyed state, its writes: stage a round's changes, snapshot a range when due.

A task stages its changes to a key-group range in its attempt's changelog segment
(``staged_writer_for_task``); when the range's tail has grown past its threshold it has the
range's snapshot written in the background (``background_snapshots``), and when the commit
asked for one, or the tail is overdue, it writes it in the round (``stage_range``), streamed
from its read so a range larger than memory is written in parts. Reads are ``staged_state``'s.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from sparkbeam.checkpoint import key_group_range, open_staged_writer
from sparkbeam.checkpoint.task_state import Due, NamespaceState
from sparkbeam.runner.spark.filesystem_options import apply_in_task
from sparkbeam.runner.task import background_snapshots
from sparkbeam.runner.task.staged_state import StateRound, range_slot, task_store


def stage_range(
    writer, spec: StateRound, subtask: int, namespace: str, before: Mapping[bytes, bytes],
    changes: dict[bytes, bytes | None], keys: int,
) -> None:  # fmt: skip
    """After a task staged ``changes`` to ``before`` (its read of ``namespace``): report how
    many ``keys`` its key groups hold, and the range's snapshot when one is due: one written
    in the background (`background_snapshots`) by an earlier round, or a new one, in the
    background when the tail has grown, else in the round (in files of at most a quarter of
    the memory budget)."""
    groups = key_group_range(subtask, spec.parallelism, spec.max_key_groups)
    chains = _chains(spec, namespace)
    due = None
    if chains is not None:
        slot = range_slot(spec, namespace, groups)
        due = chains.snapshot_due(groups)
        if due is Due.GROWN and (
            background_snapshots.report(writer, slot, chains, groups)  # or still being written
            or background_snapshots.start(
                writer, slot, chains, groups, namespace, before, changes, spec.memory_bytes // 4
            )
        ):
            due = None
    if due is None:
        writer.count(namespace, groups.start, groups.stop, keys)
        return

    def after() -> Iterator[tuple[bytes, bytes]]:  # streamed: ``before`` may be on disk
        for key, value in before.items():
            if key not in changes:
                yield key, value
        for key, change in changes.items():
            if change is not None:
                yield key, change

    writer.snapshot(namespace, groups.start, groups.stop, after(), spec.memory_bytes // 4)


def _chains(spec: StateRound, namespace: str) -> NamespaceState | None:
    """``namespace``'s ranges in the checkpoint the round's state is as of (None: none yet)."""
    if spec.checkpoint_id is None:
        return None
    manifest = task_store(spec.url).load_manifest(spec.pipeline, spec.checkpoint_id)
    return manifest.task_state.namespaces.get(namespace) if manifest.task_state else None


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

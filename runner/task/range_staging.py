"""Task side of keyed state, its writes: stage a round's changes, snapshot a range when due.

A task stages its changes to a key-group range in its attempt's changelog segment
(``staged_writer_for_task``); when the range's tail has grown past its threshold, or the commit
asked for one, it also writes the range's snapshot (``stage_range``), streamed from its read so
a range larger than memory is written in parts. Reads are ``staged_state``'s.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from sparkbeam.checkpoint import key_group_range, open_staged_writer
from sparkbeam.runner.spark.filesystem_options import apply_in_task
from sparkbeam.runner.task.staged_state import StateRound, task_store


def stage_range(
    writer, spec: StateRound, subtask: int, namespace: str, before: Mapping[bytes, bytes],
    changes: dict[bytes, bytes | None], keys: int,
) -> None:  # fmt: skip
    """After a task staged ``changes`` to ``before`` (its read of ``namespace``): report how
    many ``keys`` its key groups hold, or write their snapshot when one is due (in files of
    at most a quarter of the memory budget)."""
    groups = key_group_range(subtask, spec.parallelism, spec.max_key_groups)
    args = (spec.url, spec.pipeline, spec.checkpoint_id, subtask, spec.parallelism, namespace)
    if not snapshot_due(*args):
        writer.count(namespace, groups.start, groups.stop, keys)
        return

    def after() -> Iterator[tuple[bytes, bytes]]:  # streamed: ``before`` may be on disk
        for key, value in before.items():
            if key not in changes:
                yield key, value
        for key, value in changes.items():
            if value is not None:
                yield key, value

    writer.snapshot(namespace, groups.start, groups.stop, after(), spec.memory_bytes // 4)


def snapshot_due(
    url: str, pipeline: str, checkpoint_id: int | None, subtask: int, parallelism: int,
    namespace: str,
) -> bool:  # fmt: skip
    """Whether the task owning ``subtask``'s key groups should snapshot ``namespace`` after
    this round (its ranges' tails have grown, or the commit asked for a fallback)."""
    if checkpoint_id is None:
        return False
    manifest = task_store(url).load_manifest(pipeline, checkpoint_id)
    chains = manifest.task_state.namespaces.get(namespace) if manifest.task_state else None
    if chains is None:
        return False
    return chains.snapshot_due(key_group_range(subtask, parallelism, manifest.max_key_groups))


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

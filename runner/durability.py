"""Batch durability with --checkpoint_dir: commit each SDF round, resume after a kill.

What survives a driver kill (seed 000's "completed work is not redeployed"):
- a stage's consumed input, as the completed-work marker ``<stage>:input``;
- its pending residuals and timers (``sdf-residual/<stage>`` state, written by
  the checkpoint handler);
- the output chunks of its committed rounds, staged by the tasks that made
  them (``stage-output/<stage>``) and named by the round's checkpoint — the
  two-phase commit of DESIGN.md: tasks stage, the driver commits exactly the
  successful attempts, a killed round leaves only unnamed garbage.
On restart a stage whose input is consumed skips round 0, its producers are
not run at all, and it continues from its pending residuals.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

OUTPUT_PREFIX = "stage-output/"
FINISHED = "finished"


def input_marker(stage_id: str) -> str:
    return f"{stage_id}:input"


def output_namespace(stage_id: str) -> str:
    return OUTPUT_PREFIX + stage_id


def stage_outputs_durably(
    records: Iterable, url: str, pipeline: str, stage_id: str, round_no: int, max_key_groups: int
) -> Iterator:
    """Task side: pass records through, staging every output chunk; end with the commit message."""
    from pyspark import TaskContext
    from sparkbeam.checkpoint import open_staged_writer
    from sparkbeam.runner.filesystem_options import apply_in_task
    from sparkbeam.runner.records import CommitRecord, OutputRecord

    apply_in_task()

    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("stage_outputs_durably runs inside a Spark task only")
    partition, attempt = ctx.partitionId(), ctx.attemptNumber()
    writer = open_staged_writer(
        url, pipeline, stage_id, round_no, partition, attempt, max_key_groups=max_key_groups
    )
    namespace = output_namespace(stage_id)
    seq = 0
    for record in records:
        if isinstance(record, OutputRecord):
            key = f"{round_no:08d}/{partition:06d}/{seq:09d}".encode()
            writer.put(namespace, key, record.buffer.encode() + b"\x00" + record.data)
            seq += 1
        yield record
    yield CommitRecord(stage_id, writer.finish())


def restored_outputs(state, stage_id: str) -> list[tuple[str, bytes]]:
    """(buffer, chunk) of every committed output chunk of a stage, in commit order."""
    rows = []
    for _, key, value in state.items(output_namespace(stage_id)):
        buffer, _, data = value.partition(b"\x00")
        rows.append((key, buffer.decode(), data))
    rows.sort()
    return [(buffer, data) for _, buffer, data in rows]

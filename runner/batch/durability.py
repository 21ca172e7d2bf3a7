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

A job whose last checkpoint is finished is not run again by accident: rerunning
it would publish its output a second time, so `refuse_finished_rerun` fails the
start unless the operator passed ``--fresh`` (batch and streaming alike).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

from sparkbeam.runner.rounds.ledger import FINISHED

OUTPUT_PREFIX = "stage-output/"
_LOG = logging.getLogger(__name__)


class FinishedJobError(RuntimeError):
    """The job's last checkpoint is finished: running it again would repeat its output."""

    def __init__(self, pipeline_id: str, checkpoint_id: int, url: str) -> None:
        self.pipeline_id, self.checkpoint_id, self.url = pipeline_id, checkpoint_id, url
        super().__init__(
            f"Pipeline {pipeline_id!r} already finished: checkpoint {checkpoint_id} in store "
            f"{url!r} is its finished last checkpoint, and running it again would write its "
            "output a second time. To run the job again from the beginning pass --fresh (with "
            "a new --output); to start with no history, use a new --checkpoint_dir."
        )


def refuse_finished_rerun(store, pipeline_ids: Iterable[str], fresh: bool) -> None:
    """Before a job starts: raise `FinishedJobError` if a pipeline's latest checkpoint is
    finished, unless ``fresh`` (then that pipeline runs again from the beginning)."""
    for pid in pipeline_ids:
        readable = [i for i in store.list_checkpoints(pid) if i.error is None]
        if not readable:
            continue
        cid = readable[-1].checkpoint_id
        if not store.load_manifest(pid, cid).metadata.get(FINISHED):
            continue  # an unfinished run resumes, with or without --fresh
        if not fresh:
            raise FinishedJobError(pid, cid, store.url)
        _LOG.warning(
            "Pipeline %s finished in checkpoint %d of %s; --fresh: running it again from the "
            "beginning",
            pid, cid, store.url,
        )  # fmt: skip


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
    from sparkbeam.runner.spark.filesystem_options import apply_in_task
    from sparkbeam.runner.task.records import CommitRecord, OutputRecord

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

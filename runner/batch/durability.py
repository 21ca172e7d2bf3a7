"""Batch durability with --checkpoint_dir: commit each SDF round, resume after a kill.

What survives a driver kill (seed 000's "completed work is not redeployed"):
- a stage's consumed input, as the completed-work marker ``<stage>:input``;
- its pending residuals and timers (``sdf-residual/<stage>`` state, written by
  the checkpoint handler);
- the output chunks of its committed rounds, kept by the tasks that made
  them in their key groups (``stage-output/<stage>``,
  ``runner.task.kept_rows``) and named by the round's checkpoint — the
  two-phase commit of DESIGN.md: tasks stage, the driver commits exactly the
  successful attempts' handles, a killed round leaves only unnamed garbage.
On restart a stage whose input is consumed skips round 0, its producers are
not run at all, its tasks read its committed chunks back, and it continues
from its pending residuals.

A job whose last checkpoint is finished is not run again by accident
(``sparkbeam.runner.rounds.compatibility.refuse_before_start``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from sparkbeam.checkpoint import state_layout
from sparkbeam.runner.task.kept_rows import RowKeeper, reading_rows
from sparkbeam.runner.task.range_staging import staged_writer_for_task
from sparkbeam.runner.task.records import CommitRecord, OutputRecord
from sparkbeam.runner.task.staged_state import StateRound

FINISHED = state_layout.FINISHED
input_marker = state_layout.input_marker


def stage_outputs(records: Iterable, spec: StateRound, stage: str) -> Iterator:
    """Task side: pass ``records`` through, keeping every output chunk in this task's key
    groups (``task.kept_rows``); end with the commit message."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise RuntimeError("stage_outputs runs inside a Spark task only")
    subtask = context.partitionId()  # one task per subtask (``as_subtasks``)
    writer = staged_writer_for_task(
        spec.url, spec.pipeline, stage, spec.round_no, spec.max_key_groups
    )
    yield from keep_outputs(records, spec, stage, subtask, writer)


def keep_outputs(records: Iterable, spec: StateRound, stage: str, subtask: int, writer):
    """`stage_outputs` as ``subtask``, staging with ``writer``."""
    keeper = RowKeeper(spec, state_layout.stage_output(stage), subtask, writer)
    for record in records:
        if isinstance(record, OutputRecord):
            keeper.add(record.buffer, record.data)
        yield record
    keeper.finish()
    yield CommitRecord(stage, writer.finish())


def reading_outputs(spec: StateRound, stage: str) -> Callable:
    """The task body ``(subtask, rows)`` of a resumed stage's committed output chunks."""
    return reading_rows(spec, state_layout.stage_output(stage), OutputRecord)

"""Task side of SDF residuals: each task keeps the residuals of its key groups.

An SDF process stage with a store runs as ``parallelism`` tasks a round, task ``p`` being
subtask ``p`` (``runner.plane`` ``as_subtasks``). A task reads its key groups' residuals as of
the round's checkpoint (a `task_range.TaskRange`), feeds the stage those due by the round's
clock after its input, and keeps each new residual under a key in its own key groups (so it
follows its key group when a restore changes the parallelism). It stages the changes and
reports count, earliest timer and watermark hold (`ResidualReport`): all the driver learns.

Leaves to others: the handler's timers and codec (``sdf.checkpoint_handler``), the range's
reads and snapshots (``task_range``), scheduling rounds (``rounds.feed``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from sparkbeam.checkpoint import state_layout
from sparkbeam.runner.task.records import CommitRecord, OutputRecord, ResidualReport
from sparkbeam.runner.task.staged_state import StateRound
from sparkbeam.runner.task.task_range import RowKeeper, TaskRange, finish, staged_writer_for_task
from sparkbeam.sdf import ResidualRecord, StateAndTimerBundleCheckpointHandler
from sparkbeam.sdf.checkpoint_handler import MAX_RESIDUALS_PER_ROUND


@dataclass(frozen=True, kw_only=True)
class ResidualRound(StateRound):
    """What the driver ships to every task of one SDF stage in one round."""

    clock_ms: float  # residuals due by then are fed (+inf: a drain feeds them all)
    limit: int  # at most this many fed per task


def residual_limit(parallelism: int) -> int:
    """Residuals one task feeds a round: the stage's share of ``MAX_RESIDUALS_PER_ROUND``."""
    return max(1, MAX_RESIDUALS_PER_ROUND // parallelism)


def commit_stage(stage: str) -> str:
    """The staged writer's stage name of what an SDF stage's task keeps: its residuals, and
    in batch its output chunks (one writer, one commit message a task and round)."""
    return f"residuals:{stage}"


class TaskResiduals:
    """One SDF task's residuals in one round, with ``keep_outputs`` (a durable batch stage) its
    output chunks: read, fed when due, kept, staged, reported (by ``rounds.task_body``)."""

    def __init__(self, spec: ResidualRound, stage: str, subtask: int, keep_outputs: bool) -> None:
        self.stage, self.subtask = stage, subtask
        self.state = TaskRange(spec, subtask, state_layout.sdf_residual(stage))
        self.handler = StateAndTimerBundleCheckpointHandler(self.state, stage)
        self.handler.restore()
        self.due = self.handler.pop_due(spec.clock_ms, spec.limit)
        self.writer = staged_writer_for_task(spec, commit_stage(stage))
        self.outputs = None
        if keep_outputs:  # in the task's key groups (``task_range``), read back on a resume
            ns = state_layout.stage_output(stage)
            self.outputs = RowKeeper(spec, ns, subtask, self.writer)

    def due_rows(self) -> Iterator[tuple[str, bytes]]:
        """The residuals due this round, as input rows (after the task's input)."""
        return ((d.transform, d.element) for d in self.due)

    def keeps(self, record) -> bool:
        """Keep a residual of the stage (True: not passed on); note an output chunk."""
        if isinstance(record, ResidualRecord) and record.stage == self.stage:
            self.handler.add((record,))
            return True
        if self.outputs is not None and isinstance(record, OutputRecord):
            self.outputs.add(record.buffer, record.data)
        return False

    def finish(self) -> Iterator:
        """Stage the round's changes; the task's commit message and its range's report."""
        if self.outputs is not None:
            self.outputs.finish()
        handler = self.handler
        self.state.stage(self.writer, handler.pending())
        yield CommitRecord(commit_stage(self.stage), finish(self.writer, self.state))
        yield ResidualReport(
            self.stage, self.subtask, handler.pending(), handler.next_fire_ms(),
            handler.watermark_hold_micros(), len(self.due),
        )  # fmt: skip

"""Batch durability with --checkpoint_dir: commit each SDF round, resume after a kill.

What survives a driver kill (seed 000's "completed work is not redeployed"):
- a stage's consumed input, as the completed-work marker ``<stage>:input``;
- its pending residuals and timers (``sdf-residual/<stage>`` state, written by
  the checkpoint handler);
- the output chunks of its committed rounds, kept by the tasks that made
  them in their key groups (``stage-output/<stage>``,
  ``runner.task.task_range``), staged with its residuals in one writer, and named by
  the round's checkpoint — the
  two-phase commit of DESIGN.md: tasks stage, the driver commits exactly the
  successful attempts' handles, a killed round leaves only unnamed garbage.
On restart a stage whose input is consumed skips round 0, its producers are
not run at all, its tasks read its committed chunks back, and it continues
from its pending residuals.

A job whose last checkpoint is finished is not run again by accident
(``sparkbeam.runner.rounds.compatibility.refuse_before_start``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

from sparkbeam.checkpoint import state_layout
from sparkbeam.runner.task.records import OutputRecord
from sparkbeam.runner.task.residual_state import KeepAlso
from sparkbeam.runner.task.staged_state import StateRound
from sparkbeam.runner.task.task_range import RowKeeper, reading_rows

FINISHED = state_layout.FINISHED
input_marker = state_layout.input_marker


def keeping_outputs(spec: StateRound, stage: str) -> KeepAlso:
    """What a durable SDF task keeps besides its residuals (``residual_state.keep_residuals``):
    every output chunk, in its key groups (``task.task_range``), staged with its residuals'
    writer, so the task sends one commit message a round."""
    return functools.partial(_keep_outputs, spec, stage)


def _keep_outputs(spec: StateRound, stage: str, records: Iterable, subtask: int, writer):
    keeper = RowKeeper(spec, state_layout.stage_output(stage), subtask, writer)
    for record in records:
        if isinstance(record, OutputRecord):
            keeper.add(record.buffer, record.data)
        yield record
    keeper.finish()


def reading_outputs(spec: StateRound, stage: str) -> Callable:
    """The task body ``(subtask, rows)`` of a resumed stage's committed output chunks."""
    return reading_rows(spec, state_layout.stage_output(stage), OutputRecord)

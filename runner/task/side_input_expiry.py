"""Task side of dropping a streaming side input's expired windows when nothing new comes for it.

A keeping task drops expired rows as it keeps new ones (``task.side_input_files``,
``task.side_input_view``), but a side input whose writers stopped has no keeping task, so what
it held would stay for good. Keeping tasks report the latest end they keep (`SideInputHeld`);
once the horizon passed it, or after a restore (the ends are not checkpointed), a round runs
one task per subtask with no new data (`dropping_expired`).

Owns: that task body, and a triggered side input's keeping task with its report
(`keeping_view_reporting`). Leaves when such a round runs to ``streaming.side_input_store``.
"""

from __future__ import annotations

from collections.abc import Iterator

from sparkbeam.checkpoint import key_group_range
from sparkbeam.runner.task.side_input_files import (
    Keeping,
    SideInputHeld,
    held_latest,
    keeping_side_input,
)
from sparkbeam.runner.task.side_input_view import keeping_view
from sparkbeam.runner.task.staged_state import StateRound


def keeping_view_reporting(
    spec: StateRound, keeping: Keeping, subtask: int, rows, report: bool = True
) -> Iterator:
    """Task body of a triggered side input's keeping task (`keeping_view`); then, with
    ``report``, a `SideInputHeld` of the new windows that had not expired."""
    return keeping_view(
        spec, keeping.buffer, keeping.plan_key, keeping.components, keeping.coder, subtask,
        rows, horizon=keeping.files.horizon, report=report,
    )  # fmt: skip


def dropping_expired(spec: StateRound, keeping: Keeping, subtask: int, _rows) -> Iterator:
    """Task body of a round that brings a side input nothing new: drop what expired from this
    subtask's range, then report a complete `SideInputHeld` of what it keeps."""
    if keeping.files.view:
        yield from keeping_view_reporting(spec, keeping, subtask, [], report=False)
    else:
        yield from keeping_side_input(spec, keeping, subtask, ())  # its CommitRecord only
    groups = key_group_range(subtask, spec.parallelism, spec.max_key_groups)
    yield SideInputHeld(keeping.buffer, held_latest(keeping.files, groups), complete=True)

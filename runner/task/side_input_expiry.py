"""Task side of dropping a streaming side input's expired windows when nothing new comes for it.

A keeping task drops a side input's expired rows from the store as it keeps new ones
(``task.side_input_files``, ``task.side_input_view``); a side input whose writers stopped (a
``PeriodicImpulse`` that ended, a source no stage of the round runs) has no keeping task, so
what it held would stay in the store and in readers' workers for good. The driver learns from
every keeping task the latest end of what it keeps (`SideInputHeld`), and once the horizon
passed it, or after a restore (the ends are not in the checkpoint), a round runs one task per
subtask with no new data (`dropping_expired`): it deletes the expired rows, or view windows, of
its key groups, and reports the latest end of what is left, of its whole range.

Owns: that task body, and the task body of a triggered side input's keeping task with its
report (`keeping_view_reporting`: ``task.side_input_view`` `keeping_view`, which makes the
report). Leaves when such a round runs to ``streaming.side_input_store``.
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


def keeping_view_reporting(spec: StateRound, keeping: Keeping, subtask: int, rows) -> Iterator:
    """Task body of a triggered side input's keeping task (`keeping_view`); then a
    `SideInputHeld` of the new windows that had not expired."""
    return _view(spec, keeping, subtask, rows, report=True)


def dropping_expired(spec: StateRound, keeping: Keeping, subtask: int, _rows) -> Iterator:
    """Task body of a round that brings a side input nothing new: its keeping task with no
    data (it drops what expired by the horizon from this subtask's range), then a complete
    `SideInputHeld` of what the range keeps."""
    if keeping.files.view:
        yield from _view(spec, keeping, subtask, [])
    else:
        records = keeping_side_input(spec, keeping, subtask, ())
        yield from records  # its CommitRecord only (no report asked)
    groups = key_group_range(subtask, spec.parallelism, spec.max_key_groups)
    yield SideInputHeld(keeping.buffer, held_latest(keeping.files, groups), complete=True)


def _view(spec: StateRound, keeping: Keeping, subtask: int, rows, report=False) -> Iterator:
    return keeping_view(
        spec, keeping.buffer, keeping.plan_key, keeping.components, keeping.coder, subtask,
        rows, horizon=keeping.files.horizon, report=report,
    )  # fmt: skip

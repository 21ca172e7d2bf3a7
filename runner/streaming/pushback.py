"""Streaming side inputs: hold a stage's main input back until its side inputs are ready.

A streaming side input fills over rounds, so a consumer run at once would see it empty
(``WriteToText`` finalizes its files through side inputs filled only when its GroupByKey
fires). As in Beam's runners a side input is *ready* once data arrived for it or its watermark
is +inf. Until then the stage's tasks keep its main input in their key groups (task-owned,
append-only namespace ``pushback/<stage>``: ``task.task_range``) and the stage holds its output
watermark at -inf. The round that finds them ready reads the rows back, one task per subtask,
and drops the namespace: the driver holds the rows' handles, never the rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from sparkbeam.checkpoint import state_layout
from sparkbeam.runner.streaming import watermarks
from sparkbeam.runner.task.records import CommitRecord, is_report
from sparkbeam.runner.task.staged_state import StateRound
from sparkbeam.runner.task.task_range import RowKeeper, reading_rows, staged_writer_for_task

namespace = state_layout.pushback


def ready(stage, side_values: dict, marks: watermarks.RoundWatermarks) -> bool:
    """Every side input of ``stage`` has data, or a watermark at +infinity."""
    return all(
        side_values.get(si.buffer) or marks.buffer_output.get(si.buffer) == watermarks.MAX
        for si in stage.side_inputs
    )


def pending(state, stages) -> set[str]:
    """The ``stages`` with rows pushed back in the checkpoint (by their handles: no row read)."""
    owned = state.task_owned()
    return {s.id for s in stages if s.side_inputs and namespace(s.id) in owned}


def take(plane, state, spec: StateRound, stage_id: str):
    """The dataset of the rows pushed back for ``stage_id`` as of ``spec``'s checkpoint
    (one task per subtask reads its key groups'), dropped from the next checkpoint."""
    ns = namespace(stage_id)
    state.drop_task_owned(ns)
    subtasks = plane.as_subtasks(None, spec.parallelism)
    return subtasks.mapPartitionsWithIndex(reading_rows(spec, ns, _row))


def _row(transform: str, data: bytes) -> tuple[str, bytes]:
    return transform, data


def hold_rows(
    spec: StateRound, stage_id: str, subtask: int, rows: Iterable, writer=None
) -> Iterator:
    """Task side: keep the data rows in this subtask's key groups for the round's checkpoint
    (staged by ``writer``, by default this Spark task's); carried reports pass on."""
    commit_stage = f"hold:{stage_id}"
    if writer is None:
        writer = staged_writer_for_task(spec, commit_stage)
    keeper = RowKeeper(spec, namespace(stage_id), subtask, writer)
    for row in rows:
        if not is_report(row):  # a data row: (transform, bytes)
            keeper.add(*row)
        else:
            yield row
    keeper.finish()
    yield CommitRecord(commit_stage, writer.finish())

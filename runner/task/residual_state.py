"""Task side of SDF residuals: each task keeps the residuals of its key groups.

An SDF process stage with a store runs as exactly ``parallelism`` tasks a round, task ``p``
being subtask ``p`` (``runner.plane`` ``as_subtasks``). Before its input, a task reads the
residuals of its key groups as of the round's checkpoint (a `task_range.TaskRange`: kept
between rounds by the worker, only the segments committed since are applied), and feeds
the stage those due by the round's clock (at most ``limit``, earliest first) after its input.
Each residual the stage returns is kept under a key in the task's own key groups (so it stays
with this subtask, and follows its key group when a restore changes the parallelism). After
the bundle, the task stages what changed (the residuals fed are deleted, the new ones put) in
the round's checkpoint and reports the count, the earliest timer and the watermark hold of
its range (`ResidualReport`): all the driver learns of them.

Leaves to others: the handler's timers and codec (``sdf.checkpoint_handler``), the reads,
staging and snapshots of a key-group range (``task_range``), scheduling rounds (``rounds.feed``).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from sparkbeam.checkpoint import state_layout
from sparkbeam.runner.task.records import CommitRecord, ResidualReport
from sparkbeam.runner.task.staged_state import StateRound
from sparkbeam.runner.task.task_range import TaskRange, finish, staged_writer_for_task
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


KeepAlso = Callable[[Iterator, int, object], Iterator]
"""``(records, subtask, writer)``: the records passed on, keeping more of the task's output
in the same staged writer (a durable batch SDF stage's output chunks: ``batch.stage_rdd``)."""


def keeping_residuals(
    spec: ResidualRound, stage: str, run: Callable, also: KeepAlso | None = None
) -> Callable:
    """The task body ``(subtask, rows)`` of an SDF stage whose tasks keep its residuals."""
    return functools.partial(_keeping, spec, stage, run, also)


def _keeping(spec, stage: str, run: Callable, also, subtask: int, rows) -> Iterator:
    return keep_residuals(spec, stage, subtask, rows, run, also)


def commit_stage(stage: str) -> str:
    """The staged writer's stage name of what an SDF stage's task keeps: its residuals, and
    in batch its output chunks (one writer, one commit message a task and round)."""
    return f"residuals:{stage}"


def keep_residuals(
    spec: ResidualRound, stage: str, subtask: int, rows: Iterable, run: Callable,
    also: KeepAlso | None = None,
) -> Iterator:  # fmt: skip
    """Run the stage (``run(rows)``) over ``rows`` then the due residuals of ``subtask``'s key
    groups; keep the residuals it returns (and what ``also`` keeps of its other output);
    stage the changes; report the range."""
    state = TaskRange(spec, subtask, state_layout.sdf_residual(stage))
    handler = StateAndTimerBundleCheckpointHandler(state, stage)
    handler.restore()
    due = handler.pop_due(spec.clock_ms, spec.limit)
    fed = itertools.chain(rows, ((d.transform, d.element) for d in due))
    writer = staged_writer_for_task(
        spec.url, spec.pipeline, commit_stage(stage), spec.round_no, spec.max_key_groups
    )
    records = _taking_residuals(run(fed), handler, stage)
    yield from records if also is None else also(records, subtask, writer)
    state.stage(writer, handler.pending())
    staged = finish(writer, state)
    yield CommitRecord(commit_stage(stage), staged)
    yield ResidualReport(
        stage, subtask, handler.pending(), handler.next_fire_ms(),
        handler.watermark_hold_micros(), len(due),
    )  # fmt: skip


def _taking_residuals(records: Iterable, handler, stage: str) -> Iterator:
    """``records`` without the stage's residuals, which ``handler`` keeps."""
    for record in records:
        if isinstance(record, ResidualRecord) and record.stage == stage:
            handler.add((record,))
        else:
            yield record

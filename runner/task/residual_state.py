"""Task side of SDF residuals: each task keeps the residuals of its key groups.

An SDF process stage with a store runs as exactly ``parallelism`` tasks a round, task ``p``
being subtask ``p`` (``runner.plane`` ``as_subtasks``). Before its input, a task reads the
residuals of its key groups as of the round's checkpoint (``staged_state.read_task_state``:
kept between rounds by the worker, only the segments committed since are applied), and feeds
the stage those due by the round's clock (at most ``limit``, earliest first) after its input.
Each residual the stage returns is kept under a key in the task's own key groups (so it stays
with this subtask, and follows its key group when a restore changes the parallelism). After
the bundle, the task stages what changed (the residuals fed are deleted, the new ones put) in
the round's checkpoint and reports the count, the earliest timer and the watermark hold of
its range (`ResidualReport`): all the driver learns of them.

Leaves to others: the handler's timers and codec (``sdf.checkpoint_handler``), the reads and
snapshots of a key-group range (``staged_state``), scheduling rounds (``rounds.feed``).
"""

from __future__ import annotations

import functools
import itertools
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from sparkbeam.checkpoint import key_group_range, state_layout
from sparkbeam.checkpoint.keygroups import KeyGroupRange, key_in_groups
from sparkbeam.runner.task.range_staging import stage_range, staged_writer_for_task
from sparkbeam.runner.task.records import CommitRecord, ResidualReport
from sparkbeam.runner.task.staged_state import StateRound, keep_staged, read_task_state, release
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


def keeping_residuals(spec: ResidualRound, stage: str, run: Callable) -> Callable:
    """The task body ``(subtask, rows)`` of an SDF stage whose tasks keep its residuals."""
    return functools.partial(_keeping, spec, stage, run)


def _keeping(spec: ResidualRound, stage: str, run: Callable, subtask: int, rows) -> Iterator:
    return keep_residuals(spec, stage, subtask, rows, run)


def commit_stage(stage: str) -> str:
    """The staged writer's stage name of ``stage``'s residuals (apart from its outputs)."""
    return f"residuals:{stage}"


class RangeResiduals:
    """The residuals of one task's key groups: its read of the store, and its changes."""

    def __init__(self, stored: Mapping[bytes, bytes], groups: KeyGroupRange, max_key_groups: int):
        self.stored = stored  # read-only: the worker keeps it for the next round's read
        self.groups, self.max_key_groups = groups, max_key_groups
        self.changes: dict[bytes, bytes | None] = {}
        self._ids = itertools.count()
        self._prefix = uuid.uuid4().bytes[:12]

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        changes = self.changes
        for key, value in self.stored.items():
            if key not in changes:
                yield key, value
        for key, value in changes.items():
            if value is not None:
                yield key, value

    def get(self, key: bytes) -> bytes | None:
        if key in self.changes:
            return self.changes[key]
        return self.stored.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self.changes[key] = value

    def delete(self, key: bytes) -> None:
        if key in self.stored:
            self.changes[key] = None
        else:
            self.changes.pop(key, None)  # put and deleted in this round: nothing to stage

    def new_key(self, element: bytes) -> bytes:
        """``element`` + 0x00 + an id whose key (``keygroups.key_group``) is in this task's
        key groups."""
        ids = (self._prefix + i.to_bytes(4, "big") for i in self._ids)
        return key_in_groups(element + b"\x00", ids, self.groups, self.max_key_groups)


def keep_residuals(
    spec: ResidualRound, stage: str, subtask: int, rows: Iterable, run: Callable
) -> Iterator:
    """Run the stage (``run(rows)``) over ``rows`` then the due residuals of ``subtask``'s key
    groups; keep the residuals it returns; stage the changes; report the range."""
    namespace = state_layout.sdf_residual(stage)
    groups = key_group_range(subtask, spec.parallelism, spec.max_key_groups)
    stored: Mapping[bytes, bytes] = {}
    if spec.checkpoint_id is not None:
        stored = read_task_state(spec, subtask, namespace)
    state = RangeResiduals(stored, groups, spec.max_key_groups)
    handler = StateAndTimerBundleCheckpointHandler(state, stage)
    handler.restore()
    due = handler.pop_due(spec.clock_ms, spec.limit)
    fed = itertools.chain(rows, ((d.transform, d.element) for d in due))
    for record in run(fed):
        if isinstance(record, ResidualRecord) and record.stage == stage:
            handler.add((record,))
        else:
            yield record
    writer = staged_writer_for_task(
        spec.url, spec.pipeline, commit_stage(stage), spec.round_no, spec.max_key_groups
    )
    writer.write_all(namespace, state.changes)
    stage_range(writer, spec, subtask, namespace, stored, state.changes, handler.pending())
    staged = writer.finish()
    if spec.checkpoint_id is not None:  # what it staged is the next round's read
        keep_staged(spec, subtask, namespace, stored, state.changes, staged.files)
    release(stored)
    yield CommitRecord(commit_stage(stage), staged)
    yield ResidualReport(
        stage, subtask, handler.pending(), handler.next_fire_ms(),
        handler.watermark_hold_micros(), len(due),
    )  # fmt: skip

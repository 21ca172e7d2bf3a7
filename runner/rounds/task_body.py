"""What one Spark task of a stage run does with its rows, in order: batch and streaming alike.

1. Reports that upstream stages carried to it are set aside (``carry``); they leave last.
2. With a store, an SDF task feeds the due residuals of its key groups after its input
   (``task.residual_state``).
3. The pipeline's startpoints rewrite the restrictions they apply to (``startpoints``).
4. Beam's bundle processor runs the stage (``task.bundle_executor``) while the sink files its
   user code stages are collected (``sink_files``).
5. Per record: a residual is kept by the task; an output chunk passes on (a durable batch SDF
   task keeps it too); metrics count towards the progress line.
6. Then the staged sink files, the startpoint outcomes, the residuals' commit message and
   report, and the carried reports.

Leaves to others: which rows a task reads and what the driver does with its reports (the
round's builders: ``batch.stage_rdd``, ``streaming.round``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from sparkbeam.runner.rounds.carry import split_carried
from sparkbeam.runner.rounds.sink_files import collect_sink_files
from sparkbeam.runner.task.bundle_executor import StageTask, run_stage_partition
from sparkbeam.runner.task.residual_state import ResidualRound, TaskResiduals
from sparkbeam.sdf.startpoints.session import StartpointApplier, StartpointAssignment


@dataclass(frozen=True)
class TaskBody:
    """The task body of one run of a stage (picklable: what crosses to the executors)."""

    task: StageTask
    components: Any  # broadcast of the plan's components
    side_bc: Any  # broadcast of the stage's side-input values
    round_no: int
    assignment: StartpointAssignment | None = None
    residuals: ResidualRound | None = None  # with a store: the SDF task keeps its residuals
    keep_outputs: bool = False  # ... and its output chunks (a durable batch SDF stage)
    elements: Any = None  # the run's ``progress.ElementCounter`` (None: not counted)

    def __call__(self, rows: Iterable, subtask: int = 0, keyed_state=None) -> Iterator:
        stage = self.task.stage
        carried: list = []
        rows = split_carried(rows, carried)
        kept = None
        if self.residuals is not None:
            kept = TaskResiduals(self.residuals, stage.id, subtask, self.keep_outputs)
            rows = itertools.chain(rows, kept.due_rows())
        applier = None
        if self.assignment:
            applier = StartpointApplier(stage, self.components.value, self.assignment)
            rows = applier.apply_rows(rows)
        records = run_stage_partition(
            self.task, self.components.value, self.side_bc.value, rows, keyed_state
        )
        for record in collect_sink_files(records, stage.id, self.round_no):
            if kept is not None and kept.keeps(record):
                continue
            if self.elements is not None:
                self.elements.count(record)
            yield record
        if applier is not None:
            yield from applier.outcomes
        if kept is not None:
            yield from kept.finish()
        yield from carried

    def by_subtask(self, subtask: int, rows: Iterable) -> Iterator:
        """The body of ``mapPartitionsWithIndex`` over a stage's subtasks (``as_subtasks``)."""
        return self(rows, subtask)

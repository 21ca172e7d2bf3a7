"""The RDD of one batch stage run: its input through the bundle executor in Spark tasks.

Every run (an ordinary stage once, an SDF stage once per round) is a lazy ``mapPartitions``
over ``rounds.task_body``, persisted when its output is read more than once. Leaves to others
which input a run reads (``executor``, ``stage_rounds``) and what becomes of its reports (the
round loop, or the executor's final job).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sparkbeam.checkpoint import state_layout
from sparkbeam.runner.errors import run_guarded
from sparkbeam.runner.progress import ElementCounter
from sparkbeam.runner.rounds.context import RunContext
from sparkbeam.runner.rounds.task_body import TaskBody
from sparkbeam.runner.spark.labels import job_group, stage_label
from sparkbeam.runner.task.bundle_executor import StageTask
from sparkbeam.runner.task.bundle_splits import SplitPolicy
from sparkbeam.runner.task.records import OutputRecord
from sparkbeam.runner.task.residual_state import ResidualRound, residual_limit
from sparkbeam.runner.task.staged_state import StateRound
from sparkbeam.runner.task.task_range import reading_rows
from sparkbeam.sdf.startpoints.session import StartpointSession
from sparkbeam.translation.plan import StagePlan


class StageRdds:
    """Builds (and later unpersists) the RDD of each run of a batch stage."""

    def __init__(
        self, ctx: RunContext, residual_budget_s: float, split_policy: SplitPolicy,
        elements: ElementCounter | None = None,
    ) -> None:  # fmt: skip
        self.ctx, self.elements = ctx, elements
        # Without a store, residuals due soon are re-fed by the task itself.
        self.residual_budget_s = 0.0 if ctx.durable else residual_budget_s
        self.split_policy = split_policy
        self.labels = {s.id: stage_label(s) for s in ctx.plan.stages}
        self.group = job_group(ctx.plan)  # the Spark job group of every job of this run
        self.startpoints: dict[str, StartpointSession] = {}  # pipeline -> its session
        self.persisted: list = []

    def build(
        self, stage: StagePlan, input_rdd, side_bc, round_no: int, cache: bool = True,
        clock_ms: float | None = None,
    ):  # fmt: skip
        """The lazy RDD of one run over ``input_rdd``, persisted if ``cache``; a durable SDF
        stage runs a task per subtask, which keeps its residuals (``task.residual_state``)."""
        if self.ctx.durable and stage.is_sdf_process:
            spec = self.residual_round(stage, round_no, clock_ms)
            body = self.task_body(stage, side_bc, round_no, spec)
            subtasks = self.ctx.plane.as_subtasks(input_rdd, self.ctx.parallelism)
            rdd = subtasks.mapPartitionsWithIndex(body.by_subtask)
        else:
            rdd = input_rdd.mapPartitions(self.task_body(stage, side_bc, round_no))
        return self._persist(rdd, f"{self.labels[stage.id]} (round {round_no})") if cache else rdd

    def _persist(self, rdd, label: str):
        rdd = self.ctx.plane.persist(rdd, label)
        self.persisted.append(rdd)
        return rdd

    def residual_round(self, stage: StagePlan, round_no: int, clock_ms: float | None):
        """What the stage's tasks need to keep its residuals this round."""
        ctx = self.ctx
        state = ctx.store.pipeline(stage.pipeline)
        last = state.last_checkpoint_id
        checkpoint = None if last is None else int(last)
        return ResidualRound(
            **ctx.state_fields(stage.pipeline, state, checkpoint, round_no, ctx.parallelism),
            clock_ms=time.time() * 1000.0 if clock_ms is None else clock_ms,
            limit=residual_limit(ctx.parallelism),
        )

    def task_body(
        self, stage: StagePlan, side_bc, round_no: int, residuals: ResidualRound | None = None
    ) -> TaskBody:
        """What one task of the stage's run does with its rows (also run on the driver:
        ``driver_stages``); with ``residuals`` it keeps them and its output chunks."""
        ctx = self.ctx
        task = StageTask(
            ctx.plan_key, stage, residual_budget_s=self.residual_budget_s, splits=self.split_policy
        )
        session = self.startpoints.get(stage.pipeline)
        assignment = session.assignment(stage.id) if session is not None else None
        return TaskBody(
            task, ctx.components, side_bc, round_no, assignment,
            residuals=residuals, keep_outputs=residuals is not None, elements=self.elements,
        )  # fmt: skip

    def restored_outputs(self, stage: StagePlan, round_no: int):
        """The persisted output chunks of a resumed stage's committed rounds, read now: a later
        commit's retention may delete the files the restored checkpoint names."""
        spec = self.residual_round(stage, round_no, None)
        label = f"{self.labels[stage.id]} (restored output)"
        subtasks = self.ctx.plane.as_subtasks(None, self.ctx.parallelism)
        rdd = self._persist(subtasks.mapPartitionsWithIndex(reading_outputs(spec, stage.id)), label)
        self.ctx.plane.describe_job(self.group, label)
        with self.ctx.plane.call_site(label):
            run_guarded(stage.id, rdd.count, self.labels.get)
        return rdd

    def unpersist(self) -> None:
        for rdd in self.persisted:
            rdd.unpersist(blocking=False)
        self.persisted.clear()


def reading_outputs(spec: StateRound, stage: str) -> Callable:
    """The task body ``(subtask, rows)`` of a resumed stage's committed output chunks."""
    return reading_rows(spec, state_layout.stage_output(stage), OutputRecord)

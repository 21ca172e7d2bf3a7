"""The order a batch run builds its stages in: side inputs ready together are read together.

A stage with side inputs needs their values before it is built (they are broadcast), and
reading them is a Spark job. Built in plain topological order, each such stage pays its own
job, one after another. Here stages without side inputs are built as soon as their inputs'
writers are (building is lazy: no job runs), and every stage whose side inputs are then all
written joins one *wave*: the executor reads all of the wave's side inputs in one Spark job.
Ten ``AsSingleton`` side inputs on one Map, or nine ``CombineGlobally`` defaults, cost one job.
"""

from __future__ import annotations

from collections import Counter

from sparkbeam.translation.plan import ExecutionPlan, StagePlan


def build_waves(plan: ExecutionPlan) -> list[tuple[StagePlan, ...]]:
    """Every stage once, in groups; a group's side inputs are all written before it starts.

    A group without side inputs holds one stage. The order respects every data dependency
    (main and side inputs), like the plan's topological order does."""
    writers_left = Counter(b for s in plan.stages for b in dict.fromkeys(s.output_buffers))
    pending = list(plan.stages)
    waves: list[tuple[StagePlan, ...]] = []

    def written(buffers) -> bool:
        return all(writers_left[b] == 0 for b in buffers)

    def built(stage: StagePlan) -> None:
        pending.remove(stage)
        for b in dict.fromkeys(stage.output_buffers):
            writers_left[b] -= 1

    while pending:
        plain = next((s for s in pending if not s.side_inputs and written(s.input_buffers)), None)
        if plain is not None:
            built(plain)
            waves.append((plain,))
            continue
        wave = tuple(
            s
            for s in pending
            if written(s.input_buffers) and written(si.buffer for si in s.side_inputs)
        )
        if not wave:
            raise RuntimeError(
                f"Stages {[s.id for s in pending]} wait on each other's outputs; "
                "this is a sparkbeam bug, please report it with the pipeline."
            )
        for stage in wave:
            built(stage)
        waves.append(wave)
    return waves

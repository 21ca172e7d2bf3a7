"""The order a batch run builds its stages in: side inputs ready together are read together.

A stage's side inputs are read (a Spark job) and broadcast before it is built. In plain
topological order each such stage pays its own job. Here stages without side inputs are built
(lazily: no job) as soon as their inputs' writers are, and every stage whose side inputs are
then all written joins one *wave*, whose side inputs are read in one job: ten ``AsSingleton``
side inputs on one Map, or nine ``CombineGlobally`` defaults, cost one job.
"""

from __future__ import annotations

from collections import Counter

from sparkbeam.translation.plan import ExecutionPlan, StagePlan


def build_waves(plan: ExecutionPlan) -> list[tuple[StagePlan, ...]]:
    """Every stage once, in groups ordered by every main and side input; a group's side inputs
    are all written before it starts, and a group without side inputs holds one stage."""
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

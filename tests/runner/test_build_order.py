"""Batch build order: side inputs that are ready together are read in one Spark job."""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.transforms import environments

from sparkbeam.runner.batch.build_order import build_waves
from sparkbeam.runner.batch.executor import PlanExecutor
from sparkbeam.runner.runner import portable_proto
from sparkbeam.translation import translate


def _plan(build):
    """The translated plan (no ``assert_that``: its coders need the runner's type inference)."""
    p = beam.Pipeline()
    build(p)
    proto = p.to_runner_api(default_environment=environments.EmbeddedPythonEnvironment.default())
    return translate(proto)


def _side_waves(plan):
    return [w for w in build_waves(plan) if any(s.side_inputs for s in w)]


def _ten_singletons(p):
    sides = [beam.pvalue.AsSingleton(p | f"S{i}" >> beam.Create([i])) for i in range(10)]
    _ = p | beam.Create([0]) | beam.Map(lambda x, *s: x + sum(s), *sides) | beam.Map(print)


def _nine_globals(p):
    nums = p | beam.Create(range(10))
    for i in range(9):
        _ = nums | f"Sum{i}" >> beam.CombineGlobally(sum) | f"Print{i}" >> beam.Map(print)


def test_ten_side_inputs_of_one_map_are_one_wave():
    waves = _side_waves(_plan(_ten_singletons))
    assert len(waves) == 1
    assert sum(len(s.side_inputs) for s in waves[0]) == 10


def test_independent_combine_globally_defaults_share_one_wave():
    plan = _plan(_nine_globals)
    with_side = [s for s in plan.stages if s.side_inputs]
    assert len(with_side) >= 9  # each CombineGlobally injects its default from a side input
    assert len(_side_waves(plan)) == 1


def test_waves_keep_every_dependency_and_every_stage_once():
    for build in (_ten_singletons, _nine_globals):
        plan = _plan(build)
        order = [s for wave in build_waves(plan) for s in wave]
        assert sorted(s.id for s in order) == sorted(s.id for s in plan.stages)
        built: set = set()
        for wave in build_waves(plan):
            for stage in wave:
                needs = [*stage.input_buffers, *(si.buffer for si in stage.side_inputs)]
                writers = {w.id for b in needs for w in plan.stages if b in w.output_buffers}
                assert writers <= built, (stage.id, writers - built)
            built |= {s.id for s in wave}


def test_upstream_follows_inputs_and_side_inputs_back_to_the_roots():
    plan = _plan(_ten_singletons)
    main = next(s for s in plan.stages if s.side_inputs)
    side = main.side_inputs[0].buffer
    writers = {s.id for s in plan.stages if side in s.output_buffers}
    assert writers and writers <= plan.upstream([side])
    assert main.id not in plan.upstream([side])  # downstream of it, not upstream
    everything = plan.upstream([b for s in plan.stages for b in s.output_buffers])
    assert everything == {s.id for s in plan.stages if s.output_buffers}


@pytest.mark.spark
def test_the_last_job_reads_stages_an_earlier_job_ran_in_few_tasks(spark):
    """Nine CombineGlobally defaults are side inputs: one job runs the combines; the last job
    reads their (cached) reports in at most ``parallelism`` tasks, not one task per cached
    partition, while the stages nobody ran yet keep a task per partition."""
    p = beam.Pipeline()
    _nine_globals(p)
    executor = PlanExecutor(spark, translate(portable_proto(p, p.options)), parallelism=2)
    executor.run()
    parts = {s.id: rdd.getNumPartitions() for s, rdd in executor._lazy}
    ran = {s for s in parts if s in executor._ran}
    assert ran and ran != set(parts)  # the side-input job ran some stages, not all
    fresh = sum(n for s, n in parts.items() if s not in ran)

    tracker = spark.sparkContext.statusTracker()
    last_job = max(tracker.getJobIdsForGroup(executor.rdds.group))
    result_stage = max(tracker.getJobInfo(last_job).stageIds)
    tasks = tracker.getStageInfo(result_stage).numTasks
    assert tasks == fresh + min(2, sum(parts[s] for s in ran)), (tasks, parts)
    assert tasks < sum(parts.values())

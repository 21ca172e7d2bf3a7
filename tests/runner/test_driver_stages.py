"""Stages that only feed side inputs run on a local master's driver, without a Spark job."""

from __future__ import annotations

import glob
import os

import apache_beam as beam
import pytest
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import environments

from sparkbeam.runner import SparkCheckpointRunner
from sparkbeam.runner.batch.driver_stages import side_input_feeders
from sparkbeam.runner.batch.executor import PlanExecutor
from sparkbeam.runner.errors import StageFailedError
from sparkbeam.runner.runner import portable_proto
from sparkbeam.translation import translate
from tests.conftest import spark_test_options


def _ten_singletons(p, out=None):
    sides = [beam.pvalue.AsSingleton(p | f"S{i}" >> beam.Create([i])) for i in range(10)]
    summed = p | beam.Create([0]) | beam.Map(lambda x, *s: x + sum(s), *sides)
    if out is not None:
        _ = summed | beam.io.WriteToText(out, shard_name_template="")


def _list_of_many(p):
    """``Create`` of several values reshuffles them: two stages before the side input."""
    side = beam.pvalue.AsList(p | "Side" >> beam.Create([3, 1, 2]))
    return p | beam.Create(["a"]) | beam.Map(lambda x, s: (x, sorted(s)), side)


def _after_a_group(p):
    """CombineGlobally's default is a side input computed after a GroupByKey."""
    return p | beam.Create([1, 2, 3]) | beam.CombineGlobally(sum)


def _plan(build):
    p = beam.Pipeline()
    build(p)
    proto = p.to_runner_api(default_environment=environments.EmbeddedPythonEnvironment.default())
    return translate(proto)


def _names(plan, ids):
    return {s.name for s in plan.stages if s.id in ids}


def test_creates_read_as_side_inputs_are_driver_stages():
    plan = _plan(_ten_singletons)
    feeders = side_input_feeders(plan)
    assert len(feeders) == 10  # the ten Creates, not the Map that reads them
    assert all(not s.side_inputs for s in plan.stages if s.id in feeders)

    plan = _plan(_list_of_many)
    names = _names(plan, side_input_feeders(plan))
    assert len(names) == 2, names  # both sides of Side's reshuffle
    assert all("Side" in n for n in names), names


def test_what_follows_a_group_by_key_stays_on_spark():
    plan = _plan(_after_a_group)
    feeders = side_input_feeders(plan)
    side_buffers = {si.buffer for s in plan.stages for si in s.side_inputs}
    writers = {s.id for s in plan.stages if side_buffers.intersection(s.output_buffers)}
    assert writers and not writers & feeders


def _jobs(spark, executor) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(executor.rdds.group))


@pytest.mark.spark
def test_ten_create_side_inputs_need_no_side_input_job(spark, tmp_path):
    out = str(tmp_path / "sum")
    p = beam.Pipeline()
    _ten_singletons(p, out)
    executor = PlanExecutor(spark, translate(portable_proto(p, p.options)), parallelism=2)
    executor.run()
    with open(out) as f:
        assert f.read().split() == ["45"]
    # WriteToText's own side input (its initialization) is a driver stage too: the final job
    # is the only one left, plus the two of WriteToText's finalization after the data.
    assert _jobs(spark, executor) == 3
    assert not glob.glob(os.path.join(tmp_path, "beam-temp-*"))


def _pipeline(*flags):
    return beam.Pipeline(
        runner=SparkCheckpointRunner(), options=PipelineOptions([*spark_test_options(), *flags])
    )


class _Counted(beam.DoFn):
    def __init__(self):
        self.seen = Metrics.counter("driver-stage", "seen")

    def process(self, x):
        self.seen.inc()
        yield x


@pytest.mark.spark
def test_a_driver_stage_reports_its_metrics_and_its_output_is_read_in_order(spark):
    p = _pipeline()
    side = p | "Side" >> beam.Create([3, 1, 2]) | "Count" >> beam.ParDo(_Counted())
    got = p | beam.Create(["a"]) | beam.Map(lambda x, s: (x, sorted(s)), beam.pvalue.AsList(side))
    assert_that(got, equal_to([("a", [1, 2, 3])]))
    result = p.run()
    result.wait_until_finish()
    (counter,) = result.metrics().query(MetricsFilter().with_name("seen"))["counters"]
    assert counter.committed == 3


def _refuse(x):
    raise ValueError(f"no side input from {x}")


@pytest.mark.spark
def test_a_failing_driver_stage_names_the_step_and_the_user_frame(spark):
    with pytest.raises(StageFailedError) as info:
        with _pipeline() as p:
            side = p | "Side" >> beam.Create([1]) | "Refuse" >> beam.Map(_refuse)
            _ = p | beam.Create([0]) | beam.Map(lambda x, s: x + s, beam.pvalue.AsSingleton(side))
    message = str(info.value)
    assert "Refuse" in message
    assert "ValueError: no side input from 1" in message
    assert "_refuse" in message


@pytest.mark.spark
def test_a_driver_stage_output_read_as_side_and_as_main_input(spark):
    """A ``Create`` read both as a side input and as a main input: the main-input reader on
    Spark gets the driver stage's output as a dataset."""
    p = _pipeline()
    nums = p | "Nums" >> beam.Create([1, 2, 3])
    total = beam.pvalue.AsSingleton(nums | beam.CombineGlobally(sum).without_defaults())
    listed = beam.pvalue.AsList(nums)
    shifted = nums | beam.Map(lambda x, all_: x + len(all_), listed)
    both = shifted | beam.Map(lambda x, t: (x, t), total)
    assert_that(both, equal_to([(4, 6), (5, 6), (6, 6)]))
    p.run().wait_until_finish()

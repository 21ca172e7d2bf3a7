"""Batch reports ride with the data to one consumer (``rounds.carry``): each exactly once.

A stage's metrics and staged sink files reach the driver through its carrier, across narrow
edges, GroupByKey, Reshuffle and a stateful stage's key shuffle; a stage read twice still hands
them over once. Only a stage whose output is read more than once is cached.
"""

from __future__ import annotations

import glob

import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec

from sparkbeam.io import WriteToFilesOnCheckpoint
from sparkbeam.runner import SparkCheckpointRunner
from sparkbeam.runner.batch.executor import PlanExecutor
from sparkbeam.runner.runner import portable_proto
from sparkbeam.translation import translate
from tests.conftest import spark_test_options

pytestmark = pytest.mark.spark


def _counted(name: str):
    def fn(x):
        Metrics.counter("carry", name).inc()
        return x

    return fn


class _Running(beam.DoFn):
    """A stateful stage: its input is shuffled by key."""

    TOTAL = ReadModifyWriteStateSpec("total", VarIntCoder())

    def process(self, kv, total=beam.DoFn.StateParam(TOTAL)):
        Metrics.counter("carry", "stateful").inc()
        total.write((total.read() or 0) + kv[1])
        yield kv[1]


def _build(p, out: str) -> None:
    a = p | beam.Create(range(20)) | "A" >> beam.Map(_counted("a"))
    _ = a | "Sink" >> WriteToFilesOnCheckpoint(out, format_fn=str)  # fused with A's stage
    grouped = (
        a
        | "Key" >> beam.Map(lambda x: (x % 3, x))
        | beam.GroupByKey()
        | "B" >> beam.Map(_counted("b"))
    )
    shuffled = a | beam.Reshuffle() | "C" >> beam.Map(_counted("c"))
    twice = (shuffled, shuffled) | "Twice" >> beam.Flatten() | "D" >> beam.Map(_counted("d"))
    stateful = (  # E's stage hands its reports to the stateful stage, through its key shuffle
        p
        | "Again" >> beam.Create(range(20))
        | "E" >> beam.Map(_counted("e"))
        | "KeyAgain" >> beam.Map(lambda x: (x % 2, x))
        | beam.ParDo(_Running())
    )
    assert_that(grouped | beam.Map(lambda kv: (kv[0], sorted(kv[1]))), equal_to(
        [(k, [x for x in range(20) if x % 3 == k]) for k in range(3)]
    ), label="CheckGrouped")  # fmt: skip
    assert_that(twice, equal_to(list(range(20)) * 2), label="CheckTwice")
    assert_that(stateful, equal_to(list(range(20))), label="CheckStateful")


@pytest.mark.parametrize("plane", ["rdd", "frames"])
def test_every_stage_reports_once_through_its_carrier(spark, tmp_path, plane):
    out = str(tmp_path / "out" / "lines")
    p = beam.Pipeline(
        runner=SparkCheckpointRunner(),
        options=PipelineOptions(spark_test_options(f"--data_plane={plane}")),
    )
    _build(p, out)
    result = p.run()
    result.wait_until_finish()
    counters = {
        c.key.metric.name: c.committed
        for c in result.metrics().query(MetricsFilter().with_namespace("carry"))["counters"]
    }
    assert counters == {"a": 20, "b": 3, "c": 20, "d": 40, "e": 20, "stateful": 20}
    lines = []
    for name in glob.glob(out + "*"):
        with open(name) as f:
            lines += f.read().split()
    assert sorted(lines, key=int) == [str(x) for x in range(20)]  # the sink's files committed
    assert not glob.glob(str(tmp_path / "out" / ".*" / "*"))  # no staged file left behind


def test_only_a_stage_read_twice_is_cached(spark):
    p = beam.Pipeline()
    _build(p, "/tmp/unused")
    plan = translate(portable_proto(p, p.options))
    executor = PlanExecutor(spark, plan, 2)
    try:
        carriers = executor._plan_carriers()
    finally:
        executor._cleanup()
    stages = {s.id: s for s in plan.stages}
    readers: dict = {}
    for s in plan.stages:
        for transform, buffer in s.inputs:
            readers.setdefault(buffer, []).append((s.id, transform))
    for stage in plan.stages:
        reads = [r for b in dict.fromkeys(stage.output_buffers) for r in readers.get(b, ())]
        # A stage that feeds others hands its reports to the first of them; the last ones
        # to the final collect.
        assert (stage.id in carriers.carrier) == bool(reads), stage.name
        if stage.id in carriers.carrier:
            buffer, consumer, transform = carriers.carrier[stage.id]
            assert (consumer, transform) == reads[0] and buffer in stage.output_buffers
        assert carriers.cache(stage.id) == (len(reads) > 1), stage.name
    assert any(carriers.cache(s) for s in stages)  # A's stage (read by three) is kept
    assert sum(not carriers.cache(s) for s in stages) >= 4  # the chains are not

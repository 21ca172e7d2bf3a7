"""How much input one bundle of an ordinary stage sees (``task.bundle_executor``).

A bundle pulls its task's input as it goes (not held in memory) and ends once it has flushed
output or read ``STREAMED_BUNDLE_BYTES``: a stage with little output runs one bundle per task
of up to that size, so a lifted combiner's pre-combine flushes once; a stage with much output
ends bundles as its output grows, so a task's memory stays bounded.
"""

from __future__ import annotations

from types import SimpleNamespace

import apache_beam as beam
import pytest
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.runner import SparkCheckpointRunner
from sparkbeam.runner.task import bundle_executor
from sparkbeam.runner.task.bundle_executor import BUNDLE_BYTES
from tests.conftest import spark_test_options

pytestmark = pytest.mark.spark

ELEMENTS = 64
BYTES_EACH = 4 * BUNDLE_BYTES // ELEMENTS  # 4 x BUNDLE_BYTES in all


class _Bundles(beam.DoFn):
    def __init__(self, name: str, out_bytes: int) -> None:
        self.name, self.out_bytes = name, out_bytes

    def start_bundle(self):
        Metrics.counter("bundles", self.name).inc()

    def process(self, element):
        Metrics.counter("elements", self.name).inc()
        if self.out_bytes:
            yield "y" * self.out_bytes


def _counts(result, namespace: str) -> dict:
    query = result.metrics().query(MetricsFilter().with_namespace(namespace))
    return {c.key.metric.name: c.committed for c in query["counters"]}


def test_a_bundle_sees_its_tasks_input_until_it_has_output_to_flush(spark):
    options = PipelineOptions(spark_test_options())
    p = beam.Pipeline(runner=SparkCheckpointRunner(), options=options)
    big = p | beam.Create(range(ELEMENTS)) | "Big" >> beam.Map(lambda i: "x" * BYTES_EACH)
    _ = big | "R1" >> beam.Reshuffle() | "Quiet" >> beam.ParDo(_Bundles("quiet", 0))
    loud = big | "R2" >> beam.Reshuffle() | "Loud" >> beam.ParDo(_Bundles("loud", 2 * BYTES_EACH))
    _ = loud | "R3" >> beam.Reshuffle() | "Size" >> beam.Map(len)  # Loud's output leaves
    result = p.run()
    result.wait_until_finish()
    assert _counts(result, "elements") == {"quiet": ELEMENTS, "loud": ELEMENTS}
    bundles = _counts(result, "bundles")
    # Each stage reads 4 x BUNDLE_BYTES in 2 tasks: input-sized bundles made at least 4.
    assert bundles["quiet"] <= 2  # one per task
    # Loud writes 2 x its input, ~32 MB a task: Beam flushes at 10 MB, and a flush ends a
    # bundle (a task that never ended one would hold all its output: 2 bundles).
    assert bundles["loud"] >= 3


def test_a_streamed_bundle_also_ends_at_its_input_bound(monkeypatch):
    """What a DoFn buffers until its bundle finishes stays bounded too."""
    monkeypatch.setattr(bundle_executor, "STREAMED_BUNDLE_BYTES", 10)
    loop = bundle_executor._TaskLoop.__new__(bundle_executor._TaskLoop)
    loop.worker = SimpleNamespace(flushed_outputs=lambda: 0)  # no output flushed yet
    rows = iter([("read", b"abcd")] * 5)
    assert list(loop._until_output(next(rows), rows)) == [("read", b"abcd")] * 3  # 12 >= 10
    assert len(list(rows)) == 2  # left for the next bundle

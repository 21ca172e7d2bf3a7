"""Elements cross every Reshuffle and GroupByKey edge in the coder their reader decodes with.

Each pipeline runs on Beam's FnApiRunner and on SparkCheckpointRunner (batch, and streaming
with real rounds and checkpoints); the outputs must be equal.
"""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to

from tests.conftest import spark_test_options
from tests.edges.special_keys import KINDS, PIPELINES

pytestmark = pytest.mark.spark


_COLLECTED: list[str] = []  # FnApiRunner runs in this process; its DoFns are copies


def _collect(line: str) -> None:
    _COLLECTED.append(line)


def _fn_api_output(build, kind: str) -> list[str]:
    _COLLECTED.clear()
    with beam.Pipeline(runner=FnApiRunner()) as p:
        _ = build(p, kind) | beam.Map(_collect)
    return sorted(_COLLECTED)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", sorted(PIPELINES))
def test_batch_output_equals_fn_api_runner(spark, kind, shape):
    build = PIPELINES[shape]
    expected = _fn_api_output(build, kind)
    assert expected  # the reference ran and produced lines
    with beam.Pipeline(options=PipelineOptions(spark_test_options())) as p:
        assert_that(build(p, kind), equal_to(expected))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["namedtuple", "dataclass", "nested"])
@pytest.mark.parametrize("shape", sorted(PIPELINES))
def test_streaming_output_equals_fn_api_runner(spark, tmp_path, kind, shape):
    build = PIPELINES[shape]
    expected = _fn_api_output(build, kind)
    options = spark_test_options(
        "--streaming", f"--checkpoint_dir={tmp_path / 'ckpt'}", "--checkpoint_interval_s=0.05"
    )
    with beam.Pipeline(options=PipelineOptions(options)) as p:
        assert_that(build(p, kind), equal_to(expected))

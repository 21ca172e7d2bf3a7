"""Restarting a cancelled streaming job with a changed pipeline, on the shared local Spark.

A changed DoFn body resumes from the checkpoint (and runs the new body); a changed GroupByKey
coder is refused with `IncompatiblePipelineError` naming the GroupByKey and how to start fresh.
"""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.transforms import window

from sparkbeam.checkpoint import open_store
from sparkbeam.runner.errors import IncompatiblePipelineError
from tests.conftest import spark_test_options
from tests.streaming.streaming_pipelines import EventTimeOffsets

pytestmark = pytest.mark.spark


def _key(kv):
    return kv[0], kv[1]


def _key_changed(kv):  # a new body: same types, and a counter that shows it ran
    Metrics.counter("restore-test", "new-body").inc()
    return kv[0].upper(), kv[1]


def _key_bytes(kv):
    return kv[0].encode(), kv[1]


def _pipeline(ckpt, fn, key_type=str) -> beam.Pipeline:
    options = PipelineOptions(
        spark_test_options(
            "--streaming", f"--checkpoint_dir={ckpt}", "--checkpoint_interval_s=0.05"
        )
    )
    p = beam.Pipeline(options=options)
    _ = (
        p
        | "Sources" >> beam.Create([("forever", 10**9)])
        | "Read" >> beam.ParDo(EventTimeOffsets(per_round=5, delay_s=0.01))
        | "Key" >> beam.Map(fn).with_output_types(tuple[key_type, int])
        | "Window" >> beam.WindowInto(window.FixedWindows(10))
        | "Count" >> beam.combiners.Count.PerKey()
    )
    return p


def _run(ckpt, fn, run_ms=2000):
    result = _pipeline(ckpt, fn).run()
    assert result.wait_until_finish(duration=run_ms) == PipelineState.RUNNING
    assert result.cancel() == PipelineState.CANCELLED
    return result


def _last_manifest(ckpt):
    store = open_store(str(ckpt), read_only=True)
    (pipeline,) = store.list_pipelines()
    return store.load_manifest(pipeline, store.list_checkpoints(pipeline)[-1].checkpoint_id)


def test_changed_dofn_body_resumes_and_changed_coder_is_refused(spark, tmp_path):
    ckpt = tmp_path / "ckpt"
    _run(ckpt, _key)
    first = _last_manifest(ckpt)
    assert "shape" in first.metadata and first.metadata["pending_residuals"] == 1

    result = _run(ckpt, _key_changed, run_ms=1500)
    resumed = _last_manifest(ckpt)
    assert resumed.metadata["round"] > first.metadata["round"]  # continued, not restarted
    assert resumed.metadata["watermark_micros"] > first.metadata["watermark_micros"]
    counters = result.metrics().query(MetricsFilter().with_name("new-body"))["counters"]
    assert counters and counters[0].committed > 0  # the new body ran

    refused = _pipeline(ckpt, _key_bytes, key_type=bytes).run()
    with pytest.raises(
        IncompatiblePipelineError,
        match=r"(?s)coder of GroupByKey 'Count/CombinePerKey\(CountCombineFn\)/Group' input "
        r"changed from .*KV<str,.* to .*KV<bytes,.*new --checkpoint_dir",
    ):
        refused.wait_until_finish(duration=60_000)
    assert _last_manifest(ckpt).checkpoint_id == resumed.checkpoint_id  # nothing overwritten

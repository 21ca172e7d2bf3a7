"""Pipelines with ``--checkpoint_dir s3://...`` on the shared local Spark and moto's S3 server:
the pipeline's ``--s3_*`` flags reach every task (this process has no AWS environment), and a
cancelled streaming job resumes from its last checkpoint on S3 instead of starting over. (The
batch SDF pipeline on S3 is in ``tests/io/test_write_to_files_s3.py``.)"""

from __future__ import annotations

import time
import uuid

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState

from sparkbeam.io import WriteToFilesOnCheckpoint
from tests.conftest import checkpoint_ids, spark_test_options
from tests.streaming.streaming_pipelines import expected_counts, windowed_counts

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    # Executors must get the options from the pipeline, not from an inherited environment.
    pytest.mark.usefixtures("no_aws_environment"),
]


def test_cancelled_streaming_job_on_s3_resumes_and_writes_each_window_once(spark, s3_server):
    run = f"stream-{uuid.uuid4().hex[:8]}"
    ckpt, out = s3_server.url(run, "ckpt"), s3_server.url(run, "out", "counts")
    flags = spark_test_options(
        "--streaming", f"--checkpoint_dir={ckpt}", "--checkpoint_interval_s=0.05",
        *s3_server.pipeline_flags(),
    )  # fmt: skip
    sources = [("a", 60), ("b", 40)]

    def start():
        p = beam.Pipeline(options=PipelineOptions(flags))
        _ = windowed_counts(p, sources, per_round=5) | WriteToFilesOnCheckpoint(out)
        return p.run()

    first = start()
    deadline = time.monotonic() + 300
    while len(checkpoint_ids(ckpt)) < 2 and time.monotonic() < deadline:
        assert first.wait_until_finish(duration=500) == PipelineState.RUNNING
    assert first.cancel() == PipelineState.CANCELLED
    before = checkpoint_ids(ckpt)
    assert len(before) >= 2, "the first run committed no checkpoints on S3"
    assert start().wait_until_finish() == PipelineState.DONE
    after = checkpoint_ids(ckpt)
    assert min(after) > max(before) - 3 and max(after) > max(before)  # the chain went on
    assert sorted(s3_server.lines(f"{run}/out/counts").elements()) == expected_counts(sources)
    assert not s3_server.keys(f"{run}/out/.sparkbeam-staging/")

"""WriteToFilesOnCheckpoint to an ``s3://`` prefix (moto's S3 server): tasks stage their files on
S3 with the pipeline's ``--s3_*`` flags, the driver renames the committed ones (copy + delete
through Beam's FileSystems), and nothing is left in the staging prefix."""

from __future__ import annotations

import uuid
from collections import Counter

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.io import WriteToFilesOnCheckpoint
from tests.conftest import checkpoint_ids, spark_test_options

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    # Executors must get the options from the pipeline, not from an inherited environment.
    pytest.mark.usefixtures("no_aws_environment"),
]


def test_batch_sdf_pipeline_commits_its_rounds_and_sink_files_on_s3(spark, s3_server, tmp_path):
    run = f"batch-{uuid.uuid4().hex[:8]}"
    src = tmp_path / "in.txt"
    src.write_text("".join(f"line {i}\n" for i in range(200)))
    ckpt = s3_server.url(run, "ckpt")
    flags = spark_test_options(f"--checkpoint_dir={ckpt}", *s3_server.pipeline_flags())
    with beam.Pipeline(options=PipelineOptions(flags)) as p:
        _ = (
            p
            | beam.io.ReadFromText(str(src))
            | WriteToFilesOnCheckpoint(s3_server.url(run, "out", "lines"), ".txt")
        )
    assert s3_server.lines(f"{run}/out/lines") == Counter(f"line {i}" for i in range(200))
    assert not s3_server.keys(f"{run}/out/.sparkbeam-staging/")
    assert checkpoint_ids(ckpt)  # the SDF stage's rounds were committed on S3

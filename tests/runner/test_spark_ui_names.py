"""The Spark UI shows the Beam pipeline: job groups and stage names carry the Beam stage and
its transforms, read back through Spark's status tracker (works with the UI disabled)."""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from sparkbeam.runner import SparkCheckpointRunner
from sparkbeam.runner.runner import portable_proto
from sparkbeam.runner.spark.labels import job_group
from sparkbeam.translation import translate
from tests.conftest import spark_test_options

pytestmark = pytest.mark.spark


def _stage_names(sc, group: str) -> list[str]:
    tracker = sc.statusTracker()
    names = []
    for job_id in tracker.getJobIdsForGroup(group):
        for stage_id in tracker.getJobInfo(job_id).stageIds:
            info = tracker.getStageInfo(stage_id)
            if info is not None:
                names.append(info.name)
    return names


def _build(p):
    counted = (
        p
        | "Read" >> beam.Create(["a", "b", "a"])
        | "Count" >> beam.combiners.Count.PerElement()
        | "Format" >> beam.MapTuple(lambda word, n: f"{word}:{n}")
    )
    assert_that(counted, equal_to(["a:2", "b:1"]))


def test_batch_jobs_and_stages_are_named_after_beam_transforms(spark):
    options = PipelineOptions(spark_test_options())
    probe = beam.Pipeline(runner=SparkCheckpointRunner(), options=options)
    _build(probe)
    group = job_group(translate(portable_proto(probe, options)))
    p = beam.Pipeline(runner=SparkCheckpointRunner(), options=options)
    _build(p)
    p.run()
    names = _stage_names(spark.sparkContext, group)
    assert names, f"no Spark job in group {group!r}"
    text = " | ".join(names)
    assert "Count/CombinePerKey" in text and "Format" in text, text
    assert "stage-" in text
    for source in ("edges.py", "executor.py", "errors.py", "rdd.py"):
        assert source not in text, text  # no sparkbeam/pyspark source lines as stage names


def test_streaming_rounds_are_named_after_pipeline_and_transforms(spark, tmp_path):
    options = PipelineOptions(
        spark_test_options("--streaming", f"--checkpoint_dir={tmp_path / 'ckpt'}")
    )
    probe = beam.Pipeline(runner=SparkCheckpointRunner(), options=options)
    _build(probe)
    plan = translate(portable_proto(probe, options))
    p = beam.Pipeline(runner=SparkCheckpointRunner(), options=options)
    _build(p)
    p.run().wait_until_finish()
    names = []
    for pipeline in plan.pipelines:
        names += _stage_names(spark.sparkContext, job_group(plan, pipeline.id))
    text = " | ".join(names)
    assert "round 0" in text and "Count/CombinePerKey" in text and "Format" in text, text
    # Each Spark stage names its own Beam stage, not the round's whole list.
    assert len(set(names)) > 1, names
    assert not any("Count/CombinePerKey" in n and "Format" in n and ";" in n for n in names)
    assert all(len(n) <= 200 for n in names), names

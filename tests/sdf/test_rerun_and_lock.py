"""Batch runs with --checkpoint_dir on the shared Spark session: rerunning a finished job fails
with how to start over (``--fresh``) instead of writing its output twice, and the pipeline
option ``--break_lock`` clears a lock file left empty by a crash."""

from __future__ import annotations

import shutil

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.checkpoint import CheckpointCorruptError, StoreLockedError, open_store
from sparkbeam.checkpoint.layout import PIPELINES
from sparkbeam.checkpoint.lock import LOCK_FILE
from sparkbeam.runner import runner as runner_module
from sparkbeam.runner.options import SparkStreamingOptions
from sparkbeam.runner.rounds.compatibility import FinishedJobError
from tests.conftest import spark_test_options

pytestmark = pytest.mark.spark


class _Record(beam.DoFn):
    """Appends every element it processes to a file: counts how often the job really ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def process(self, element):
        with open(self.path, "a") as f:
            f.write(f"{element}\n")
        yield element


def _run(tmp_path, *extra: str) -> None:
    options = PipelineOptions(
        spark_test_options(
            f"--checkpoint_dir={tmp_path / 'ckpt'}",
            "--parallelism=2",
            "--checkpoint_interval_s=0.05",
            *extra,
        )
    )
    with beam.Pipeline(options=options) as p:
        _ = p | beam.Create(["a", "b", "c"]) | beam.ParDo(_Record(str(tmp_path / "seen.txt")))


def _seen(tmp_path) -> list[str]:
    return sorted((tmp_path / "seen.txt").read_text().split())


@pytest.mark.slow  # three batch runs
def test_rerunning_a_finished_batch_job_fails_unless_fresh(spark, tmp_path):
    _run(tmp_path)
    assert _seen(tmp_path) == ["a", "b", "c"]
    with pytest.raises(
        FinishedJobError,
        match=r"Pipeline 'pipeline-0' already finished: checkpoint \d+ in store .* would write "
        r"its output a second time\. To run the job again from the beginning pass --fresh",
    ):
        _run(tmp_path)
    assert _seen(tmp_path) == ["a", "b", "c"]  # the refused rerun processed nothing
    _run(tmp_path, "--fresh")  # the operator asked for it
    assert _seen(tmp_path) == ["a", "a", "b", "b", "c", "c"]


@pytest.mark.slow  # three runs
@pytest.mark.parametrize("mode", [[], ["--streaming"]], ids=["batch", "streaming"])
def test_a_job_that_finished_after_the_check_before_spark_is_not_rerun(
    spark, tmp_path, monkeypatch, mode
):
    """--break_lock taken from a job still running: that job finishes while this one starts
    Spark. The restore checks again, as the check before Spark does: refused without --fresh."""
    _run(tmp_path / "other", *mode)  # the other job's finished checkpoint
    start_spark = runner_module.start_spark

    def other_job_finishes_meanwhile(*args, **kwargs):
        other = tmp_path / "other" / "ckpt" / PIPELINES
        shutil.copytree(other, tmp_path / "ckpt" / PIPELINES, dirs_exist_ok=True)
        return start_spark(*args, **kwargs)

    monkeypatch.setattr(runner_module, "start_spark", other_job_finishes_meanwhile)
    with pytest.raises(FinishedJobError, match=r"Pipeline 'pipeline-0' already finished"):
        _run(tmp_path, "--break_lock", *mode)
    assert not (tmp_path / "seen.txt").exists()  # the refused rerun processed nothing
    _run(tmp_path, "--break_lock", "--fresh", *mode)  # the operator asked for it
    assert _seen(tmp_path) == ["a", "b", "c"]


@pytest.mark.slow  # two runs
def test_a_job_whose_manifests_were_deleted_is_refused_not_run_fresh(spark, tmp_path):
    """Its changelog, materialization and staged files stay: a fresh start would publish its
    output a second time (the operator's choice: restore the manifests or a new store)."""
    _run(tmp_path)
    for manifest in (tmp_path / "ckpt" / PIPELINES).glob("*/manifests/chk-*.json"):
        manifest.unlink()
    with pytest.raises(CheckpointCorruptError, match=r"Pipeline 'pipeline-0' committed check"):
        _run(tmp_path)
    assert _seen(tmp_path) == ["a", "b", "c"]  # the refused rerun processed nothing


@pytest.mark.slow
def test_break_lock_option_clears_an_empty_lock_file(spark, tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / LOCK_FILE).write_bytes(b"")  # a crash between create and write
    with pytest.raises(StoreLockedError, match=r"unreadable lock file '_LOCK\.json'"):
        _run(tmp_path)
    _run(tmp_path, "--break_lock")
    assert _seen(tmp_path) == ["a", "b", "c"]
    assert not (tmp_path / "ckpt" / LOCK_FILE).exists()
    with open_store(str(tmp_path / "ckpt"), read_only=True) as store:
        assert store.list_pipelines() == ["pipeline-0"]


def test_fresh_and_break_lock_parse_with_defaults_off():
    default = PipelineOptions([]).view_as(SparkStreamingOptions)
    assert (default.fresh, default.break_lock) == (False, False)
    parsed = PipelineOptions(["--fresh", "--break_lock"]).view_as(SparkStreamingOptions)
    assert (parsed.fresh, parsed.break_lock) == (True, True)

"""A cluster master refuses a checkpoint store its executors cannot reach (issue 11.4)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.runner.options import SparkRunnerOptions
from sparkbeam.runner.spark.session_conf import executors_on_this_host
from sparkbeam.runner.spark.storage_check import (
    SharedStorageError,
    check_shared_storage,
    check_store_path,
)

CLUSTERS = ["spark://host:7077", "yarn", "k8s://https://k8s:6443", "mesos://m:5050"]


@pytest.mark.parametrize("master", ["local", "local[4]", "local[*]", "local-cluster[2,1,1024]"])
def test_local_masters_accept_any_path(master):
    assert executors_on_this_host(master)
    for url in ["ckpt", "./ckpt", "/tmp/ckpt", "file:///tmp/ckpt"]:
        check_store_path("--checkpoint_dir", url, master, shared=False)


@pytest.mark.parametrize("master", CLUSTERS)
def test_cluster_refuses_a_relative_path_even_if_declared_shared(master):
    assert not executors_on_this_host(master)
    for shared in (False, True):
        with pytest.raises(SharedStorageError, match=r"--checkpoint_dir './ckpt' is a relative"):
            check_store_path("--checkpoint_dir", "./ckpt", master, shared=shared)


@pytest.mark.parametrize("master", CLUSTERS)
def test_cluster_refuses_a_local_absolute_path_unless_declared_shared(master):
    for url in ["/mnt/ckpt", "file:///mnt/ckpt"]:
        with pytest.raises(SharedStorageError, match=r"is a local path.*--shared_filesystem"):
            check_store_path("--checkpoint_dir", url, master, shared=False)
        check_store_path("--checkpoint_dir", url, master, shared=True)


@pytest.mark.parametrize("url", ["s3://bucket/ckpt", "gs://b/c", "hdfs://nn:8020/ckpt"])
def test_cluster_accepts_urls(url):
    check_store_path("--checkpoint_dir", url, "spark://host:7077", shared=False)


def test_message_is_one_line_and_says_what_to_do():
    with pytest.raises(SharedStorageError) as info:
        check_store_path("--checkpoint_dir", "ckpt", "spark://h:7077", shared=False)
    text = str(info.value)
    assert "\n" not in text and "s3://" in text and "shared filesystem" in text


def test_options_flag_parses():
    flags = ["--spark_master_url=spark://h:7077", "--checkpoint_dir=/mnt/ckpt"]
    opts = PipelineOptions(flags).view_as(SparkRunnerOptions)
    assert opts.shared_filesystem is False
    with pytest.raises(SharedStorageError, match="spark://h:7077"):
        check_store_path("--checkpoint_dir", opts.checkpoint_dir, opts.master_url(), False)
    shared = PipelineOptions([*flags, "--shared_filesystem"]).view_as(SparkRunnerOptions)
    assert shared.shared_filesystem is True


_SUBMIT_STREAMING = """
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
options = PipelineOptions(["--runner=SparkCheckpointRunner", "--streaming",
    "--spark_master_url=yarn"])
with beam.Pipeline(options=options) as p:
    p | beam.Create([1, 2])
"""


_SUBMIT = """
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
options = PipelineOptions(["--runner=SparkCheckpointRunner",
    "--spark_master_url=spark://unreachable.invalid:7077", "--checkpoint_dir=relative-ckpt"])
with beam.Pipeline(options=options) as p:
    p | beam.Create([1, 2])
"""


def _error_line(stderr: str) -> str:
    """The error's line: first of at most two (the message, where its traceback is)."""
    lines = [ln for ln in stderr.strip().splitlines() if "apitools not found" not in ln]  # Beam's
    assert len(lines) == 2 and "--log_level=DEBUG" in lines[1], stderr
    return lines[0]


@pytest.mark.slow
def test_pipeline_with_cluster_master_fails_at_submission(tmp_path):
    # A fresh process (no active session): refused before Spark starts, no cluster needed.
    proc = subprocess.run(
        [sys.executable, "-c", _SUBMIT], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode != 0
    last = _error_line(proc.stderr)
    error = "SharedStorageError: --checkpoint_dir"
    assert last.startswith(error)
    assert "'relative-ckpt' is a relative path" in last and "spark://unreachable" in last
    assert "Could not start Spark" not in proc.stderr


@pytest.mark.slow
def test_streaming_default_store_is_refused_on_a_cluster(tmp_path):
    # Without --checkpoint_dir a streaming run would use ./sparkbeam-checkpoints/<job>: local.
    proc = subprocess.run(
        [sys.executable, "-c", _SUBMIT_STREAMING],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    last = _error_line(proc.stderr)
    assert "SharedStorageError: --checkpoint_dir (unset; the --streaming default)" in last
    assert "sparkbeam-checkpoints' is a local path, but master 'yarn'" in last


@pytest.mark.spark
def test_active_session_master_wins_over_the_option(spark):
    # Under spark-submit the active session's master is the one that counts: a local one.
    opts = PipelineOptions(
        ["--spark_master_url=spark://h:7077", "--checkpoint_dir=relative"]
    ).view_as(SparkRunnerOptions)
    check_shared_storage(opts)


def test_a_connect_server_on_another_host_refuses_a_local_store():
    """Its executors read the server's disk, not the driver's, whatever its own master is."""
    options = PipelineOptions(
        ["--spark_remote=sc://spark.example.com:15002", "--checkpoint_dir=/tmp/ckpt"]
    ).view_as(SparkRunnerOptions)
    with pytest.raises(SharedStorageError, match=r"sc://spark.example.com:15002.*other hosts"):
        check_shared_storage(options)
    options.shared_filesystem = True
    check_shared_storage(options)  # declared shared: the server mounts it at this path

"""Errors at submission reach the operator as one line naming the cause and what to do: the
message alone (`one_line.report`), its traceback only with --log_level=DEBUG. Each case here
fails before Spark starts, so none needs a session; S3 cases use moto's server."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.checkpoint import open_store
from sparkbeam.checkpoint.state_layout import FINISHED
from sparkbeam.runner.errors import StageFailedError
from sparkbeam.runner.one_line import report
from sparkbeam.translation.errors import UnsupportedFeatureError

CLUSTER = "--spark_master_url=spark://127.0.0.1:7077"  # never reached: refused before Spark


def _raised(*flags: str, pipeline=None) -> BaseException:
    """What running a small pipeline with these flags raises (before any Spark)."""
    options = PipelineOptions(["--runner=SparkCheckpointRunner", *flags])
    p = beam.Pipeline(options=options)
    if pipeline is None:
        _ = p | beam.Create([1, 2]) | beam.Map(lambda x: x)
    else:
        pipeline(p)
    with pytest.raises(Exception) as info:
        p.run().wait_until_finish()
    return info.value


def _one_line(error: BaseException, first: str) -> str:
    lines = report(error).splitlines()
    assert len(lines) <= 3, lines
    assert lines[0].startswith(first), lines[0]
    assert "Traceback" not in report(error)
    return lines[0]


def test_an_unknown_master_is_named_as_such_not_as_a_storage_problem(tmp_path):
    error = _raised("--spark_master_url=bogus://x", f"--checkpoint_dir={tmp_path}")
    line = _one_line(error, "SparkSessionError: --spark_master_url 'bogus://x' is not a Spark")
    assert "spark://host:port" in line


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_FRESH = """
import json, sys
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from sparkbeam.runner.one_line import report
flags, read = json.loads(sys.argv[1]), sys.argv[2] == "read"
p = beam.Pipeline(options=PipelineOptions(["--runner=SparkCheckpointRunner", *flags]))
if read:
    _ = p | "Read lines" >> beam.io.ReadFromText("./README.md") | beam.Map(len)
else:
    _ = p | beam.Create([1, 2]) | beam.Map(lambda x: x)
try:
    p.run().wait_until_finish()
except Exception as e:
    print(json.dumps(report(e)))
"""


def _one_line_in_a_fresh_process(first: str, *flags: str, read: bool = False) -> str:
    """`_one_line` of what a run raises in a process of its own: a cluster master given by
    flag must meet no SparkSession another test of this process left active."""
    import json

    done = subprocess.run(
        [sys.executable, "-c", _FRESH, json.dumps(flags), "read" if read else "create"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.stdout.strip(), done.stderr[-2000:]
    text = json.loads(done.stdout.strip().splitlines()[-1])
    lines = text.splitlines()
    assert len(lines) <= 3, lines
    assert lines[0].startswith(first), lines[0]
    assert "Traceback" not in text
    return lines[0]


def test_a_relative_input_on_a_cluster_is_refused_at_submission():
    first = "SharedStorageError: 'Read lines/Read' reads './README.md', a rel"
    line = _one_line_in_a_fresh_process(first, CLUSTER, read=True)
    assert "spark://127.0.0.1:7077" in line and os.path.join(ROOT, "README.md") in line


def test_a_relative_store_on_a_cluster_is_one_line():
    line = _one_line_in_a_fresh_process("SharedStorageError: ", CLUSTER, "--checkpoint_dir=ckpt")
    assert "--checkpoint_dir 'ckpt' is a relative path" in line


def test_a_finished_job_is_one_line(tmp_path):
    with open_store(str(tmp_path)) as store:
        store.pipeline("pipeline-0").checkpoint(metadata={FINISHED: True})
    error = _raised(f"--checkpoint_dir={tmp_path}")
    _one_line(error, "FinishedJobError: Pipeline 'pipeline-0' already finished")


def test_an_unsupported_feature_is_one_line():
    error = UnsupportedFeatureError("Sort", "the pipeline requirement 'x'", "Remove it.")
    _one_line(error, "UnsupportedFeatureError: ")


@pytest.mark.usefixtures("no_aws_environment")
class TestS3Mistakes:
    """One line naming the store URL, the endpoint and the flag or variable to set."""

    def test_a_wrong_endpoint(self, s3_server):
        url = s3_server.url(uuid.uuid4().hex[:8])
        flags = [f for f in s3_server.pipeline_flags() if "endpoint" not in f]
        error = _raised(f"--checkpoint_dir={url}", "--s3_endpoint_url=http://127.0.0.1:9", *flags)
        line = _one_line(error, f"StoreAccessError: Checkpoint store {url!r} (S3 endpoint ")
        assert "http://127.0.0.1:9" in line and "--s3_endpoint_url" in line

    def test_no_credentials(self, s3_server):
        url = s3_server.url(uuid.uuid4().hex[:8])
        flags = [f for f in s3_server.pipeline_flags() if "_key" not in f]
        line = _one_line(_raised(f"--checkpoint_dir={url}", *flags), "StoreAccessError: ")
        assert url in line and s3_server.endpoint_url in line
        assert "no AWS credentials" in line and "--s3_access_key_id" in line

    def test_a_missing_bucket(self, s3_server):
        url = "s3://no-such-bucket/ckpt"
        line = _one_line(
            _raised(f"--checkpoint_dir={url}", *s3_server.pipeline_flags()), "StoreAccessError: "
        )
        assert "bucket 'no-such-bucket', which does not exist" in line
        assert s3_server.endpoint_url in line


@pytest.mark.parametrize(
    "error, advice",
    [
        ("OSError: [Errno 28] No space left on device", "a disk is full"),
        (
            "FileNotFoundError: [Errno 2] No such file or directory: './README.md'",
            "a file the stage reads is missing where the executor looked",
        ),
    ],
)
def test_a_failed_stage_says_what_to_do_by_cause(error, advice):
    trace = f'Traceback (most recent call last):\n  File "/beam/x.py", line 1, in f\n{error}\n'
    message = str(StageFailedError("stage-1", trace, "stage-1: Read"))
    assert f"What to do: {advice}" in message
    assert "coder" not in message


APP = """
import sys
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
with beam.Pipeline(options=PipelineOptions(sys.argv[1:])) as p:
    _ = p | beam.Create([1]) | beam.Map(print)
"""


def test_an_uncaught_error_of_a_pipeline_script_prints_its_message_alone(tmp_path):
    """The script's own uncaught exception: sparkbeam's message and a hint, no traceback;
    with --log_level=DEBUG the traceback too."""
    script = tmp_path / "app.py"
    script.write_text(APP)
    flags = ["--runner=SparkCheckpointRunner", "--spark_master_url=bogus://x"]
    done = subprocess.run(
        [sys.executable, str(script), *flags], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    ours = [ln for ln in done.stderr.splitlines() if "apitools not found" not in ln]  # Beam's
    assert ours[0].startswith("SparkSessionError: --spark_master_url 'bogus://x' is not a")
    assert len(ours) == 2 and "--log_level=DEBUG" in ours[1], done.stderr
    debug = subprocess.run(
        [sys.executable, str(script), *flags, "--log_level=DEBUG"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback (most recent call last)" in debug.stderr


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory on a read-only filesystem (a tmpfs mounted ``ro``): writes fail with EROFS
    even for root, as on a read-only volume or a snapshot mount."""
    target = tmp_path / "ro"
    target.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "none", str(target)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"mounting a read-only tmpfs needs root here: {mounted.stderr.decode()[:200]}")
    try:
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=False)


def test_a_read_only_store_is_one_line_naming_the_store_and_what_to_do(read_only_dir):
    error = _raised(f"--checkpoint_dir={read_only_dir}")
    line = _one_line(error, "StoreAccessError: Checkpoint store")
    assert str(read_only_dir) in line and "cannot be written" in line, line
    assert "Read-only file system" in line and "--checkpoint_dir" in line, line

"""A streaming job with its checkpoint store and its ``WriteToFilesOnCheckpoint`` output on each
object store's emulator (the ``cloud`` fixture: S3, GCS, Azure), killed (SIGKILL of the driver
at crash points) and resumed at another parallelism each time, writes every window exactly
once; then ``sparkbeam checkpoints verify`` and ``startpoints`` work on its URL. On S3 it is
killed mid-round and after a commit; on GCS and Azure after a commit only: the kill whose
resume renames the published files, the store-specific part (a copy and a delete on both).

The driver runs with no cloud's environment: Beam's flags (``--s3_*``,
``--azure_connection_string``) reach every task; GCS has no endpoint flag, so there the
environment (``STORAGE_EMULATOR_HOST``) does. (The batch SDF pipeline on S3 is in
``tests/io/test_write_to_files_s3.py``.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid

import pytest

from sparkbeam.runner.cli import main as sparkbeam
from tests.conftest import TEST_MASTER, checkpoint_ids
from tests.servers import env_reaching, point_beam_at
from tests.streaming.streaming_pipelines import expected_lines

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCES = [("a", 60), ("b", 40)]  # 7 rounds of 10 records per source
KILLS = {  # (parallelism, crash point) of each killed run; the resume runs at 3
    "s3": ((2, "mid-round:2"), (1, "after-commit:4")),
    "gcs": ((2, "after-commit:4"),),
    "azure": ((2, "after-commit:4"),),
}


def _run(cloud, run: str, parallelism: int, crash_at: str = "") -> subprocess.CompletedProcess:
    """The job of ``tests.streaming.streaming_pipelines`` in a driver of its own."""
    env = env_reaching(cloud, dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable))
    env.pop("SPARKBEAM_CRASH_AT", None)
    if crash_at:
        env["SPARKBEAM_CRASH_AT"] = crash_at
    cmd = [
        sys.executable, "-m", "tests.streaming.streaming_pipelines",
        "--output", cloud.url(run, "out"), "--checkpoint_dir", cloud.url(run, "ckpt"),
        "--sources", ",".join(f"{n}:{c}" for n, c in SOURCES), "--per_round", "10",
        "--runner=SparkCheckpointRunner", f"--spark_master_url={TEST_MASTER}", "--streaming",
        "--checkpoint_interval_s", "0.05", f"--parallelism={parallelism}", *cloud.pipeline_flags(),
    ]  # fmt: skip
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _cli(capsys, *args: str) -> str:
    """``sparkbeam ...`` in this process (its Beam filesystems set from the flags); its stdout."""
    capsys.readouterr()
    code = sparkbeam(list(args))
    out, err = capsys.readouterr()
    assert code == 0, err[-2000:]
    return out


def test_a_killed_and_rescaled_job_writes_each_window_once(cloud, request, capsys):
    point_beam_at(cloud)  # for checkpoint_ids here
    run = f"stream-{uuid.uuid4().hex[:8]}"
    ckpt = cloud.url(run, "ckpt")
    written = f"{run}/out/out"  # WriteToFilesOnCheckpoint's files: <output>/out-...
    expected = expected_lines(SOURCES)
    ids: list[int] = []
    for parallelism, crash_at in KILLS[request.node.callspec.params["cloud"]]:
        killed = _run(cloud, run, parallelism, crash_at)
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
        assert sorted(cloud.lines(written).elements()) != expected  # it really was cut short
        now = checkpoint_ids(ckpt)
        assert now and max(now) > max(ids, default=0), "the run committed nothing"
        ids = now
    resumed = _run(cloud, run, 3)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert sorted(cloud.lines(written).elements()) == expected
    assert not cloud.keys(f"{run}/out/.sparkbeam-staging/")  # the killed rounds' files are gone
    after = checkpoint_ids(ckpt)
    assert max(after) > max(ids)  # the chain went on

    flags = [f"--checkpoint_dir={ckpt}", *cloud.pipeline_flags()]
    assert _cli(capsys, "checkpoints", "verify", *flags).count(" ok") == len(after)
    _cli(capsys, "startpoints", "set", *flags, "--pipeline=pipeline-0",
         "--transform=Read", "--kind=oldest")  # fmt: skip
    listed = json.loads(_cli(capsys, "startpoints", "list", *flags, "--json"))
    assert [(s["pipeline_id"], s["source"], s["kind"]) for s in listed] == [
        ("pipeline-0", "Read", "oldest")
    ]

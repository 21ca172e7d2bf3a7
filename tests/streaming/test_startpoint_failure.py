"""A startpoint whose application raises: reported once, named, never retried, then deleted.

The source's provider refuses timestamp startpoints in its ``restriction_for_startpoint`` hook.
Run 1 fails at once (no restore), naming the startpoint and the command that deletes it; the
store marks it failed, so run 2 is refused before anything runs; after the operator runs that
exact command with the real ``sparkbeam`` CLI, run 3 reads everything exactly once.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
import sys
import time

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState

from sparkbeam.checkpoint import open_store
from sparkbeam.io import WriteToFilesOnCheckpoint
from sparkbeam.runner.cli import main as cli
from sparkbeam.sdf.startpoints.errors import StartpointFailedError
from tests.conftest import spark_test_options
from tests.streaming.tail_source import (
    PIPELINE,
    SOURCE,
    TailFiles,
    TailProvider,
    positions,
    visible,
    write,
)

pytestmark = pytest.mark.spark

TIMEOUT_S = 90.0


class NoTimestamps(TailProvider):
    """A log source whose positions carry no time: its hook raises for a timestamp."""

    def restriction_for_startpoint(self, path, restriction, startpoint):
        raise LookupError(f"no record index by time for {startpoint.position}")


class TailNoTimestamps(TailFiles):
    def process(self, path, tracker=beam.DoFn.RestrictionParam(NoTimestamps())):
        yield from super().process(path, tracker)


def start(ckpt: str, data: str, out: str):
    options = PipelineOptions(
        spark_test_options(
            "--streaming",
            f"--checkpoint_dir={ckpt}",
            "--checkpoint_interval_s=0.05",
            "--parallelism=2",
        )  # fmt: skip
    )
    p = beam.Pipeline(options=options)
    paths = [os.path.join(data, "a")]
    _ = (
        p
        | "Partitions" >> beam.Create(paths)
        | SOURCE >> beam.ParDo(TailNoTimestamps())
        | WriteToFilesOnCheckpoint(out + "/out")
    )
    return p.run()


@pytest.mark.slow
def test_failed_startpoint_fails_once_is_refused_at_start_and_deleting_it_recovers(
    spark, tmp_path, caplog
):
    ckpt, data = str(tmp_path / "ckpt"), str(tmp_path / "data")
    write(data, "a", 5, stop=5)
    set_cmd = ["startpoints", "set", "--checkpoint_dir", ckpt, "--pipeline", PIPELINE]
    assert cli([*set_cmd, "--transform", SOURCE, "--kind", "timestamp", "--value", "1000"]) == 0
    # Run 1: the task's hook raises; the run fails without restoring its checkpoint.
    caplog.set_level(logging.WARNING, logger="sparkbeam")
    run = start(ckpt, data, str(tmp_path / "out1"))
    with pytest.raises(StartpointFailedError) as failed:
        run.wait_until_finish(TIMEOUT_S * 1000)
    first = str(failed.value).splitlines()[0]
    assert first.startswith(
        f"Startpoint timestamp 1000 for transform {SOURCE!r} in pipeline {PIPELINE!r} failed "
        "to apply to element 'a': LookupError: no record index by time for 1000."
    ), first
    delete = f"sparkbeam startpoints delete --checkpoint_dir {ckpt} --pipeline {PIPELINE} "
    assert f"`{delete}--transform {SOURCE}`" in first
    assert "token" not in first
    assert not [r for r in caplog.records if "; restoring " in r.getMessage()]  # loop.py's
    with open_store(ckpt, read_only=True) as store:
        (sp,) = store.startpoints.list()
    assert sp.failed == first
    # `startpoints list` shows the failure.
    listed = subprocess.run(
        [_sparkbeam(), "startpoints", "list", "--checkpoint_dir", ckpt],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "failed to apply" in listed.stdout
    # Run 2: refused before Spark is touched, with the same first line; no round runs.
    began = time.monotonic()
    with pytest.raises(StartpointFailedError) as refused:
        start(ckpt, data, str(tmp_path / "out2"))
    print(f"run 2 refused in {time.monotonic() - began:.2f} s")
    assert str(refused.value).startswith(first)
    assert "previous run failed on it" in str(refused.value)
    assert not (tmp_path / "out2").exists()
    # The operator runs the command the message names, with the real CLI.
    command = re.search(r"`(sparkbeam startpoints delete [^`]*)`", first).group(1)
    argv = shlex.split(command)
    done = subprocess.run([_sparkbeam(), *argv[1:]], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    # Run 3: no startpoint; reads all five records exactly once.
    run = start(ckpt, data, str(tmp_path / "out3"))
    assert run.wait_until_finish(TIMEOUT_S * 1000) == PipelineState.DONE
    assert visible(str(tmp_path / "out3")) == positions("a", 0, 5)


def _sparkbeam() -> str:
    return os.path.join(os.path.dirname(sys.executable), "sparkbeam")

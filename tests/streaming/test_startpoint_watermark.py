"""A startpoint rewind of an SDF with a ``ManualWatermarkEstimator`` replays and continues.

The restored watermark-estimator state is past the position the startpoint rewinds to; the
applier resets it through the DoFn's watermark-estimator provider (or the restriction
provider's ``estimator_state_for_startpoint`` hook), so the estimator is not asked to move
its watermark back -- which it refuses, failing every restart.
"""

from __future__ import annotations

import time

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState

from sparkbeam.io import WriteToFilesOnCheckpoint
from sparkbeam.runner.cli import main as cli
from tests.conftest import spark_test_options
from tests.streaming.streaming_pipelines import EventTimeOffsets
from tests.streaming.tail_source import positions, visible

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TOTAL = 40
TIMEOUT_S = 600.0  # generous: the machine may be busy


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _start(tmp_path, run: int):
    options = PipelineOptions(
        spark_test_options(
            "--streaming",
            f"--checkpoint_dir={tmp_path / 'ckpt'}",
            "--checkpoint_interval_s=0.05",
            "--parallelism=2",
        )  # fmt: skip
    )
    p = beam.Pipeline(options=options)
    _ = (
        p
        | beam.Create([("a", TOTAL)])
        | "Read" >> beam.ParDo(EventTimeOffsets(per_round=5, delay_s=0.3))
        | beam.MapTuple(lambda name, pos: f"{name} {pos}")
        | WriteToFilesOnCheckpoint(str(tmp_path / f"out{run}" / "out"))
    )
    return p.run()


def test_offset_rewind_resets_a_manual_watermark_and_replays(spark, tmp_path):
    run = _start(tmp_path, 1)
    wait_for(lambda: sum(visible(str(tmp_path / "out1")).values()) >= 15, "run 1 to read 15")
    assert run.cancel() == PipelineState.CANCELLED
    assert sum(visible(str(tmp_path / "out1")).values()) < TOTAL  # stopped before the end
    args = ["--checkpoint_dir", str(tmp_path / "ckpt"), "--pipeline", "pipeline-0"]
    assert cli(["startpoints", "set", *args, "--transform", "Read", "--kind", "offset",
                "--value", "5"]) == 0  # fmt: skip
    run = _start(tmp_path, 2)
    assert run.wait_until_finish(TIMEOUT_S * 1000) == PipelineState.DONE
    assert visible(str(tmp_path / "out2")) == positions("a", 5, TOTAL)

"""Batch with --checkpoint_dir: a per-element startpoint whose application raises.

The run fails at once naming the startpoint, its element key and the delete command (with
``--key``); the store marks it failed, so the next run is refused before Spark runs anything.
"""

from __future__ import annotations

import os

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.checkpoint import open_store
from sparkbeam.runner.cli import main as cli
from sparkbeam.sdf.startpoints.errors import StartpointFailedError
from tests.conftest import spark_test_options
from tests.streaming.tail_source import PIPELINE, SOURCE, write
from tests.streaming.test_startpoint_failure import TailNoTimestamps

pytestmark = pytest.mark.spark


def _run(ckpt: str, data: str) -> None:
    options = PipelineOptions(spark_test_options(f"--checkpoint_dir={ckpt}", "--parallelism=2"))
    with beam.Pipeline(options=options) as p:
        paths = [os.path.join(data, name) for name in "ab"]
        _ = p | beam.Create(paths) | SOURCE >> beam.ParDo(TailNoTimestamps())


@pytest.mark.slow
def test_failed_per_element_startpoint_names_its_key_and_is_refused_next_time(spark, tmp_path):
    ckpt, data = str(tmp_path / "ckpt"), str(tmp_path / "data")
    write(data, "a", 3, stop=3)
    write(data, "b", 3, stop=3)
    cmd = ["startpoints", "set", "--checkpoint_dir", ckpt, "--pipeline", PIPELINE]
    args = ["--transform", SOURCE, "--key", "b", "--kind", "timestamp", "--value", "7"]
    assert cli([*cmd, *args]) == 0
    with pytest.raises(StartpointFailedError) as failed:
        _run(ckpt, data)
    first = str(failed.value).splitlines()[0]
    assert first.startswith(
        f"Startpoint timestamp 7 for element 'b' of transform {SOURCE!r} in pipeline "
        f"{PIPELINE!r} failed to apply to element 'b': LookupError:"
    ), first
    assert (
        f"`sparkbeam startpoints delete --checkpoint_dir {ckpt} --pipeline {PIPELINE} "
        f"--transform {SOURCE} --key b`" in first
    )
    with open_store(ckpt, read_only=True) as store:
        (sp,) = store.startpoints.list()
    assert sp.element_key_text == "b" and sp.failed == first
    with pytest.raises(StartpointFailedError, match="previous run failed on it") as refused:
        _run(ckpt, data)
    assert str(refused.value).startswith(first)

"""Startpoints in batch runs with --checkpoint_dir: applied at start, kept where no data, errors.

Real Spark (the shared session), a real store in a temp directory, the file-tailing offset SDF
of ``tests.streaming.tail_source`` (its positions are the output), the operator's CLI.
"""

from __future__ import annotations

import logging
import time

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from sparkbeam.checkpoint import Startpoint, StartpointKind, open_store
from sparkbeam.runner.cli import main as cli
from sparkbeam.runner.options import SparkStreamingOptions
from sparkbeam.sdf.startpoints.session import (
    StartpointError,
    UnknownStartpointTransformError,
    UnsupportedStartpointError,
)
from tests.conftest import spark_test_options
from tests.streaming.tail_source import PIPELINE, SOURCE, tail, write

pytestmark = pytest.mark.spark


def _run(tmp_path, partitions, expected, *extra):
    options = PipelineOptions(
        spark_test_options(f"--checkpoint_dir={tmp_path / 'ckpt'}", "--parallelism=2", *extra)
    )
    with beam.Pipeline(options=options) as p:
        assert_that(tail(p, str(tmp_path / "data"), partitions), equal_to(expected))


def _set(tmp_path, *args):
    ckpt = str(tmp_path / "ckpt")
    cmd = ["startpoints", "set", "--checkpoint_dir", ckpt, "--pipeline", PIPELINE, *args]
    assert cli(cmd) == 0


def _pending(tmp_path):
    with open_store(str(tmp_path / "ckpt"), read_only=True) as store:
        return [(s.element_key_text, s.kind.value, s.position) for s in store.startpoints.list()]


@pytest.mark.slow  # two batch runs
def test_offset_fans_out_keeps_it_where_no_data_and_never_reapplies(spark, tmp_path):
    data = str(tmp_path / "data")
    write(data, "a", 6, stop=6)
    write(data, "b", 3, stop=3)
    _set(tmp_path, "--transform", SOURCE, "--kind", "offset", "--value", "4")
    # a starts at 4; b has no data at 4 yet: it reads everything and keeps its own copy.
    _run(tmp_path, "ab", ["a 4", "a 5", "b 0", "b 1", "b 2"])
    assert _pending(tmp_path) == [("b", "offset", "4")]
    # b's log grows past 4: the next run applies b's copy; a is not rewound again. The first
    # run finished, so running the job again from the beginning takes --fresh.
    write(data, "b", 6, stop=6)
    _run(tmp_path, "ab", [f"a {i}" for i in range(6)] + ["b 4", "b 5"], "--fresh")
    assert _pending(tmp_path) == []


@pytest.mark.parametrize(
    "args, error, match",
    [
        (
            ("--transform", "ReadTypo", "--kind", "oldest"),
            UnknownStartpointTransformError,
            r"transform 'ReadTypo' in pipeline 'pipeline-0'.*Known transforms: 'ReadTail'",
        ),
        (
            ("--transform", SOURCE, "--kind", "timestamp", "--value", "1700000000000"),
            UnsupportedStartpointError,
            r"kind 'timestamp' for transform 'ReadTail' cannot be applied.*restriction_for_",
        ),
    ],
)
def test_bad_startpoints_fail_the_start_naming_what_is_wrong(spark, tmp_path, args, error, match):
    write(str(tmp_path / "data"), "a", 1, stop=1)
    _set(tmp_path, *args)
    with pytest.raises(error, match=match):
        _run(tmp_path, "a", ["a 0"])
    assert len(_pending(tmp_path)) == 1  # nothing deleted: the operator fixes it


def test_offset_the_cli_would_refuse_still_fails_the_start_when_set_through_the_api(
    spark, tmp_path
):
    """``startpoints set`` refuses 'ten' at once; the API lets a source's own format through,
    so the start still checks it, names it, and keeps it for the operator."""
    write(str(tmp_path / "data"), "a", 1, stop=1)
    with open_store(str(tmp_path / "ckpt")) as store:
        store.startpoints.set(PIPELINE, SOURCE, "offset", "ten")
    with pytest.raises(StartpointError, match=r"position 'ten', which is not an integer offset"):
        _run(tmp_path, "a", ["a 0"])
    assert len(_pending(tmp_path)) == 1


def test_unknown_pipeline_fails_the_start(spark, tmp_path):
    write(str(tmp_path / "data"), "a", 1, stop=1)
    with open_store(str(tmp_path / "ckpt")) as store:
        store.startpoints.set("pipeline-7", SOURCE, "oldest")
    with pytest.raises(StartpointError, match=r"pipeline 'pipeline-7'.*its pipelines: 'pipel"):
        _run(tmp_path, "a", ["a 0"])


def test_old_startpoints_are_reported_not_dropped(spark, tmp_path, caplog):
    write(str(tmp_path / "data"), "a", 2, stop=2)
    old = Startpoint(PIPELINE, SOURCE, StartpointKind.OFFSET, "9", b"a", time.time() - 7200)
    with open_store(str(tmp_path / "ckpt")) as store:
        store.startpoints.update(PIPELINE, add=[old])
    with caplog.at_level(logging.WARNING, logger="sparkbeam.sdf.startpoints.session"):
        _run(tmp_path, "a", ["a 0", "a 1"], "--startpoint_max_age_s=3600")
    assert "key 'a' of pipeline 'pipeline-0' was set 2.0 h ago and is still pending" in caplog.text
    assert _pending(tmp_path) == [("a", "offset", "9")]  # reported, and still there


def test_max_age_option_parses_with_a_default_of_seven_days():
    assert PipelineOptions([]).view_as(SparkStreamingOptions).startpoint_max_age_s == 604800.0
    parsed = PipelineOptions(["--startpoint_max_age_s=60"]).view_as(SparkStreamingOptions)
    assert parsed.startpoint_max_age_s == 60.0

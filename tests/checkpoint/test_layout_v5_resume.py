"""A store of state layout 5 resumes under layout 6: its SDF residuals become task-owned.

Layout 5 kept SDF residuals (``sdf-residual/<stage>``) in the driver's own files -- its
materialization and changelog -- while its manifests' ``task_state`` named only GroupByKey
buffers, user state and timers. Layout 6 has each SDF task keep the residuals of its key
groups, so restoring a layout-5 checkpoint moves the residuals out of the driver's files into
task-owned snapshot ranges (``state_layout.task_owned_since``, ``PipelineStore._migrate``),
and the stage's tasks feed them from there; a residual lost or fed twice in that move shows
as a missing or doubled output line.

``tests/fixtures/layout_v5_store`` is ``tests.fixtures.layout_pipeline`` as the code of layout
5 (commit 51a90d3) wrote it, killed after the commit of round 3 with a residual still pending
(``tests/fixtures/make_layout_v5_store.sh``); ``layout_v5_output`` is its output directory at
that moment (round 3's sink files still staged). The store names staged files by absolute
path, so the output goes back where the killed run wrote it.
"""

from __future__ import annotations

import os
import shutil

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.checkpoint import state_layout as sl
from tests.conftest import spark_test_options
from tests.fixtures.layout_pipeline import build, expected_lines, manifests, output_lines

pytestmark = [pytest.mark.spark, pytest.mark.slow]

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures")
OUTPUT = "/tmp/sparkbeam-layout-v5-fixture"  # where make_layout_v5_store.sh wrote it
RESIDUALS = sl.sdf_residual("stage-2")  # the fixture's SDF stage ("Read"), in its driver files


def _task_owned(manifest) -> set[str]:
    return set(manifest.task_state.namespaces)


def test_a_layout_5_store_moves_its_residuals_to_tasks_and_publishes_each_line_once(
    spark, tmp_path
):
    url = str(tmp_path / "ckpt")
    shutil.copytree(os.path.join(FIXTURES, "layout_v5_store"), url)
    before = manifests(url)
    assert [m.metadata[sl.LAYOUT_KEY] for m in before] == [5, 5, 5]
    last = before[-1]
    assert last.metadata["round"] == 3
    assert last.task_state is not None  # GroupByKey buffers, user state: task-owned already
    assert not any(ns.startswith(sl.SDF_RESIDUAL_PREFIX) for ns in _task_owned(last))
    assert last.metadata["pending_residuals"] > 0  # ... residuals pending, in driver files
    shutil.rmtree(OUTPUT, ignore_errors=True)
    shutil.copytree(os.path.join(FIXTURES, "layout_v5_output"), OUTPUT)
    try:
        # The first windows are published; round 3's files are still staged.
        assert len(output_lines(OUTPUT)) == 4
        options = spark_test_options(
            "--streaming",
            f"--checkpoint_dir={url}",
            "--checkpoint_interval_s=0.05",
            "--parallelism=2",
        )
        with beam.Pipeline(options=PipelineOptions(options)) as p:
            build(p, OUTPUT)
        assert output_lines(OUTPUT) == expected_lines()  # nothing lost, nothing published twice
    finally:
        shutil.rmtree(OUTPUT, ignore_errors=True)
    after = [m for m in manifests(url) if m.checkpoint_id > last.checkpoint_id]
    assert after and all(m.metadata[sl.LAYOUT_KEY] == sl.LAYOUT_VERSION for m in after)
    assert after[0].metadata["round"] == 4  # resumed after round 3, not run from the start
    # The restored residuals are task-owned from the first resumed checkpoint on ...
    assert RESIDUALS in _task_owned(after[0])
    assert all(RESIDUALS in _task_owned(m) for m in after if m.metadata["pending_residuals"])
    # ... and every one of them was fed: the run ends with none pending.
    assert after[-1].metadata["pending_residuals"] == 0

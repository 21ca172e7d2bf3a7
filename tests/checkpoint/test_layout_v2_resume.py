"""A store of state layout 2 resumes under the current layout, and its next checkpoints are
of the current layout.

``tests/fixtures/layout_v2_store`` is ``tests.fixtures.layout_pipeline`` (``--side_input``) as
the code of layout 2 wrote it -- side-input chunks, pending sink files and the staging
directory stored raw -- killed after the commit of round 3 and before that round's files were
published (``tests/fixtures/make_layout_v2_store.sh``); ``layout_v2_output`` is its output
directory at that moment. The store names staged files by absolute path, so the output goes
back where the killed run wrote it.
"""

from __future__ import annotations

import os
import shutil

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.checkpoint import open_store
from sparkbeam.checkpoint import state_layout as sl
from tests.conftest import spark_test_options
from tests.fixtures.layout_pipeline import build, expected_lines, manifests, output_lines

pytestmark = [pytest.mark.spark, pytest.mark.slow]

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures")
OUTPUT = "/tmp/sparkbeam-layout-v2-fixture"  # where make_layout_v2_store.sh wrote it
PIPELINE = "pipeline-0"


def _raw_before_3_values(url: str) -> dict:
    with open_store(url, break_lock=True) as store:
        state = store.pipeline(PIPELINE)
        state.restore()
        values = {}
        for ns, key, value in state.items():
            if ns.startswith(sl.RAW_BEFORE_3):
                values.setdefault(ns.split("/")[0], []).append((key, value))
        state.close()
        return values


def _kept_side_input(url: str) -> list[bytes]:
    with open_store(url, break_lock=True) as store:
        state = store.pipeline(PIPELINE)
        state.restore()
        (namespace,) = [ns for ns in state.task_owned() if ns.startswith(sl.SIDE_ROWS_PREFIX)]
        values = list(state.read_task_owned(namespace).values())
        state.close()
        return values


def test_a_layout_2_store_resumes_and_publishes_each_line_once(spark, tmp_path):
    url = str(tmp_path / "ckpt")
    shutil.copytree(os.path.join(FIXTURES, "layout_v2_store"), url)
    before = manifests(url)
    assert [m.metadata[sl.LAYOUT_KEY] for m in before] == [2, 2, 2]
    assert {"side-input", "sink-pending", "sink-staging-dirs"} <= set(_raw_before_3_values(url))
    shutil.rmtree(OUTPUT, ignore_errors=True)
    shutil.copytree(os.path.join(FIXTURES, "layout_v2_output"), OUTPUT)
    try:
        assert len(output_lines(OUTPUT)) == 4  # rounds 1-2 published; round 3's files still staged
        options = spark_test_options(
            "--streaming", f"--checkpoint_dir={url}", "--checkpoint_interval_s=0.05"
        )
        with beam.Pipeline(options=PipelineOptions(options)) as p:
            build(p, OUTPUT, side_input=True)
        assert output_lines(OUTPUT) == expected_lines()  # nothing lost, nothing published twice
    finally:
        shutil.rmtree(OUTPUT, ignore_errors=True)
    after = [m for m in manifests(url) if m.checkpoint_id > before[-1].checkpoint_id]
    assert after and all(m.metadata[sl.LAYOUT_KEY] == sl.LAYOUT_VERSION for m in after)
    assert after[0].metadata["round"] == 4  # resumed after round 3, not run from the start
    values = _raw_before_3_values(url)
    assert "side-input" not in values  # the side input restored from layout 2, upgraded, ...
    kept = _kept_side_input(url)
    assert [sl.decode_side_row(v, sl.SIDE_ROWS_PREFIX)[1] for v in kept]  # ... is kept by tasks
    for key, value in values.get("sink-staging-dirs", []):
        assert sl.decode_staging_dir(key, value).endswith(".sparkbeam-staging")

"""A streaming store holds no pickle (a store of an older layout is refused:
``tests/checkpoint/test_old_layouts_refused.py``).

The pipeline (``tests.fixtures.layout_pipeline``) has an SDF that defers residuals, a
windowed GroupByKey and a stateful DoFn with a bag state and an event-time timer; its store
is scanned file by file. ``tests/fixtures/layout_v1_store`` is that pipeline's store as the
code before ``sparkbeam.checkpoint.state_layout`` wrote it (killed after round 3).
"""

from __future__ import annotations

import glob
import os

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from tests.conftest import spark_test_options
from tests.fixtures.layout_pipeline import build, expected_lines

pytestmark = [pytest.mark.spark, pytest.mark.slow]

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "layout_v1_store")
# Pickle protocol 4 and 5 headers (PROTO + FRAME, what pickle.dumps and cloudpickle write),
# and the module names pickles of classes and functions carry.
PICKLE_MARKERS = [b"\x80\x04\x95", b"\x80\x05\x95", b"cloudpickle", b"copyreg", b"builtins\x94"]


def _run(checkpoint_dir, output, coded: bool = False) -> None:
    options = PipelineOptions(
        spark_test_options(
            "--streaming", f"--checkpoint_dir={checkpoint_dir}", "--checkpoint_interval_s=0.05"
        )
    )
    with beam.Pipeline(options=options) as p:
        build(p, str(output), coded)


def _lines(output) -> list[str]:
    lines = []
    for path in glob.glob(str(output / "out-*")):
        with open(path) as f:
            lines.extend(line.rstrip("\n") for line in f if line.strip())
    return sorted(lines)


def test_no_store_file_of_a_streaming_run_holds_pickle(spark, tmp_path):
    """Residuals, GroupByKey buffers, user state and timers: no pickle anywhere.

    The SDF's restriction and watermark state have real coders: Beam's default coder for
    them would pickle them inside the (Beam-encoded) residual element, which the store
    keeps as the SDK encoded it.
    """
    _run(tmp_path / "ckpt", tmp_path / "out", coded=True)
    assert _lines(tmp_path / "out") == expected_lines()
    files = [p for p in glob.glob(str(tmp_path / "ckpt" / "**"), recursive=True)]
    files = [p for p in files if os.path.isfile(p)]
    assert any("/changelog/" in p or "/materializations/" in p for p in files), files
    seen = b""
    for path in files:
        with open(path, "rb") as f:
            data = f.read()
        seen += data
        found = [m for m in PICKLE_MARKERS if m in data]
        assert not found, f"{path} holds pickle markers {found}"
    for namespace in (b"sdf-residual/", b"gbk/", b"user-state/", b"user-timers/"):
        assert namespace in seen  # the scan saw each kind of state the run kept


def test_the_scan_sees_pickle_in_the_old_layout_store():
    """The markers are real: the pre-layout fixture pickled GroupByKey and user state."""
    files = glob.glob(os.path.join(FIXTURE, "**", "*.*"), recursive=True)
    blobs = b"".join(open(p, "rb").read() for p in files if os.path.isfile(p))
    assert b"\x80\x04\x95" in blobs

"""A splittable DoFn with side inputs runs, with FnApiRunner's output (issue 43, defect 5).

Beam's ``expand_sdf`` gives the Reshuffle before an SDF's process stage the SDF's side inputs
too; the stage after that fusion break reads them. Its DoFn defers after every few positions,
so each element takes several rounds: the re-fed residuals read the side inputs again, in
batch (with and without a store), in streaming, and after a kill and a restore.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import FixedWindows, TimestampedValue

from sparkbeam.sdf.testing.run import committed_rounds
from tests.conftest import spark_test_options
from tests.sdf import resumable_pipeline
from tests.sdf.resumable_pipeline import SIDE_INPUTS, side_input_lines
from tests.sdf.sdfs import OffsetBySide

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ELEMENTS = [("a", 5), ("b", 3)]  # 3 and 2 calls of 2 positions: rounds 0-2

_COLLECTED: list[str] = []  # FnApiRunner runs in this process; its DoFns are copies


def _collect(line: str) -> None:
    _COLLECTED.append(line)


def _fn_api_output(elements, per_call: int) -> list[str]:
    _COLLECTED.clear()
    with beam.Pipeline(runner=FnApiRunner()) as p:
        _ = side_input_lines(p, elements, per_call, delay_s=0.0) | beam.Map(_collect)
    return sorted(_COLLECTED)


@pytest.fixture
def expected() -> list[str]:
    lines = _fn_api_output(ELEMENTS, per_call=2)  # in-process, well under a second
    assert lines == sorted(f"{n},{100 + i},3000" for n, size in ELEMENTS for i in range(size))
    return lines


@pytest.mark.parametrize("mode", ["batch", "batch-store", "streaming"])
def test_sdf_reads_its_side_inputs_in_every_round(spark, tmp_path, expected, mode):
    ckpt = tmp_path / "ckpt"
    flags = {
        "batch": [],
        "batch-store": [f"--checkpoint_dir={ckpt}"],
        "streaming": ["--streaming", f"--checkpoint_dir={ckpt}", "--checkpoint_interval_s=0.05"],
    }[mode]
    with beam.Pipeline(options=PipelineOptions(spark_test_options(*flags))) as p:
        lines = side_input_lines(p, ELEMENTS, per_call=2, delay_s=0.1)
        assert_that(lines, equal_to(expected))
    if mode != "batch":  # the residuals were re-fed in later rounds, each committed
        assert max(m.get("round", -1) for m in committed_rounds(str(ckpt))) >= 2


def _windowed(p, label: str, rows):
    """``rows`` of (value, event time in s) in 10 s fixed windows."""
    return (
        p
        | label >> beam.Create(rows)
        | f"{label}Times" >> beam.MapTuple(TimestampedValue)
        | f"{label}Windows" >> beam.WindowInto(FixedWindows(10))
    )


def _windowed_lines(p):
    """Each element reads its own window's side values, also in the rounds after the source's
    watermark passed that window's end (the residuals hold only the SDF's output)."""
    base = _windowed(p, "Base", [(100, 1), (200, 12)])
    extra = _windowed(p, "Extra", [(1000, 2), (2000, 3), (5000, 15)])
    main = _windowed(p, "Main", [(ELEMENTS[0], 4), (ELEMENTS[1], 14)])
    sdf = OffsetBySide(per_call=2, delay_s=0.1)
    return main | beam.ParDo(sdf, beam.pvalue.AsSingleton(base), beam.pvalue.AsList(extra))


def test_streaming_sdf_reads_its_windows_side_inputs_in_every_round(spark, tmp_path):
    _COLLECTED.clear()
    with beam.Pipeline(runner=FnApiRunner()) as p:
        _ = _windowed_lines(p) | beam.Map(_collect)
    expected = sorted(_COLLECTED)
    assert expected == sorted(
        [f"a,{100 + i},3000" for i in range(5)] + [f"b,{200 + i},5000" for i in range(3)]
    )
    ckpt = tmp_path / "ckpt"
    flags = ["--streaming", f"--checkpoint_dir={ckpt}", "--checkpoint_interval_s=0.05"]
    with beam.Pipeline(options=PipelineOptions(spark_test_options(*flags))) as p:
        assert_that(_windowed_lines(p), equal_to(expected))
    assert max(m.get("round", -1) for m in committed_rounds(str(ckpt))) >= 2


def test_killed_sdf_with_side_inputs_resumes_them_exactly(spark, tmp_path, caplog):
    """The driver is killed after round 1's checkpoint, residuals pending; the rerun (on this
    process's session) reruns the side inputs' producers, not the SDF's round 0."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "out.txt"
    flags = [f"--checkpoint_dir={ckpt}", SIDE_INPUTS]
    killed = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "sdf" / "resumable_pipeline.py"), str(out), *flags],
        env={**os.environ, "PYTHONPATH": str(ROOT), "SPARKBEAM_CRASH_AT": "after-commit:1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert killed.returncode == -9, killed.stderr[-4000:]
    rounds = committed_rounds(str(ckpt))
    assert rounds[-1]["round"] == 1 and rounds[-1]["pending_residuals"] > 0
    assert not out.exists()

    with caplog.at_level(logging.INFO, logger="sparkbeam.progress"):
        resumable_pipeline.main(str(out), flags)
    assert "resumed 1 stage(s) from their checkpoint" in caplog.text
    sizes = resumable_pipeline.ELEMENTS
    assert sorted(out.read_text().split()) == _fn_api_output(sizes, per_call=3)
    numbers = [m["round"] for m in committed_rounds(str(ckpt)) if "round" in m]
    assert numbers == sorted(set(numbers)) and numbers[-1] > 1  # no round ran twice

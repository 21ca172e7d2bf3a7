"""WriteToFilesOnCheckpoint on a real Spark and on DirectRunner: every element exactly once."""

from __future__ import annotations

import gzip
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.io import WriteToFilesOnCheckpoint
from sparkbeam.runner.rounds.sink_files import STAGING_DIR
from tests.conftest import spark_test_options

HERE = Path(__file__).parent
FINAL_NAME = re.compile(r"out-\d{8}-stage-\d+-\d{5}-\d{5}\.txt")


def _lines(directory: Path, pattern: str = "out-*") -> Counter:
    lines: Counter = Counter()
    for path in directory.glob(pattern):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            lines.update(f.read().splitlines())
    return lines


def _staged(directory: Path) -> list[str]:
    staging = directory / STAGING_DIR
    return sorted(p.name for p in staging.iterdir()) if staging.exists() else []


@pytest.mark.spark
def test_spark_pipeline_writes_each_element_once(spark, tmp_path):
    words = [f"w{i % 37}" for i in range(500)]
    with beam.Pipeline(options=PipelineOptions(spark_test_options("--parallelism=2"))) as p:
        (
            p
            | beam.Create(words)
            | beam.Map(lambda w: (w, 1))
            | beam.CombinePerKey(sum)
            | WriteToFilesOnCheckpoint(
                str(tmp_path / "out"), ".txt", format_fn="{0[0]}:{0[1]}".format
            )
        )
        (
            p
            | "Raw" >> beam.Create(words)
            | "WriteRaw" >> WriteToFilesOnCheckpoint(str(tmp_path / "raw"), ".gz")
        )
    counts = Counter(words)
    assert _lines(tmp_path) == Counter(f"{w}:{n}" for w, n in counts.items())
    assert _lines(tmp_path, "raw-*") == counts
    names = [p.name for p in tmp_path.glob("out-*")]
    assert names and all(FINAL_NAME.fullmatch(n) for n in names), names
    assert _staged(tmp_path) == []


@pytest.mark.spark
def test_sink_in_a_checkpointed_sdf_stage(spark, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("".join(f"line {i}\n" for i in range(300)))
    out = tmp_path / "out"
    out.mkdir()
    options = spark_test_options(f"--checkpoint_dir={tmp_path / 'ckpt'}")
    with beam.Pipeline(options=PipelineOptions(options)) as p:
        p | beam.io.ReadFromText(str(src)) | WriteToFilesOnCheckpoint(str(out / "out"), ".txt")
    assert _lines(out) == Counter(f"line {i}" for i in range(300))
    assert _staged(out) == []


def test_direct_runner_writes_visible_files(tmp_path):
    with beam.Pipeline("DirectRunner") as p:
        p | beam.Create(range(20)) | WriteToFilesOnCheckpoint(str(tmp_path / "out"), format_fn=str)
    assert _lines(tmp_path) == Counter(str(i) for i in range(20))
    assert _staged(tmp_path) == []


@pytest.mark.spark
@pytest.mark.slow
def test_retried_task_attempt_is_never_finalized(tmp_path):
    # local[2,2]: Spark retries a failed task once (the shared session does not retry).
    proc = subprocess.run(
        [sys.executable, str(HERE / "sink_pipeline.py"), "local[2,2]", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert len(list(tmp_path.glob("failed-attempt-*"))) == 2  # each task's attempt 0 did fail
    assert _lines(tmp_path) == Counter(str(i) for i in range(100))
    assert _staged(tmp_path) == []  # the failed attempts' staged files were discarded


def test_non_str_element_without_format_fn_says_what_to_do(tmp_path):
    with pytest.raises(Exception, match=r"writes str lines by default; pass format_fn=str"):
        with beam.Pipeline("DirectRunner") as p:
            p | beam.Create([1]) | WriteToFilesOnCheckpoint(str(tmp_path / "out"))


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        ("", r"needs a path prefix such as"),
        ("nosuchscheme://bucket/out", r"'nosuchscheme://bucket/out' is on no filesystem Beam"),
        ("/tmp/some/dir/", r"'/tmp/some/dir/' names a directory; add a file name prefix"),
    ],
)
def test_bad_path_prefix_fails_at_construction(prefix, message):
    with pytest.raises(ValueError, match=message):
        WriteToFilesOnCheckpoint(prefix)


def test_unwritable_directory_names_the_staged_file(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(Exception, match=r"could not write staged file .*Check that the output"):
        with beam.Pipeline("DirectRunner") as p:
            p | beam.Create(["x"]) | WriteToFilesOnCheckpoint(str(blocker / "out"))

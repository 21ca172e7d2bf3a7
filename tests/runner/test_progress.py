"""What an operator reads at the default log level: a fresh start or a resume, progress per
round, a summary at the end — and no Spark warning about an unconfigured FAIR pool, no
Java stack wall for a user error."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import TEST_MASTER

pytestmark = [pytest.mark.spark, pytest.mark.slow]

_P = r"sparkbeam[\w.]*: ?"  # through Beam's root handler, or sparkbeam's own
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _run(args: list[str], crash_at: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable)
    env.pop("SPARKBEAM_CRASH_AT", None)
    if crash_at:
        env["SPARKBEAM_CRASH_AT"] = crash_at
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


def test_streaming_run_says_fresh_then_resumed_with_progress_and_summary(tmp_path):
    app = ["-m", "tests.runner.progress_app", str(tmp_path / "ckpt"), TEST_MASTER]
    first = _run(app, crash_at="after-commit:0")
    assert first.returncode == -9, first.stderr[-3000:]
    assert re.search(_P + r"pipeline-\S+: starting fresh \(no checkpoint in ", first.stderr)

    second = _run(app)
    assert second.returncode == 0, second.stderr[-3000:]
    err = second.stderr
    assert re.search(
        _P + r"resuming pipeline-\S+ from checkpoint \d+ \(round 1 next\), "
        r"0 pending residual\(s\)",
        err,
    ), err[-3000:]
    assert re.search(_P + r"pipeline-\S+: round 1 committed \(checkpoint \d+\); 1 round", err)
    assert re.search(_P + r"pipeline-\S+ finished: \d+ round\(s\), \d+ record\(s\)", err)
    for run in (first, second):
        assert "has not been configured" not in run.stderr  # the FAIR pool is declared
        assert "FairSchedulableBuilder" not in run.stderr


def test_user_error_ends_with_a_short_block_without_java_frames(tmp_path):
    script = tmp_path / "explode.py"
    script.write_text(
        "import apache_beam as beam\n"
        "from apache_beam.options.pipeline_options import PipelineOptions\n"
        "def explode(x):\n"
        "    raise ZeroDivisionError(f'user code failed on {x}')\n"
        "flags = ['--runner=SparkCheckpointRunner', '--spark_master_url=" + TEST_MASTER + "']\n"
        "with beam.Pipeline(options=PipelineOptions(flags)) as p:\n"
        "    _ = p | beam.Create([1, 2]) | 'Explode' >> beam.Map(explode)\n"
    )
    done = _run([str(script)])
    assert done.returncode == 1
    err = done.stderr
    assert not re.search(r"^\s+at (org|java|scala)\.", err, re.M), "Java frames printed"
    assert "Exception in task" not in err and "Lost task" not in err
    assert "Py4JJavaError" not in err
    assert "apache_beam.runners.common" not in err  # Beam's own log of it, once per task
    lines = err.strip().splitlines()
    assert len(lines) < 100, f"{len(lines)} lines"  # was ~1,000
    block = err[err.index("StageFailedError: ") :].splitlines()
    assert block[0].startswith("StageFailedError: Beam stage 'stage-")
    assert "Explode" in block[0]
    assert "  Transform: 'Explode'" in block
    assert "  Error: ZeroDivisionError: user code failed on 1" in block or (
        "  Error: ZeroDivisionError: user code failed on 2" in block
    )
    assert any("explode.py" in ln for ln in block), block
    assert not any("apache_beam" in ln for ln in block), "\n".join(block)
    assert block[-1].startswith("  What to do: fix the code of 'Explode' and rerun")

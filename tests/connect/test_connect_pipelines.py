"""Pipelines over Spark Connect: each driver is a separate process that only has the server's
``sc://`` URL; the server's Python workers get sparkbeam and the user's code as session
artifacts (the ``connect_server`` fixture's workers cannot import sparkbeam otherwise).

One server serves the module: a batch wordcount, a batch SDF that resumes itself after a
delay, and a streaming job killed by SIGKILL after a commit and resumed exactly.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys

import pytest

from tests.streaming.test_recovery import SOURCES, _expected, _visible_lines

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.connect,
]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _driver(args: list[str], crash_at: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("SPARKBEAM_CRASH_AT", None)
    env.pop("SPARK_REMOTE", None)
    if crash_at:
        env["SPARKBEAM_CRASH_AT"] = crash_at
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )


def test_wordcount_over_connect(connect_server, tmp_path):
    text = tmp_path / "in.txt"
    words = [f"w{i % 7}" for i in range(500)]
    text.write_text("\n".join(" ".join(words[i : i + 10]) for i in range(0, 500, 10)) + "\n")
    done = _driver([
        "examples/wordcount.py", "--input", str(text), "--output", str(tmp_path / "counts"),
        "--runner=SparkCheckpointRunner", f"--spark_remote={connect_server.url}",
    ])  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got: dict[str, int] = {}
    for path in tmp_path.glob("counts-*"):
        for line in path.read_text().splitlines():
            word, count = re.fullmatch(r"(\S+): (\d+)", line).groups()
            got[word] = int(count)
    assert got == dict(collections.Counter(words))


def test_sdf_resuming_after_its_delay_over_connect(connect_server, tmp_path):
    out = tmp_path / "tail"
    done = _driver([
        "examples/sdf_resume.py", "--demo", "--demo_lines", "12", "--demo_s", "2",
        "--poll_s", "0.3", "--output", str(out), "--runner=SparkCheckpointRunner",
        f"--spark_remote={connect_server.url}", "--checkpoint_dir", str(tmp_path / "ckpt"),
    ])  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [ln for p in sorted(tmp_path.glob("tail-*-of-*")) for ln in p.read_text().splitlines()]
    assert sorted(lines) == [f"line {i:04d}" for i in range(12)]  # nothing lost or duplicated
    summary = next(ln for ln in done.stdout.splitlines() if ln.startswith("read "))
    assert int(summary.split(" call(s)")[0].rsplit(" ", 1)[1]) > 1, summary  # it resumed


def _streaming(tmp, crash_at: str | None, url: str) -> subprocess.CompletedProcess:
    return _driver([
        "-m", "tests.streaming.streaming_pipelines",
        "--output", str(tmp / "out"), "--sources", SOURCES, "--per_round", "15",
        "--runner=SparkCheckpointRunner", f"--spark_remote={url}",
        "--streaming", "--checkpoint_dir", str(tmp / "ckpt"),
        "--checkpoint_interval_s", "0.05", "--parallelism=2",
    ], crash_at)  # fmt: skip


def test_streaming_job_killed_and_resumed_over_connect(connect_server, tmp_path):
    killed = _streaming(tmp_path, "after-commit:3", connect_server.url)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert _visible_lines(tmp_path) != _expected()  # the kill really interrupted the job
    resumed = _streaming(tmp_path, None, connect_server.url)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _visible_lines(tmp_path) == _expected()

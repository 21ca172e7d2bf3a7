"""An unmodified Beam program runs on sparkbeam with --runner=SparkCheckpointRunner."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TEXT = "\n".join(
    ["the quick brown fox jumps over the lazy dog", "The dog barks; the fox runs.", ""] * 40
)


def _wordcount(runner: str, src: Path, out: Path, *extra: str) -> Counter:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "apache_beam.examples.wordcount",
            f"--runner={runner}",
            "--input",
            str(src),
            "--output",
            str(out),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    counts: Counter = Counter()
    for shard in out.parent.glob(out.name + "*"):
        for line in shard.read_text().splitlines():
            word, _, count = line.rpartition(": ")
            counts[word] += int(count)
    return counts


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("wc") / "input.txt"
    src.write_text(TEXT)
    return src


@pytest.fixture(scope="module")
def direct_counts(corpus, tmp_path_factory) -> Counter:
    return _wordcount("DirectRunner", corpus, tmp_path_factory.mktemp("direct") / "out")


def test_wordcount_matches_direct_runner(corpus, direct_counts, tmp_path, request):
    # Where the JVM and PySpark put their Unix domain sockets (a short path: at most 107 bytes).
    sockets = Path(tempfile.mkdtemp(prefix="sb-sockets-"))
    request.addfinalizer(lambda: shutil.rmtree(sockets, ignore_errors=True))
    counts = _wordcount(
        "SparkCheckpointRunner", corpus, tmp_path / "out", "--spark_master_url=local[2]",
        f"--spark_conf=spark.python.unix.domain.socket.dir={sockets}",
    )  # fmt: skip
    assert counts == direct_counts
    assert counts["the"] == 3 * 40  # sanity: the corpus really was counted
    # A driver that exits without stopping Spark left PySpark's accumulator socket behind,
    # one file in the temp directory per run.
    assert not list(sockets.iterdir())


ALIASES = [
    "SparkCheckpointRunner",
    "sparkcheckpointrunner",
    "sparkbeam.runner.SparkCheckpointRunner",
]


def test_every_spelling_of_the_runner_resolves_in_a_fresh_interpreter():
    """What ``--runner=<name>`` does in an unmodified program: Beam's own lookup, in a process
    that has not imported sparkbeam (the run itself is the test above)."""
    lookup = (
        "import sys\n"
        "from apache_beam.runners.runner import create_runner\n"
        "for name in sys.argv[1:]:\n"
        "    print(type(create_runner(name)).__qualname__)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", lookup, *ALIASES], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split() == ["SparkCheckpointRunner"] * len(ALIASES)

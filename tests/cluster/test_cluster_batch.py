"""Batch jobs on a real standalone cluster (master + 2 workers on 127.0.0.1).

Each driver is its own process (`tests.cluster.drivers`), run from a temporary directory with
no ``PYTHONPATH``; the workers cannot import anything of the tests. Every test checks from the
master's JSON that its application really ran on this master, then checks the output exactly.
"""

from __future__ import annotations

import random
import uuid
from pathlib import Path

import pytest

from tests.cluster.drivers import QUIET_CONF, python_driver, run_driver, spark_submit, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

APPS = Path(__file__).parent / "apps"
WORDS = "spark beam checkpoint round worker master executor shuffle window key".split()


def _lines(prefix: Path) -> list[str]:
    """Every line of every ``prefix*`` shard, sorted."""
    return sorted(
        line
        for shard in prefix.parent.glob(prefix.name + "*")
        for line in shard.read_text().splitlines()
        if line
    )


def _app_name(test: str) -> str:
    return f"sparkbeam-{test}-{uuid.uuid4().hex[:8]}"


def _assert_ran_on(cluster, name: str) -> None:
    """The app was on this master, and is done there (the driver exited, so it must end)."""
    apps = cluster.apps(name)
    assert apps, f"application {name!r} is not among the master's apps at {cluster.url}"
    done = lambda: all(a["state"] == "FINISHED" for a in cluster.apps(name))  # noqa: E731
    wait_for(done, 60, f"FINISHED state of {name!r} on the master")


def test_wordcount_on_cluster_equals_direct_runner(cluster, tmp_path):
    """(a) Beam's own wordcount example, unmodified, on the cluster == DirectRunner."""
    from apache_beam.examples import wordcount

    rng = random.Random(11)
    src = tmp_path / "input.txt"
    src.write_text("\n".join(" ".join(rng.choices(WORDS, k=12)) for _ in range(400)) + "\n")
    direct = tmp_path / "direct" / "counts"
    wordcount.run(
        ["--input", str(src), "--output", str(direct), "--runner=DirectRunner"],
        save_main_session=False,
    ).wait_until_finish()

    name, out = _app_name("wordcount"), tmp_path / "spark" / "counts"
    cmd = [
        *python_driver("-m", "apache_beam.examples.wordcount"),
        "--input", str(src), "--output", str(out), "--runner=SparkCheckpointRunner",
        f"--spark_master_url={cluster.url}", f"--spark_app_name={name}", *QUIET_CONF,
    ]  # fmt: skip
    driver = run_driver(cmd, tmp_path, tmp_path / "logs", "wordcount")
    assert driver.proc.returncode == 0, driver.tail()
    _assert_ran_on(cluster, name)
    assert _lines(out) == _lines(direct)
    assert len(_lines(out)) == len(WORDS)


def test_spark_submit_runs_on_submits_master(cluster, tmp_path):
    """(b) Under spark-submit the job runs on spark-submit's master (no --spark_master_url):
    a GroupByKey, a side input and user state, in the workers' executors and their own Python
    workers."""
    name, out = _app_name("submit"), tmp_path / "out" / "sums"
    cmd = spark_submit(
        cluster.url, name, APPS / "keyed_sums.py",
        "--output", str(out), "--count", "100", "--runner=SparkCheckpointRunner",
    )  # fmt: skip
    driver = run_driver(cmd, tmp_path, tmp_path / "logs", "submit")
    assert driver.proc.returncode == 0, driver.tail()
    _assert_ran_on(cluster, name)
    sums = {k: sum(x + 1000 for x in range(100) if x % 5 == k) for k in range(5)}
    want = sorted(f"{kind} {k} {total}" for kind in ("sum", "state") for k, total in sums.items())
    assert _lines(out) == want

"""The warm worker daemon takes PySpark's per-task costs off: ``importlib.invalidate_caches()``
must not re-read unchanged zips (``runner/spark/zip_caches``), yet must still see a zip that
changed; the per-task ``gc.collect()`` must not walk what the daemon imported (frozen)."""

from __future__ import annotations

import importlib
import sys
import zipfile
import zipimport

import pytest

from sparkbeam.runner.spark import zip_caches

needs_zip_fix = pytest.mark.skipif(
    not zip_caches.needed(), reason="Python 3.12+ re-reads zip directories lazily by itself"
)


def _write_zip(path, files: dict[str, str]) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)


@pytest.fixture
def installed(monkeypatch):
    # Undone after the test: the class attribute and the record of archives read.
    monkeypatch.setattr(zipimport.zipimporter, "invalidate_caches", zip_caches._real_invalidate)
    monkeypatch.setattr(zip_caches, "_read", {})
    zip_caches.install()
    return zipimport.zipimporter.invalidate_caches


@needs_zip_fix
def test_an_unchanged_zip_is_not_read_again(tmp_path, monkeypatch, installed):
    archive = tmp_path / "unchanged.zip"
    _write_zip(archive, {"zc_unchanged.py": "VALUE = 1\n"})
    monkeypatch.syspath_prepend(str(archive))
    importlib.import_module("zc_unchanged")
    monkeypatch.delitem(sys.modules, "zc_unchanged")
    reads = []
    real_read = zipimport._read_directory
    monkeypatch.setattr(zipimport, "_read_directory", lambda p: reads.append(p) or real_read(p))

    importlib.invalidate_caches()  # records the archive (read once)
    importlib.invalidate_caches()
    importlib.invalidate_caches()

    assert reads.count(str(archive)) == 1
    assert zipimport.zipimporter.invalidate_caches is installed


@needs_zip_fix
def test_a_rewritten_zip_is_read_again(tmp_path, monkeypatch, installed):
    archive = tmp_path / "rewritten.zip"
    _write_zip(archive, {"zc_first.py": "VALUE = 1\n"})
    monkeypatch.syspath_prepend(str(archive))
    assert importlib.import_module("zc_first").VALUE == 1
    monkeypatch.delitem(sys.modules, "zc_first")
    importlib.invalidate_caches()

    _write_zip(archive, {"zc_first.py": "VALUE = 1\n", "zc_second.py": "VALUE = 2 * 21\n"})
    importlib.invalidate_caches()

    assert importlib.import_module("zc_second").VALUE == 42
    monkeypatch.delitem(sys.modules, "zc_second")


@pytest.mark.spark
def test_spark_workers_are_forked_warm(spark):
    """Set up before forking: every task's worker has the cheap invalidation (where needed)
    and a frozen heap (Beam's imports: hundreds of thousands of objects)."""

    def probe(_):
        import gc
        import zipimport

        from pyspark import daemon

        from sparkbeam.runner.spark import zip_caches

        cheap = zipimport.zipimporter.invalidate_caches is zip_caches._invalidate_if_changed
        yield (cheap or not zip_caches.needed(), gc.get_freeze_count(), type(daemon.gc).__name__)

    got = spark.sparkContext.parallelize(range(4), 2).mapPartitions(probe).collect()
    assert [cheap for cheap, _, _ in got] == [True, True]
    assert all(frozen > 100_000 for _, frozen, _ in got), got
    assert [paced for _, _, paced in got] == ["PacedCollections"] * 2  # the per-task collection


def test_a_workers_full_collection_after_each_task_runs_at_most_every_few_seconds():
    """PySpark's daemon runs ``gc.collect()`` after every task of a reused worker: 9% of the
    workers' busy time in a streaming window count (what they built since the fork)."""
    import gc

    from sparkbeam.runner.spark.daemon import PacedCollections

    now = [100.0]
    paced = PacedCollections(every_s=10.0, clock=lambda: now[0])
    runs = []
    gc.callbacks.append(lambda phase, info: phase == "start" and runs.append(info["generation"]))
    try:
        paced.collect()  # the first task's: a full collection
        now[0] += 3
        assert paced.collect() == 0  # 3 s later: skipped
        now[0] += 8
        paced.collect()  # 11 s after the first: runs
    finally:
        gc.callbacks.pop()
    assert runs.count(2) == 2, runs
    assert paced.get_freeze_count() == gc.get_freeze_count()  # the rest is gc's


@pytest.mark.spark
def test_spark_workers_talk_to_the_jvm_over_a_unix_socket(spark):
    """Over TCP loopback each Python task waited ~20 ms on its socket (``worker_socket_conf``)."""
    from sparkbeam.runner.spark import session_conf

    if not session_conf.worker_socket_conf():
        pytest.skip("this pyspark (< 4.1) has no Unix-socket Python workers")

    def probe(_):
        import os

        yield os.environ.get("PYTHON_UNIX_DOMAIN_ENABLED", "false").lower()

    got = spark.sparkContext.parallelize(range(4), 2).mapPartitions(probe).collect()
    assert got == ["true", "true"]


def test_a_worker_whose_jvm_end_closed_exits_quietly(monkeypatch, capfd):
    """The JVM closes an idle reused worker's socket when the application stops. PySpark's
    daemon then printed a BrokenPipeError traceback after the run's last line (Spark 4.1 sets
    PYTHON_DAEMON_KILL_WORKER_ON_FLUSH_FAILURE): nothing failed, so nothing is printed."""
    import socket

    from sparkbeam.runner.spark import daemon

    monkeypatch.setenv("PYTHON_DAEMON_KILL_WORKER_ON_FLUSH_FAILURE", "true")
    ours, jvm = socket.socketpair()
    jvm.close()  # the JVM's end is gone
    try:
        code = daemon.worker(ours, True)
    finally:
        ours.close()
    assert code != 0  # the daemon's loop then lets this worker go
    err = capfd.readouterr().err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err

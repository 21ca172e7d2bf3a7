"""Spark Connect sessions: a local server, --spark_remote, sparkbeam shipped as an artifact.

Runs on the ``connect_server`` fixture (local[2], workers without sparkbeam) and on a
``sparkbeam serve`` subprocess."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql.types import StringType, StructField, StructType

from sparkbeam.runner.errors import PipelineOptionsError, SparkSessionError
from sparkbeam.runner.options import SparkRunnerOptions
from sparkbeam.runner.spark.connect_server import free_port
from sparkbeam.runner.spark.session import (
    connect_session,
    default_parallelism,
    get_or_create_session,
    is_connect,
    shared_url,
    sql_functions,
    stop_connect_sessions,
    target_master,
)
from sparkbeam.runner.spark.shipping import ship_user_code
from tests.servers import leftover_processes, server_env

WHERE = StructType([StructField("where", StringType())])
# The server cannot import this test module: its functions travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def remote_options(url: str, *extra: str) -> SparkRunnerOptions:
    return SparkRunnerOptions([f"--spark_remote={url}", *extra])


def import_sparkbeam_in_worker(batches):
    """A mapInArrow function that imports sparkbeam and says from where."""
    import sparkbeam.checkpoint.keygroups as module

    for _ in batches:
        yield pa.RecordBatch.from_pydict({"where": [module.__file__]})


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.connect
def test_spark_remote_session_runs_a_query_on_the_server(connect_server):
    spark = get_or_create_session(remote_options(connect_server.url))
    assert is_connect(spark)
    assert spark.range(10).selectExpr("sum(id)").first()[0] == 45
    assert target_master(remote_options(connect_server.url)) == "local[2]"
    assert get_or_create_session(remote_options(connect_server.url)) is spark
    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ  # pyspark stays classic here


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.connect
def test_a_local_server_runs_side_input_feeders_on_the_driver(connect_server):
    """The server listens on 127.0.0.1 with a local master: it shares the driver's host, so
    stages that only feed side inputs run on the driver (``batch.driver_stages``)."""
    from sparkbeam.runner.plane.frames import FramePlane

    assert "127.0.0.1" in connect_server.url
    spark = get_or_create_session(remote_options(connect_server.url))
    assert FramePlane(spark, connect=True).local_master


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.connect
def test_sessions_on_a_server_are_stopped_before_it_is(connect_server):
    """An open client retries its exit-time cleanup against a stopped server for minutes
    (a test process hung at exit that way); a closed one gives up at once."""
    spark = get_or_create_session(remote_options(connect_server.url))
    stop_connect_sessions(connect_server.url)
    assert spark.is_stopped and spark.client.is_closed
    again = get_or_create_session(remote_options(connect_server.url))
    assert again is not spark and again.range(3).count() == 3


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.connect
def test_persisting_over_connect_does_not_clone_the_sessions_artifacts(connect_server):
    """The server caches a plan in a cloned session, whose artifacts (sparkbeam's zip) are
    copied and added to Spark again: one clone per persisted dataset, kept on the server
    while it is cached. The frames plane keeps its datasets without cloning the session."""
    from sparkbeam.runner.plane.frames import FramePlane

    spark = get_or_create_session(remote_options(connect_server.url))
    ship_user_code(spark, remote_options(connect_server.url))
    plane = FramePlane(spark, connect=True)
    assert plane.parallelize([0], 1).map(_plus_one).collect() == [1]  # artifacts in use
    added_before = _files_added(connect_server)
    for n in range(3):
        kept = plane.persist(plane.parallelize([n, n], 2).map(_plus_one), "kept")
        assert kept.collect() == [n + 1, n + 1] and kept.collect() == [n + 1, n + 1]
    assert _files_added(connect_server) == added_before
    stop_connect_sessions(connect_server.url)  # later tests ship to a session of their own


def _plus_one(n: int) -> int:
    return n + 1


def _worker_state(_):
    """How the Python worker that runs this task spends its per-task overhead."""
    import gc
    import importlib
    import zipimport

    zips = [i for i in sys.path_importer_cache.values() if isinstance(i, zipimport.zipimporter)]
    took = []
    for _ in range(3):  # the fastest of three: an unsettled worker re-reads its zips every time
        started = time.perf_counter()
        importlib.invalidate_caches()  # what PySpark's worker does before every task
        took.append(time.perf_counter() - started)
    return (len(zips), min(took), gc.get_freeze_count())


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.connect
def test_tasks_on_a_server_without_sparkbeam_settle_their_worker_once(connect_server):
    """The server's stock daemon forks workers that import pyspark and sparkbeam from zips.
    On Python 3.11 PySpark's per-task ``importlib.invalidate_caches()`` then re-read every zip
    once per cached importer: 0.2-0.4 s per task, most of a small stage's time over Connect.
    sparkbeam's first task in a worker does what its own daemon does before forking."""
    from sparkbeam.runner.plane.frames import FramePlane
    from sparkbeam.runner.spark import zip_caches

    spark = get_or_create_session(remote_options(connect_server.url))
    try:
        ship_user_code(spark, remote_options(connect_server.url))
        plane = FramePlane(spark, connect=True)
        plane.parallelize(list(range(4)), 2).map(_plus_one).collect()  # every worker settled
        states = plane.parallelize(list(range(4)), 2).map(_worker_state).collect()
    finally:
        stop_connect_sessions(connect_server.url)  # later tests ship to a session of their own
    assert all(zips > 0 for zips, _, _ in states), states  # pyspark and sparkbeam from zips
    if zip_caches.needed():
        assert all(seconds < 0.05 for _, seconds, _ in states), states
    assert all(frozen > 100_000 for _, _, frozen in states), states


def _files_added(server) -> int:
    return server.log_path.read_text(errors="replace").count("INFO SparkContext: Added file")


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.connect
def test_a_classic_and_a_connect_session_live_in_one_process(spark, connect_server):
    remote = get_or_create_session(remote_options(connect_server.url))
    for session in (spark, remote):
        F = sql_functions(session)
        assert session.range(4).select(F.sum(F.col("id"))).first()[0] == 6
    assert not is_connect(spark) and default_parallelism(spark) == 2


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.connect
def test_default_parallelism_over_connect_is_the_servers_local_n(connect_server):
    spark = get_or_create_session(remote_options(connect_server.url))
    started = time.monotonic()
    assert default_parallelism(spark) == 2
    print(f"default_parallelism over Connect: {time.monotonic() - started:.2f} s")


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.connect
def test_sparkbeam_reaches_the_servers_workers_only_through_the_artifact_upload(connect_server):
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    def run(session):
        return session.range(1).mapInArrow(import_sparkbeam_in_worker, WHERE).collect()

    bare = ConnectSession.builder.remote(connect_server.url).create()  # no artifacts
    try:
        with pytest.raises(Exception, match="No module named 'sparkbeam"):
            run(bare)
    finally:
        bare.stop()
    spark = get_or_create_session(remote_options(connect_server.url))
    added = ship_user_code(spark, remote_options(connect_server.url))
    assert any(name.startswith("sparkbeam-") for name in added)
    assert ship_user_code(spark, remote_options(connect_server.url)) == []  # once per session
    [row] = run(spark)
    assert "sparkbeam-" in row.where and ".zip" in row.where, row.where


def test_a_malformed_spark_remote_is_refused_in_one_line():
    with pytest.raises(PipelineOptionsError, match=r"--spark_remote 'http://x:1' is not a Spark"):
        remote_options("http://x:1").remote_url()
    with pytest.raises(PipelineOptionsError, match=r"is not a Spark Connect URL"):
        remote_options("sc://host:port").remote_url()


def test_spark_remote_with_spark_master_url_is_refused():
    options = remote_options("sc://127.0.0.1:15002", "--spark_master_url=local[2]")
    with pytest.raises(PipelineOptionsError, match="give one"):
        options.remote_url()


def test_spark_remote_environment_variable_is_used(monkeypatch):
    monkeypatch.setenv("SPARK_REMOTE", "sc://127.0.0.1:15003")
    assert SparkRunnerOptions([]).remote_url() == "sc://127.0.0.1:15003"
    assert SparkRunnerOptions(["--spark_remote=sc://h:1"]).remote_url() == "sc://h:1"


def test_no_server_at_the_url_is_a_clear_error():
    url = f"sc://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(
        SparkSessionError, match=r"No Spark Connect server answers at .*sparkbeam serve"
    ):
        get_or_create_session(remote_options(url))
    assert time.monotonic() - started < 10


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.connect
def test_sparkbeam_serve_starts_answers_and_stops(tmp_path):
    """Started as a script's background job (SIGINT ignored, as the shell leaves it), with
    Spark settings; SIGINT stops it all the same."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    port = free_port()
    cmd = [sys.executable, "-m", "sparkbeam.runner.cli", "serve", "--port", str(port)]
    cmd += ["--master", "local[1]", "--log_dir", str(tmp_path), "--max_cores", "1"]
    cmd += ["--conf", "spark.sparkbeam.test=served"]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        text=True,
        env=server_env("serve"),
        cwd=tmp_path,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        started = time.monotonic()
        line = proc.stdout.readline()
        assert f"sc://127.0.0.1:{port}" in line, line
        print(f"sparkbeam serve answered after {time.monotonic() - started:.1f} s")
        spark = ConnectSession.builder.remote(f"sc://127.0.0.1:{port}").create()
        try:
            assert spark.conf.get("spark.master") == "local[1]"
            assert spark.conf.get("spark.cores.max") == "1"
            assert spark.conf.get("spark.sparkbeam.test") == "served"
            # Its workers run sparkbeam's daemon, which imports the installed sparkbeam.
            [row] = spark.range(1).mapInArrow(import_sparkbeam_in_worker, WHERE).collect()
            assert row.where.endswith("keygroups.py"), row.where
        finally:
            spark.stop()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 20
    while leftover_processes(role="serve") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert leftover_processes(role="serve") == []


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.connect
def test_a_large_broadcast_over_connect_travels_once_not_in_every_function(connect_server):
    """Carried inside the functions, a plan's components made 100 MiB task binaries that
    filled a warm server's heap; uploaded once, a function carries only the value's name."""
    from sparkbeam.runner.plane.frames import FramePlane
    from sparkbeam.runner.plane.shipped import INLINE_BYTES

    spark = get_or_create_session(remote_options(connect_server.url))
    ship_user_code(spark, remote_options(connect_server.url))
    plane = FramePlane(spark, connect=True)
    big = {"blob": os.urandom(2 * INLINE_BYTES), "n": 7}
    shared = plane.broadcast(big)
    assert len(cloudpickle.dumps(shared)) < 1024
    assert plane.broadcast(dict(big)).name == shared.name  # the same bytes: one upload
    read = plane.parallelize([0, 1, 2], 3).map(functools.partial(_read_broadcast, shared))
    assert read.collect() == [(7, len(big["blob"]))] * 3
    assert plane.broadcast({"small": 1}).value == {"small": 1}  # small ones stay inline
    stop_connect_sessions(connect_server.url)


def _read_broadcast(shared, _):
    return shared.value["n"], len(shared.value["blob"])


def test_runs_of_one_code_and_conf_share_a_session_id():
    url = "sc://127.0.0.1:15002"
    two, three = {"spark.sql.shuffle.partitions": "2"}, {"spark.sql.shuffle.partitions": "3"}
    one = shared_url(url, two, ["sparkbeam-1.zip", "user-a.zip"])
    assert one == shared_url(url, two, ["user-a.zip", "sparkbeam-1.zip"])
    assert one.startswith(url + "/;session_id=")
    others = {
        shared_url(url, two, ["sparkbeam-1.zip", "user-b.zip"]),
        shared_url(url, three, ["sparkbeam-1.zip", "user-a.zip"]),
    }
    assert one not in others and len(others) == 2
    assert shared_url(url + "/;token=x", {}, ["a"]).startswith(url + "/;token=x;session_id=")
    own = url + "/;session_id=8d3f2d55-3c3c-4f4b-9e3e-0e0b7a5c8f21"
    assert shared_url(own, {}, ["a"]) == own  # the user's own session is kept


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.connect
def test_a_persisted_frame_stays_in_its_session_when_the_process_has_two(connect_server):
    """pyspark binds a local checkpoint to the thread's active Connect session: with a plain
    and a shared session in one process, the checkpoint's next use named a DataFrame its own
    session did not have."""
    from sparkbeam.runner.plane.frames import local_checkpoint

    url = connect_server.url
    first = connect_session(url)
    assert first.range(2).count() == 2
    second = connect_session(url, {}, ["test-two-sessions.zip"])
    assert second is not first and second.session_id != first.session_id
    try:
        kept = local_checkpoint(second.range(5), None)
        assert kept.selectExpr("sum(id)").first()[0] == 10
    finally:
        stop_connect_sessions(url)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.connect
def test_two_runs_of_one_pipeline_share_the_servers_python_workers(connect_server, tmp_path):
    """Separate driver processes with the same code and options join one server session, so
    the second run's tasks run in the Python workers (one daemon) the first one started."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root)
    env.pop("SPARK_REMOTE", None)
    pids = []
    for run in ("first", "second"):
        out = tmp_path / f"{run}.txt"
        done = subprocess.run(
            [sys.executable, "tests/connect/worker_pids_pipeline.py", str(out),
             f"--spark_remote={connect_server.url}"],
            cwd=root, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        pids.append(set(out.read_text().split()))
    assert len(pids[0]) == 1 and pids[0] == pids[1], pids


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.connect
def test_a_session_named_in_the_url_survives_the_storage_check(connect_server):
    """Asking the server's master must not release a session the user named: a released
    session id cannot be used again, so the run itself would fail."""
    own = "5b1f0a52-7c1e-4d7a-9a55-3f1f6c2d9e10"
    options = remote_options(f"{connect_server.url}/;session_id={own}")
    try:
        assert target_master(options) == "local[2]"
        spark = get_or_create_session(options, code=["test-own-session.zip"])
        assert spark.session_id == own and spark.range(4).count() == 4
    finally:
        stop_connect_sessions(connect_server.url)

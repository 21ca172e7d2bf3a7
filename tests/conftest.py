"""Shared fixtures: one real local Spark session per test process."""

from __future__ import annotations

import glob
import os
import sys
import tempfile
from pathlib import Path

import pytest

TEST_MASTER = os.environ.get("SPARKBEAM_TEST_MASTER", "local[2]")

# A test's JVMs live for seconds: compiling with C1 alone costs far less CPU than C1 then C2,
# and the serial collector runs no GC threads (a streaming kill-and-resume test's driver run:
# 30 -> 19 CPU-s, 17 -> 13 s on 2 cores). Every JVM a test starts gets them through the
# environment: spark-submit reads SPARK_SUBMIT_OPTS (sessions, drivers, the Connect server),
# spark-class SPARK_DAEMON_JAVA_OPTS (a standalone master and workers). Tests only: a user's
# job keeps the JVM's defaults.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
for _name in ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS"):
    if TEST_JVM_OPTIONS not in os.environ.get(_name, ""):
        os.environ[_name] = f"{os.environ.get(_name, '')} {TEST_JVM_OPTIONS}".strip()


def pytest_configure(config):
    """The test run's driver JVMs (spark-submit: sessions, drivers, the Connect server) share
    one class-data archive (``tests/jvm_cds.py``) kept in the venv beside its pyspark, built
    once by the first process (xdist's controller, before its workers start: they inherit the
    options). The standalone daemons' class path starts with their own conf dir: not for them.
    ``SPARKBEAM_TEST_JVM_ARCHIVE=0`` goes without (a few tests do not repay its minute)."""
    if hasattr(config, "workerinput") or "SharedArchiveFile" in _submit_opts():
        return
    if os.environ.get("SPARKBEAM_TEST_JVM_ARCHIVE") == "0":
        return
    from tests.jvm_cds import ensure_archive, use_options

    archive, config._jvm_cds = ensure_archive(Path(sys.prefix) / "jvm-cds", TEST_JVM_OPTIONS)
    if archive is not None:
        os.environ["SPARK_SUBMIT_OPTS"] = f"{_submit_opts()} {use_options(archive)}".strip()


def _submit_opts() -> str:
    return os.environ.get("SPARK_SUBMIT_OPTS", "")


def pytest_report_header(config):
    return f"JVM class-data archive: {getattr(config, '_jvm_cds', 'not used')}"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Keep the tests that ask for their module's own module-scoped fixture on one xdist worker
    (``--dist loadgroup``): such a fixture (a killed-and-resumed job, a spark-submit run) runs
    once per worker that runs one of its tests. Groups set before (cluster, connect: their
    folders' tryfirst hooks run before this one) stay. Tryfirst: xdist reads the marks into the
    node ids in its own hook, so a mark added after it does nothing (as trylast, every such
    fixture ran once per worker: two spark-submit runs of ``test_session`` instead of one).

    A Beam test sparkbeam deliberately answers otherwise (its module's ``DIFFERENCES``: name ->
    reason) runs as ``xfail(strict=True)``: it must keep failing, so a change of behaviour
    shows, where a skip would hide it."""
    for item in items:
        reason = getattr(getattr(item, "module", None), "DIFFERENCES", {}).get(item.name)
        if reason:
            item.add_marker(pytest.mark.xfail(strict=True, reason=reason))
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None or item.get_closest_marker("xdist_group"):
            continue
        module = item.nodeid.split("::")[0]
        for name in info.argnames:
            defs = info.name2fixturedefs.get(name) or ()
            if any(d.scope == "module" and d.baseid == module for d in defs):
                item.add_marker(pytest.mark.xdist_group(module))
                break


def spark_test_options(*extra: str) -> list[str]:
    """Pipeline flags that run on the shared test session."""
    return ["--runner=SparkCheckpointRunner", f"--spark_master_url={TEST_MASTER}", *extra]


def checkpoint_ids(url: str) -> list[int]:
    """Every checkpoint id of every pipeline in the store at ``url`` (read-only)."""
    from sparkbeam.checkpoint import open_store

    with open_store(url, read_only=True) as store:
        return [c.checkpoint_id for p in store.list_pipelines() for c in store.list_checkpoints(p)]


def get_test_session():
    """Create (once) or return the shared local SparkSession."""
    from pyspark.sql import SparkSession

    from sparkbeam.runner.spark.session_conf import default_conf

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # sparkbeam's own defaults (warm daemon, worker sockets, scheduler), as a user's run gets.
    builder = SparkSession.builder.master(TEST_MASTER).appName("sparkbeam-tests")
    for key, value in default_conf(2).items():
        builder = builder.config(key, value)
    return (
        builder.config("spark.ui.enabled", "false")
        .config("spark.default.parallelism", "2")
        .getOrCreate()
    )


@pytest.fixture(scope="session", autouse=True)
def _no_empty_beam_temp_dirs():
    """Beam makes a temporary directory for every ``Pipeline`` and removes it only when the
    pipeline runs: the pipelines tests build only to translate left hundreds of empty ones in
    /tmp per suite; and every DirectRunner run leaves an empty ``beam-temp*`` (the tests that
    compare with it). Nothing writes into them, so the empty ones made meanwhile go at the end."""
    names = ("beam-pipeline-temp*", "beam-temp*")
    patterns = [os.path.join(tempfile.gettempdir(), name) for name in names]

    def made():
        return {path for pattern in patterns for path in glob.glob(pattern)}

    before = made()
    yield
    for path in made() - before:
        try:
            os.rmdir(path)  # empty ones only
        except OSError:
            pass


@pytest.fixture(scope="session")
def spark():
    session = get_test_session()
    yield session


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """moto's standalone S3 server on 127.0.0.1 with one bucket; stopped (by PID) at the end."""
    from tests.servers import start_s3_server, stop_process_group

    server = start_s3_server(tmp_path_factory.mktemp("s3-server"))
    try:
        yield server
    finally:
        stop_process_group(server.proc)


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """fake-gcs-server on 127.0.0.1 with one bucket; stopped (by PID) at the end. While it runs,
    this process's environment points Beam's GCS client at it (``GcsServer.env``: Beam has no
    GCS endpoint option); a pipeline on it runs in a process started with that environment."""
    from tests.servers import start_gcs_server, stop_process_group

    server = start_gcs_server(tmp_path_factory.mktemp("gcs-server"))
    saved = {name: os.environ.get(name) for name in server.env()}
    os.environ.update(server.env())
    try:
        yield server
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        stop_process_group(server.proc)


@pytest.fixture(scope="session")
def azure_server(tmp_path_factory):
    """Azurite's Blob service on 127.0.0.1 with one container; stopped (by PID) at the end."""
    from tests.servers import start_azurite, stop_process_group

    server = start_azurite(tmp_path_factory.mktemp("azurite"))
    try:
        yield server
    finally:
        stop_process_group(server.proc)


@pytest.fixture(params=["s3", "gcs", "azure"])
def cloud(request):
    """Each object store's emulator in turn (``s3_server``, ``gcs_server``, ``azure_server``):
    one shape (``url``, ``pipeline_flags``, ``env``, ``keys``, ``lines``)."""
    return request.getfixturevalue(f"{request.param}_server")


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    """A Tansu Kafka-protocol broker (in-memory storage) on 127.0.0.1; stopped (by PID) at the
    end. Each test creates its own topics (``kafka_broker.create_topic``)."""
    from tests.servers import start_kafka_broker, stop_process_group

    broker = start_kafka_broker(tmp_path_factory.mktemp("kafka-broker"))
    try:
        yield broker
    finally:
        stop_process_group(broker.proc)


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory):
    """A local Spark Connect server (local[2], 127.0.0.1) whose Python workers get sparkbeam
    only as a session artifact; started once per test process, stopped (by PID) at the end.
    Its ``.url`` is what ``--spark_remote`` takes."""
    from tests.servers import start_connect_server

    server = start_connect_server(tmp_path_factory.mktemp("connect-server"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def no_aws_environment(monkeypatch):
    """No ``AWS_*`` variables: a process must get its S3 options from the pipeline's flags."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)


@pytest.fixture
def executor_dir(tmp_path, monkeypatch):
    """An executor's local directory; no read kept in this process before the test."""
    local = tmp_path / "blockmgr"
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(local))
    from sparkbeam.runner.task import staged_state

    monkeypatch.setattr(staged_state, "_READS", type(staged_state._READS)())
    yield local
    from sparkbeam.runner.task import held_state

    held_state.release()

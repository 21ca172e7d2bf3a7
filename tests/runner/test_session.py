"""The Spark session: spark-submit's master and name win, a disagreeing
--spark_master_url is refused naming both, an unreachable master fails fast in one line,
and a session whose py4j link broke is replaced."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import pyspark
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.runner.errors import SparkSessionError
from sparkbeam.runner.options import SparkRunnerOptions
from sparkbeam.runner.spark.session import get_or_create_session, probe_master
from sparkbeam.runner.spark.session_conf import LOCAL_JVM_OPTIONS
from tests.conftest import TEST_MASTER

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=ROOT, PYSPARK_PYTHON=sys.executable)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def submitted():
    """spark-submit --master local[2] --name ...: one run, then a disagreeing master."""
    spark_home = os.path.dirname(pyspark.__file__)
    cmd = [
        os.path.join(spark_home, "bin", "spark-submit"),
        "--master", "local[2]", "--name", "submitted-by-test",
        "--conf", "spark.ui.enabled=false",
        os.path.join(HERE, "submitted_app.py"), "--spark_master_url=local[3]",
    ]  # fmt: skip
    env = dict(_env(), SPARK_HOME=spark_home, PYSPARK_DRIVER_PYTHON=sys.executable)
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_spark_submit_master_and_name_are_used(submitted):
    assert "RAN=ok" not in submitted
    assert "MASTER=local[2]" in submitted  # not sparkbeam's default local[*]
    assert "APP_NAME=submitted-by-test" in submitted  # not the job name or 'sparkbeam'
    # spark-submit started the JVM: sparkbeam's options for a JVM it starts are not claimed
    (options,) = set(re.findall(r"^DRIVER_JAVA_OPTIONS=(.*)$", submitted, re.M))
    assert LOCAL_JVM_OPTIONS not in options.split(), options  # Spark's own may be there


@pytest.mark.slow
def test_disagreeing_master_under_spark_submit_names_both(submitted):
    errors = [ln for ln in submitted.splitlines() if ln.startswith("ERROR:")]
    assert len(errors) == 2  # before the session exists, and after
    for line in errors:
        assert "SparkSessionError" in line
        assert "'local[3]'" in line and "spark-submit's master 'local[2]'" in line


@pytest.mark.spark
def test_disagreeing_master_with_active_session_names_both(spark):
    options = PipelineOptions(["--spark_master_url=local[3]"]).view_as(SparkRunnerOptions)
    master = re.escape(spark.sparkContext.master)
    with pytest.raises(SparkSessionError, match=rf"'local\[3\]' disagrees .*'{master}'"):
        get_or_create_session(options)
    same = PipelineOptions([f"--spark_master_url={TEST_MASTER}"]).view_as(SparkRunnerOptions)
    assert get_or_create_session(same) is spark


def test_unreachable_master_fails_fast_in_one_line():
    port = _closed_port()
    started = time.monotonic()
    with pytest.raises(SparkSessionError, match=r"not reachable.*[Cc]onnection refused") as info:
        probe_master(f"spark://127.0.0.1:{port}")
    assert time.monotonic() - started < 5
    assert "\n" not in str(info.value)


def test_unreachable_master_through_the_runner_is_one_line():
    """A fresh process: no JVM is started, no Java frames, the cause first."""
    code = (
        "import apache_beam as beam\n"
        "from apache_beam.options.pipeline_options import PipelineOptions\n"
        "p = beam.Pipeline(options=PipelineOptions(['--runner=SparkCheckpointRunner',"
        f" '--spark_master_url=spark://127.0.0.1:{_closed_port()}']))\n"
        "_ = p | beam.Create([1])\n"
        "p.run()\n"
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode != 0
    lines = [ln for ln in done.stderr.strip().splitlines() if "apitools not found" not in ln]
    assert len(lines) <= 3, done.stderr  # the message and where its traceback is: no trace
    last = lines[0]
    assert last.startswith("SparkSessionError: Spark master")
    assert "onnection refused" in last
    assert "at org.apache" not in done.stderr and "Java 17" not in done.stderr
    assert time.monotonic() - started < 120  # imports only; was 70 s of JVM retries


@pytest.mark.slow
@pytest.mark.spark
def test_pipeline_runs_after_an_interrupted_action():
    """An action interrupted mid-call (as by a test timeout) breaks the py4j link; the next
    pipeline in the process still runs. In a subprocess: the shared session stays intact."""
    done = subprocess.run(
        [sys.executable, os.path.join(HERE, "interrupted_app.py"), TEST_MASTER],
        env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "BROKEN: " in done.stdout  # the link really was broken
    assert "PIPELINE=ok" in done.stdout


def test_only_local_masters_get_a_warm_up_job():
    from sparkbeam.runner.spark.session_conf import is_local_master

    assert is_local_master("local[2]") and is_local_master("local")
    assert not is_local_master("spark://127.0.0.1:7077")
    assert not is_local_master("local-cluster[2,1,1024]")
    assert not is_local_master(None)


@pytest.fixture(scope="module")
def warm_app():
    """``warm_app.py`` on ``local[1]``, once. In a subprocess: the shared test session is not
    built by sparkbeam."""
    env = _env()  # without the tests' compiler option: the one the JVM gets is sparkbeam's
    env["SPARK_SUBMIT_OPTS"] = env.get("SPARK_SUBMIT_OPTS", "").replace(LOCAL_JVM_OPTIONS, "")
    done = subprocess.run(
        [sys.executable, os.path.join(HERE, "warm_app.py"), "local[1]"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.spark
def test_the_tests_of_a_module_fixture_share_one_xdist_worker(request, warm_app):
    """``tests/conftest.py`` groups them (``--dist loadgroup``); when its mark came after xdist
    read the marks, each worker ran ``warm_app`` (and ``submitted``) once more."""
    if not getattr(request.config.option, "loadgroup", False):
        return  # not under xdist's loadgroup: one process runs everything anyway
    assert request.node.nodeid.endswith("@tests/runner/test_session.py"), request.node.nodeid


@pytest.mark.spark
def test_a_jvm_sparkbeam_starts_for_a_local_master_compiles_with_c1_only(warm_app):
    """The local JVM coordinates; the Python workers do the work. Its optimizing compiler cost
    about half its CPU in a streaming job on 2 cores (``session_conf.LOCAL_JVM_OPTIONS``)."""
    options = re.search(r"^DRIVER_JAVA_OPTIONS (.*)$", warm_app.stdout, re.M).group(1)
    assert LOCAL_JVM_OPTIONS in options.split(), options  # with Spark's own
    jvm_args = re.search(r"^JVM_ARGS (.*)$", warm_app.stdout, re.M).group(1).split()
    assert LOCAL_JVM_OPTIONS in jvm_args, jvm_args


def test_only_a_jvm_this_process_starts_for_a_local_master_gets_sparkbeams_options():
    from sparkbeam.runner.spark.session_conf import local_jvm_conf

    assert local_jvm_conf("local[2]", jvm_running=False) == {
        "spark.driver.extraJavaOptions": LOCAL_JVM_OPTIONS
    }
    assert local_jvm_conf("local[2]", jvm_running=True) == {}  # spark-submit's, or running
    assert local_jvm_conf("spark://127.0.0.1:7077", jvm_running=False) == {}
    assert local_jvm_conf(None, jvm_running=False) == {}


@pytest.mark.spark
def test_a_local_run_builds_the_sql_session_only_when_asked(warm_app):
    """``SparkSession(sc)`` costs ~2 s on a cold JVM and the RDD plane never needs it: a run
    gets its SparkContext behind a stand-in (``context_session``), which builds the session, on
    the same context and with sparkbeam's conf, when an attribute asks for it."""
    assert "SQL_SESSION_BUILT False" in warm_app.stdout
    assert "SAME_STAND_IN True" in warm_app.stdout  # a later run in the process reuses it
    assert "SQL_CONF 8" in warm_app.stdout  # sparkbeam's default shuffle partitions
    assert "SAME_CONTEXT True" in warm_app.stdout


@pytest.mark.spark
def test_a_local_session_starts_its_python_worker_daemon_before_any_pipeline_job(warm_app):
    """The daemon's Beam import overlaps the planning of the run (``warm_workers``): when the
    session is returned, a one-task job is on its way and the daemon comes up without any
    pipeline job."""
    done = warm_app
    assert "WARM_THREADS 1" in done.stdout
    assert "JOBS SUCCEEDED" in done.stdout
    daemons = int(re.search(r"DAEMONS (\d+)", done.stdout).group(1))
    assert daemons >= 1, done.stdout  # the daemon (and the worker it forked)


@pytest.mark.spark
def test_a_local_sessions_daemon_is_forked_from_the_zygote_that_imported_beam(warm_app):
    """The daemon's Beam import overlaps the JVM's start: the driver's zygote imported it and
    forked the daemon the JVM asked for (``zygote``), whose workers find the heap frozen; the
    zygote is gone once it forked."""
    assert "DAEMON_MODULE sparkbeam.runner.spark.zygote" in warm_app.stdout
    assert "WORKER_FROZEN True" in warm_app.stdout
    assert "ZYGOTES_LEFT 0" in warm_app.stdout


def test_a_daemon_of_another_python_is_not_forked_from_the_zygote(monkeypatch):
    """``spark.pyspark.python`` may name another interpreter than the driver's: the zygote
    (the driver's Python) declines, and the daemon serves itself; the zygote then exits."""
    from sparkbeam.runner.spark import zygote

    monkeypatch.delenv(zygote.ENV, raising=False)
    proc = zygote.spawn()
    try:
        assert proc is not None and os.environ.get(zygote.ENV)
        for _ in range(200):  # it binds at once (a JVM takes seconds to ask)
            if os.path.exists(os.environ[zygote.ENV]):
                break
            time.sleep(0.05)
        monkeypatch.setattr(zygote, "_interpreter", lambda: ["/another/python", "", [3, 99]])
        assert zygote.hand_over() is False
        assert proc.wait(timeout=60) == 0
        assert not os.path.exists(os.path.dirname(os.environ[zygote.ENV]))  # cleaned up
    finally:
        zygote.launched()
        if proc is not None and proc.poll() is None:
            proc.kill()


def test_a_daemon_with_no_zygote_to_ask_serves_itself(monkeypatch, tmp_path):
    """A stale or missing zygote socket (another JVM's, a zygote that timed out) is no error:
    the launched daemon imports and serves as before."""
    from sparkbeam.runner.spark import zygote

    monkeypatch.setenv(zygote.ENV, str(tmp_path / "gone" / "socket"))
    assert zygote.hand_over() is False
    monkeypatch.delenv(zygote.ENV)
    assert zygote.hand_over() is False


def test_a_jvm_that_does_not_start_leaves_no_zygote(tmp_path):
    """The zygote starts before the JVM; when the JVM does not start (no Java, a bad
    ``--spark_conf``), the session error stops it instead of leaving it to time out."""
    (tmp_path / "tmp").mkdir()
    env = dict(_env(), JAVA_HOME=str(tmp_path / "no-java"), TMPDIR=str(tmp_path / "tmp"))
    done = subprocess.run(
        [sys.executable, os.path.join(HERE, "no_jvm_app.py")],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ERROR" in done.stdout, done.stdout
    assert "ZYGOTES 0" in done.stdout, done.stdout
    assert "ZYGOTE_ENV None" in done.stdout
    assert not list((tmp_path / "tmp").glob("sparkbeam-zygote-*"))  # its socket directory too


@pytest.mark.slow
@pytest.mark.spark
def test_spark_conf_pyspark_python_is_the_workers_python(tmp_path):
    """``--spark_conf spark.pyspark.python=...`` names the executors' Python (PySpark itself
    reads only ``PYSPARK_PYTHON``, which this process sets otherwise). In a subprocess: the
    worker Python is fixed when a SparkContext starts."""
    used = tmp_path / "used"
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {used}\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    code = (
        "import sys, apache_beam as beam\n"
        "from apache_beam.testing.util import assert_that, equal_to\n"
        "with beam.Pipeline(argv=['--runner=SparkCheckpointRunner', '--spark_master_url=local[1]',"
        f" '--spark_conf=spark.pyspark.python={wrapper}']) as p:\n"
        "    out = p | beam.Create([1, 2]) | beam.Map(lambda x: x * 10)\n"
        "    assert_that(out, equal_to([10, 20]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=_env(), cwd=ROOT, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sparkbeam.runner.spark.daemon" in used.read_text()  # the JVM started it


def test_the_session_resolves_each_jvm_class_name_once(spark, monkeypatch):
    """PySpark looks classes up by simple name for every RDD it builds; each lookup the JVM
    answers walks every jar for the names it misses. After the first, none goes to the JVM."""
    from pyspark import SparkContext

    get_or_create_session(PipelineOptions([]).view_as(SparkRunnerOptions))
    sc = spark.sparkContext
    assert sc._jvm is SparkContext._jvm
    sc.parallelize([1, 2], 2).map(lambda x: (x, x)).partitionBy(2).collect()
    sent = _commands_sent(sc._jvm._gateway_client, monkeypatch)
    assert sc.parallelize([1, 2], 2).map(lambda x: (x, x)).partitionBy(2).count() == 2
    lookups = [c for c in sent if c.startswith("r\nu\n")]  # py4j's "unknown member" reflection
    assert sent and not lookups, lookups


def test_a_name_that_is_no_class_is_asked_again(spark, monkeypatch):
    """py4j takes an unknown name for a package; a jar added later may make it a class."""
    get_or_create_session(PipelineOptions([]).view_as(SparkRunnerOptions))
    jvm = spark.sparkContext._jvm
    sent = _commands_sent(jvm._gateway_client, monkeypatch)
    for _ in range(2):
        jvm.SparkbeamNoSuchClass  # noqa: B018 - the lookup is the point
    assert len([c for c in sent if "SparkbeamNoSuchClass" in c]) == 2


def _commands_sent(client, monkeypatch) -> list[str]:
    """The py4j commands ``client`` sends from now on (sent as before)."""
    sent: list[str] = []
    send = client.send_command
    monkeypatch.setattr(
        client,
        "send_command",
        lambda command, *a, **k: (sent.append(command), send(command, *a, **k))[1],
    )
    return sent

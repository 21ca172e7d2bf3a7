"""The Spark session: spark-submit's, a live active one, or one built from the options.

Under ``spark-submit`` the master, app name and conf are spark-submit's (it hands them to
the Python driver as JVM system properties, which ``SparkConf()`` reads); sparkbeam only adds
its defaults for keys spark-submit left unset. A session whose py4j link broke (an action
interrupted by a KeyboardInterrupt or a test timeout) is reconnected, or stopped and rebuilt.
Log levels and scheduler pools are ``session_conf``'s.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import sys

from sparkbeam.runner.errors import SparkSessionError
from sparkbeam.runner.options import DEFAULT_MASTER, SparkRunnerOptions
from sparkbeam.runner.spark import session_conf

_LOG = logging.getLogger(__name__)

_MASTER_PATTERNS = (
    r"local(\[(\*|\d+)(,\d+)?\])?",
    r"local-cluster\[\d+,\s*\d+,\s*\d+\]",
    r"spark://.+",
    r"yarn",
    r"k8s://.+",
    r"mesos://.+",
)
PROBE_TIMEOUT_S = 5.0


def check_master_url(master: str) -> None:
    if not any(re.fullmatch(p, master) for p in _MASTER_PATTERNS):
        raise SparkSessionError(
            f"--spark_master_url {master!r} is not a Spark master URL; use local[*], "
            "local[N], spark://host:port, yarn or k8s://https://host:port."
        )


def get_or_create_session(options: SparkRunnerOptions, job_name: str | None = None):
    """The session to run on: the live active one, spark-submit's, or a new one."""
    explicit = options.explicit_master_url()
    if explicit:
        check_master_url(explicit)
    active = live_active_session()
    if active is not None:
        source = "spark-submit" if _under_spark_submit() else "the active SparkSession"
        _check_same_master(explicit, active.sparkContext.master, source)
        session_conf.configure_running(active)
        return active
    submitted = submitted_conf()
    if submitted is not None:
        _check_same_master(explicit, submitted.get("spark.master"), "spark-submit")
        return _build(options, None, None, submitted)
    master = explicit or DEFAULT_MASTER
    probe_master(master)
    return _build(options, master, options.spark_app_name or job_name or "sparkbeam", {})


def target_master(options: SparkRunnerOptions) -> str:
    """The master a run will use: the live session's, spark-submit's, else the option's."""
    active = live_active_session()
    if active is not None:
        return active.sparkContext.master
    submitted = submitted_conf() or {}
    return submitted.get("spark.master") or options.explicit_master_url() or DEFAULT_MASTER


def submitted_conf() -> dict[str, str] | None:
    """spark-submit's conf (master, app name, ...) when this driver runs under it, else None.

    spark-submit starts the JVM first and passes its gateway to Python in
    ``PYSPARK_GATEWAY_PORT``; its ``--master``/``--name``/``--conf`` are the JVM's system
    properties, which ``SparkConf()`` loads."""
    if not _under_spark_submit():
        return None
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connect to spark-submit's JVM: SparkConf() reads it
    return dict(SparkConf().getAll())


def _under_spark_submit() -> bool:
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _check_same_master(explicit: str | None, actual: str | None, source: str) -> None:
    if explicit and actual and explicit != actual:
        raise SparkSessionError(
            f"--spark_master_url {explicit!r} disagrees with {source}'s master {actual!r}; "
            f"drop --spark_master_url or make the two the same."
        )


def probe_master(master: str) -> None:
    """Fail fast, in one line, when a ``spark://`` master does not accept connections."""
    if not master.startswith("spark://"):
        return
    errors = []
    for hostport in master[len("spark://") :].split(","):
        host, _, port = hostport.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S):
                return
        except (OSError, ValueError) as e:
            errors.append(f"{hostport}: {getattr(e, 'strerror', None) or e}")
    raise SparkSessionError(
        f"Spark master {master!r} is not reachable ({'; '.join(errors)}); start the master "
        "or fix --spark_master_url."
    )


def _build(options: SparkRunnerOptions, master, app_name, submitted: dict[str, str]):
    """Build the session: sparkbeam's defaults under what spark-submit or the user set."""
    from pyspark.sql import SparkSession

    # Executors' Python must be this interpreter: it has Beam and sparkbeam.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder
    if master is not None:
        builder = builder.master(master)
    if app_name is not None:
        builder = builder.appName(app_name)
    defaults = session_conf.default_conf(options.shuffle_parallelism())
    for key, value in defaults.items():
        if key not in submitted:
            builder = builder.config(key, value)
    for key, value in options.spark_conf_pairs():
        builder = builder.config(key, value)
    where = master or submitted.get("spark.master", "?")
    try:
        session = builder.getOrCreate()
    except Exception as e:  # noqa: BLE001 - py4j/JVM startup errors are opaque
        _LOG.debug("Spark start-up failed", exc_info=True)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SparkSessionError(
            f"Could not start Spark with master {where!r}: {first}. "
            "Check that Java 17+ is on PATH and the master is reachable."
        ) from None
    session_conf.configure_running(session)
    return session


def live_active_session():
    """The active SparkSession if its py4j link works; a broken link is mended or dropped."""
    try:
        return _active()
    except Exception as e:  # noqa: BLE001 - py4j desync shows as Py4JError, KeyError, ...
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    _LOG.warning("The Spark session's py4j link is broken (%s); reconnecting", reason)
    _reset_thread_connection()
    try:
        return _active()
    except Exception as e:  # noqa: BLE001 - the JVM is gone or unusable
        _LOG.warning("The Spark session is unusable (%s); stopping it and starting anew", e)
        _drop_session()
        return None


def _active():
    """The active (or default) session, after one round trip through py4j."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    sc = SparkContext._active_spark_context
    if sc is None:
        return None
    if sc._jsc.sc().isStopped():
        _drop_session()
        return None
    active = SparkSession.getActiveSession()
    # A new py4j connection is a new JVM thread, where no session is active yet.
    return active or SparkSession.builder.getOrCreate()


def _reset_thread_connection() -> None:
    """Close this thread's py4j connection (its stream may hold a stale answer)."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    client = getattr(gateway, "_gateway_client", None)
    if client is None:
        return
    if hasattr(client, "get_thread_connection"):  # pinned threads: one connection per thread
        connection = client.get_thread_connection()
        if connection is not None:
            connection.close(reset=True)
    else:
        client.close()


def _drop_session() -> None:
    """Stop the session and forget it (and a dead JVM), so the next build starts fresh."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    sc = SparkContext._active_spark_context
    try:
        if sc is not None:
            sc.stop()
    except Exception:  # noqa: BLE001 - stopping a broken session may fail too
        _LOG.debug("Stopping the broken session failed", exc_info=True)
    alive = False
    try:
        alive = SparkContext._jvm is not None and SparkContext._jvm.System.currentTimeMillis() > 0
    except Exception:  # noqa: BLE001 - the JVM is gone
        alive = False
    SparkContext._active_spark_context = None
    SparkSession._instantiatedSession = None
    SparkSession._activeSession = None
    if not alive:
        SparkContext._gateway = None
        SparkContext._jvm = None

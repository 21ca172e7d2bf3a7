"""The Spark session: spark-submit's, a live active one, or one built from the options.

Under ``spark-submit`` its master, app name and conf win (JVM system properties, which
``SparkConf()`` reads); sparkbeam adds its defaults only for keys left unset. A session whose
py4j link broke (an action interrupted by a KeyboardInterrupt or a test timeout) is
reconnected, or stopped and rebuilt. Log levels and scheduler pools are ``session_conf``'s.

With ``--spark_remote`` (or ``SPARK_REMOTE``) the session is a Spark Connect client
(``connect_session``), made with the Connect builder itself: pyspark is not switched into
Connect mode process-wide, so a classic session beside it keeps working (columns come from
``sql_functions(spark)``). Runs of the same code and conf share one server-side session
(``shared_url``), hence its warm Python workers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import socket
import sys
import uuid
from collections.abc import Sequence
from typing import Any

from sparkbeam.checkpoint.errors import first_line
from sparkbeam.runner.errors import SparkSessionError
from sparkbeam.runner.options import DEFAULT_MASTER, SparkRunnerOptions
from sparkbeam.runner.spark import context_session, session_conf, warm_workers, zygote
from sparkbeam.runner.spark.class_lookups import remember_class_lookups

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


def get_or_create_session(
    options: SparkRunnerOptions, job_name: str | None = None, code: Sequence[str] = ()
):
    """The session to run on: a Spark Connect server's, the live active one, spark-submit's,
    or a new one. ``code``: the names of the files a run ships (its Connect session's key)."""
    remote = options.remote_url()
    if remote:
        return connect_session(remote, _connect_conf(options), code)
    explicit = options.explicit_master_url()
    if explicit:
        check_master_url(explicit)
    active = live_active_session()
    if active is not None:
        source = "spark-submit" if _under_spark_submit() else "the active SparkSession"
        _check_same_master(explicit, active.sparkContext.master, source)
        session_conf.quiet_jvm(active.sparkContext)
        remember_class_lookups(active.sparkContext)
        return active
    submitted = submitted_conf()
    if submitted is not None:
        _check_same_master(explicit, submitted.get("spark.master"), "spark-submit")
        return _build(options, None, None, submitted)
    master = explicit or DEFAULT_MASTER
    probe_master(master)
    return _build(options, master, options.spark_app_name or job_name or script_name(), {})


def target_master(options: SparkRunnerOptions) -> str:
    """The master a run will use: the Connect server's, the live session's, spark-submit's,
    else the option's."""
    remote = options.remote_url()
    if remote:
        return server_master(remote)
    active = live_active_session()
    if active is not None:
        return active.sparkContext.master
    submitted = submitted_conf() or {}
    return submitted.get("spark.master") or options.explicit_master_url() or DEFAULT_MASTER


def connect_session(url: str, conf: dict[str, str] | None = None, code: Sequence[str] = ()):
    """A Spark Connect session at ``url`` with the runtime ``conf``, shared by runs that ship
    the same ``code`` and conf (``shared_url``); a clear error when nothing answers there."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    target = shared_url(url, conf or {}, code) if code else url
    session = _CONNECT_SESSIONS.get(target)
    if session is None or session.is_stopped:
        probe_remote(url)
        session = ConnectSession.builder.remote(target).create()
        try:
            version = session.version
            if url not in _ANNOUNCED:  # once per server, not per session
                _ANNOUNCED.add(url)
                _LOG.info("Spark Connect server %s runs Spark %s", url, version)
        except Exception as e:  # noqa: BLE001 - gRPC errors are long and opaque
            raise SparkSessionError(
                f"The Spark Connect server at {url!r} does not answer ({first_line(e)}); "
                "check the server, or start a local one with `sparkbeam serve`."
            ) from None
        _CONNECT_SESSIONS[target] = session
    for key, value in (conf or {}).items():
        session.conf.set(key, value)
    return session


_CONNECT_SESSIONS: dict[str, Any] = {}  # by URL: pyspark.sql.connect.session.SparkSession
_ANNOUNCED: set[str] = set()  # servers whose Spark version was logged


def shared_url(url: str, conf: dict[str, str], code: Sequence[str]) -> str:
    """``url`` with a session id derived from the shipped files' names (each names its
    content) and the conf, unless the URL names a session itself.

    One code and conf, one session: its Python workers (and their cached bundle processors)
    serve the next run, and a changed module never meets a stale copy on ``sys.path``."""
    if "session_id=" in url:
        return url
    key = json.dumps([sorted(code), sorted(conf.items())]).encode()
    session_id = uuid.UUID(bytes=hashlib.sha256(key).digest()[:16], version=4)
    separator = ";" if "/;" in url else ("" if url.endswith("/") else "/") + ";"
    return f"{url}{separator}session_id={session_id}"


def server_master(url: str) -> str:
    """The Connect server's Spark master, asked through a session this process has open there,
    else through one opened for the question and stopped after it (a run then opens its own,
    ``shared_url``)."""
    open_ = [s for t, s in _CONNECT_SESSIONS.items() if _on(t, url) and not s.is_stopped]
    session = open_[0] if open_ else connect_session(url)
    try:
        return session.conf.get("spark.master", "?")
    finally:
        # A released session id cannot be used again; one the URL names is the user's own,
        # which the run uses too: kept.
        if not open_ and "session_id=" not in url:
            stop_connect_sessions(url)


def stop_connect_sessions(url: str) -> None:
    """Stop this process's sessions on the server at ``url`` (before the server stops: an open
    client's exit-time cleanup retries against a dead server for minutes)."""
    for target in [t for t in _CONNECT_SESSIONS if _on(t, url)]:
        session = _CONNECT_SESSIONS.pop(target)
        if session.is_stopped:
            continue
        try:
            session.stop()
        except Exception as e:  # noqa: BLE001 - the server may already be gone
            _LOG.debug("Stopping the Connect session on %s: %s", url, e)


def _on(target: str, url: str) -> bool:
    """Whether a session's URL (``url`` itself, or with a session id) is on server ``url``."""
    return target == url or target.startswith(url.rstrip("/") + "/")


def probe_remote(url: str) -> None:
    """Fail fast, in one line, when nothing listens at a Spark Connect URL (the client itself
    retries for minutes)."""
    from pyspark.sql.connect.client import DefaultChannelBuilder

    endpoint = DefaultChannelBuilder(url).endpoint
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_TIMEOUT_S):
            return
    except OSError as e:
        reason = e.strerror or str(e)
    raise SparkSessionError(
        f"No Spark Connect server answers at {url!r} ({endpoint}: {reason}); start one with "
        "`sparkbeam serve` (it prints the URL to use), or check the server and --spark_remote."
    )


def _connect_conf(options: SparkRunnerOptions) -> dict[str, str]:
    """What a run sets in its Connect session: --parallelism and --spark_conf (runtime conf;
    the server's static conf is set where it starts)."""
    conf = {}
    if options.shuffle_parallelism():
        conf["spark.sql.shuffle.partitions"] = str(options.shuffle_parallelism())
    conf.update(options.spark_conf_pairs())
    return conf


def is_connect(spark) -> bool:
    """Whether ``spark`` is a Spark Connect session (no SparkContext, no RDDs)."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    return isinstance(spark, ConnectSession)


def sql_functions(spark):
    """``pyspark.sql.functions`` for a classic session, its Connect twin for a Connect one
    (pyspark picks by process-wide mode, which sparkbeam does not switch)."""
    if is_connect(spark):
        from pyspark.sql.connect import functions
    else:
        from pyspark.sql import functions
    return functions


_PARALLELISM: dict[str, int] = {}


def default_parallelism(spark) -> int:
    """Spark's default parallelism; on Connect (no SparkContext) the server's
    ``spark.default.parallelism``, else ``spark.range``'s partition count (one tiny query,
    once per session)."""
    if not is_connect(spark):
        return spark.sparkContext.defaultParallelism
    cached = _PARALLELISM.get(spark.session_id)
    if cached is None:
        conf = spark.conf.get("spark.default.parallelism", None)
        cached = int(conf) if conf else _range_partitions(spark)
        _PARALLELISM[spark.session_id] = cached
    return cached


def _range_partitions(spark) -> int:
    """How many partitions ``spark.range`` gets: every one holds rows of a long range."""
    from pyspark.sql.connect import functions as F

    ids = spark.range(0, 1 << 20).select(F.spark_partition_id().alias("p"))
    return int(ids.agg(F.max("p")).first()[0]) + 1


def submitted_conf() -> dict[str, str] | None:
    """spark-submit's conf (master, app name, ...) when this driver runs under it (its JVM's
    gateway in ``PYSPARK_GATEWAY_PORT``), else None."""
    if not _under_spark_submit():
        return None
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connect to spark-submit's JVM: SparkConf() reads it
    return dict(SparkConf().getAll())


def _jvm_running() -> bool:
    """Whether this process has a JVM already (its own, or spark-submit's)."""
    from pyspark import SparkContext

    return SparkContext._gateway is not None or _under_spark_submit()


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


def script_name() -> str:
    """The application's default name: the main script's (``wordcount`` for wordcount.py),
    else ``sparkbeam`` (``python -c``, an interactive session)."""
    name = os.path.splitext(os.path.basename(sys.argv[0] if sys.argv else ""))[0]
    return "sparkbeam" if name in ("", "-c", "-m", "__main__") else name


def _build(options: SparkRunnerOptions, master, app_name, submitted: dict[str, str]):
    """Build the session: sparkbeam's defaults under what spark-submit or the user set."""
    user_conf = dict(options.spark_conf_pairs())
    # Executors' Python: --spark_conf spark.pyspark.python (PySpark reads only the environment
    # variable; spark-submit sets it from its conf), else PYSPARK_PYTHON, else this interpreter:
    # it has Beam and sparkbeam.
    if python := user_conf.get("spark.pyspark.python"):
        os.environ["PYSPARK_PYTHON"] = python
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    settings = {}
    if master is not None:
        settings["spark.master"] = master
    if app_name is not None:
        settings["spark.app.name"] = app_name
    defaults = session_conf.default_conf(options.shuffle_parallelism())
    defaults.update(session_conf.local_jvm_conf(master, _jvm_running()))
    settings.update({k: v for k, v in defaults.items() if k not in submitted})
    settings.update(user_conf)
    where = master or submitted.get("spark.master", "?")
    try:
        from pyspark import SparkConf, SparkContext

        # A JVM about to start on this host forks its worker daemon from a warm zygote.
        warm = None
        if SparkContext._gateway is None and session_conf.is_local_master(master):
            if settings.get("spark.python.daemon.module") == session_conf.DAEMON_MODULE:
                warm = zygote.spawn()
        try:
            # SparkConf() reads spark-submit's settings (JVM system properties) under ours.
            sc = SparkContext.getOrCreate(SparkConf().setAll(list(settings.items())))
        except BaseException:
            if warm is not None:
                zygote.abandon(warm)
            raise
        finally:
            zygote.launched()
        session_conf.quiet_jvm(sc)  # a failed warm-up stays quiet too
        remember_class_lookups(sc)
        session_conf.remove_accumulator_socket_at_exit(sc)
        if session_conf.is_local_master(master):  # the Python daemon starts while the driver plans
            warm_workers.start(sc)
        session = context_session.for_context(sc)  # the SQL session only when needed
    except Exception as e:  # noqa: BLE001 - py4j/JVM startup errors are opaque
        _LOG.debug("Spark start-up failed", exc_info=True)
        raise SparkSessionError(
            f"Could not start Spark with master {where!r}: {first_line(e).rstrip('.')}. "
            "Check that Java 17+ is on PATH and the master is reachable."
        ) from None
    return session


def live_active_session():
    """The active SparkSession if its py4j link works; a broken link is mended or dropped."""
    try:
        return _active()
    except Exception as e:  # noqa: BLE001 - py4j desync shows as Py4JError, KeyError, ...
        reason = first_line(e)
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
    stand_in = context_session.existing(sc)
    if stand_in is not None and not stand_in.built:
        return stand_in  # a context sparkbeam built, whose SQL session nobody needed yet
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
            context_session.forget(sc)
            sc.stop()
    except Exception:  # noqa: BLE001 - stopping a broken session may fail too
        _LOG.debug("Stopping the broken session failed", exc_info=True)
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

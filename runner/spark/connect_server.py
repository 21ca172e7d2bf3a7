"""A local Spark Connect server from the installed pyspark: start it, wait for it, stop it.

Owns the server's command line (pyspark's ``spark-submit`` running ``SparkConnectServer``), its
conf (127.0.0.1 only, this interpreter's workers, ``session_conf``'s defaults), the bounded wait
until it answers, and stopping its process group. ``sparkbeam serve`` runs one in the
foreground. Leaves to others: connecting a pipeline to it (``session``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from sparkbeam.runner.errors import SparkSessionError
from sparkbeam.runner.processes import stop_process_group
from sparkbeam.runner.spark import session_conf

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_PORT = 15002  # Spark Connect's own default: ``sc://localhost`` reaches it
DEFAULT_MASTER = "local[*]"
HOST = "127.0.0.1"
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 20.0


class ConnectServerError(SparkSessionError):
    """A local Spark Connect server could not be started."""


@dataclass
class ConnectServer:
    """A running local Spark Connect server (its own process group) and where it logs."""

    url: str
    port: int
    master: str
    log_path: Path
    proc: subprocess.Popen = field(repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop this process's sessions on it, then SIGTERM the server's process group (JVM
        and Python workers), then SIGKILL."""
        from sparkbeam.runner.spark.session import stop_connect_sessions

        stop_connect_sessions(self.url)
        stop_process_group(self.proc, timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def server_conf(
    master: str, port: int, python: str = sys.executable, worker_daemon: bool = True
) -> dict[str, str]:
    """The server's Spark conf: sparkbeam's session defaults, loopback only, ``python`` workers
    (``worker_daemon=False``: pyspark's stock daemon, for a ``python`` without sparkbeam)."""
    conf = session_conf.default_conf(None)
    if not worker_daemon:
        conf.pop("spark.python.daemon.module")
    conf.update(
        {
            "spark.master": master,
            "spark.app.name": "sparkbeam-connect",
            "spark.connect.grpc.binding.address": HOST,
            "spark.connect.grpc.binding.port": str(port),
            "spark.driver.host": HOST,
            "spark.driver.bindAddress": HOST,
            "spark.pyspark.python": python,
            "spark.pyspark.driver.python": python,
            # As pyspark's own local Connect server: each session's artifacts apart.
            "spark.sql.artifact.isolation.enabled": "true",
            "spark.sql.artifact.isolation.alwaysApplyClassloader": "true",
        }
    )
    return conf


def server_command(conf: dict[str, str]) -> list[str]:
    """``spark-submit --class SparkConnectServer`` of the installed pyspark, with ``conf``."""
    from pyspark.find_spark_home import _find_spark_home

    submit = Path(_find_spark_home()) / "bin" / "spark-submit"
    cmd = [str(submit), "--class", SERVER_CLASS]
    for key, value in conf.items():
        cmd += ["--conf", f"{key}={value}"]
    return [*cmd, "spark-internal"]


def start_server(
    master: str = DEFAULT_MASTER,
    port: int | None = None,
    log_dir: str | Path | None = None,
    python: str = sys.executable,
    worker_daemon: bool = True,
    extra_conf: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    timeout: float = START_TIMEOUT_S,
) -> ConnectServer:
    """Start a server on 127.0.0.1:``port`` (default: a free one) and wait until it answers
    (else ConnectServerError naming its log). It runs in ``log_dir`` (default: a new temporary
    folder), so its workers' ``sys.path`` gets neither this folder nor this ``PYTHONPATH``."""
    check_java()
    port = port or free_port()
    _check_port_free(port)
    work = Path(log_dir or tempfile.mkdtemp(prefix="sparkbeam-connect-"))
    work.mkdir(parents=True, exist_ok=True)
    log_path = work / "connect-server.log"
    conf = {**server_conf(master, port, python, worker_daemon), **(extra_conf or {})}
    environment = {k: v for k, v in os.environ.items() if k not in _CLIENT_ONLY_ENV}
    environment.update({"PYSPARK_PYTHON": python, "SPARK_LOCAL_IP": HOST, **(env or {})})
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            server_command(conf),
            cwd=work,
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stopped together, Ctrl-C spared
        )
    server = ConnectServer(f"sc://{HOST}:{port}", port, master, log_path, proc)
    try:
        wait_until_ready(server, timeout)
    except BaseException:
        server.stop()
        raise
    return server


# What makes the client process the client: a server started from it must not inherit it.
_CLIENT_ONLY_ENV = {
    "PYTHONPATH",
    "SPARK_REMOTE",
    "SPARK_CONNECT_MODE_ENABLED",
    "SPARK_LOCAL_REMOTE",
    "PYSPARK_GATEWAY_PORT",
    "PYSPARK_GATEWAY_SECRET",
    "MASTER",
}


def wait_until_ready(server: ConnectServer, timeout: float) -> float:
    """Wait until the server answers a Connect client; returns the seconds it took."""
    started = time.monotonic()
    deadline = started + timeout
    while True:
        if server.proc.poll() is not None:
            raise ConnectServerError(
                f"The Spark Connect server (master {server.master!r}) exited with code "
                f"{server.proc.returncode} before answering: {_log_hint(server.log_path)}"
            )
        if _answers(server.url):
            return time.monotonic() - started
        if time.monotonic() > deadline:
            raise ConnectServerError(
                f"The Spark Connect server did not answer on {server.url} within {timeout:.0f} "
                f"s; see its log {str(server.log_path)!r}."
            )
        time.sleep(0.25)


def _answers(url: str) -> bool:
    """Whether a Connect client gets the server's Spark version (one RPC, no retries)."""
    host, port = url[len("sc://") :].rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            pass
    except OSError:
        return False
    from pyspark.sql.connect.client import SparkConnectClient

    client = SparkConnectClient(url, retry_policy={"max_retries": 0})
    try:
        with warnings.catch_warnings():  # "RETRIES_EXCEEDED" for each try before it serves
            warnings.simplefilter("ignore")
            client._analyze(method="spark_version")
        return True
    except Exception:  # noqa: BLE001 - not serving yet (UNAVAILABLE and the like)
        return False
    finally:
        client.close()


def _log_hint(log_path: Path) -> str:
    """The log's telling line (Java missing or too old, port taken...) and its path."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    telling = ("Exception", "Error", "JAVA_HOME", "java:")
    found = [ln.strip() for ln in lines if any(t in ln for t in telling)]
    if any("UnsupportedClassVersionError" in ln for ln in found):
        return f"Spark 4 needs Java 17+ (see {str(log_path)!r}); put Java 17+ first on PATH."
    first = f"{found[0]} " if found else ""
    return f"{first}(see its log {str(log_path)!r})."


def check_java() -> None:
    """A clear error when no ``java`` is there for spark-submit to run."""
    home = os.environ.get("JAVA_HOME")
    if (home and Path(home, "bin", "java").exists()) or shutil.which("java"):
        return
    raise ConnectServerError(
        "A Spark Connect server needs Java 17+ (Spark runs in a JVM) and no `java` was found; "
        "install one (e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME."
    )


def _check_port_free(port: int) -> None:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError as e:
            raise ConnectServerError(
                f"Port {HOST}:{port} is taken ({e.strerror}): another server (a running "
                "`sparkbeam serve`?) listens there; use it with "
                f"--spark_remote=sc://{HOST}:{port}, or pick another --port."
            ) from None

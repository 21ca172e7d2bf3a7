"""A real Spark standalone cluster on 127.0.0.1: one master and its workers, from pyspark's jars.

Owns: starting the master and workers with the pyspark package's ``bin/spark-class`` (each a
subprocess in its own process group, with its own log file), reading the master's JSON
status, killing and restarting a worker, and stopping everything by PID. Every process it
starts (and the executors and Python workers those start) carries `tests.servers.MARKER_ENV`, so
`tests.servers.leftover_processes` can prove that nothing outlives the cluster. Workers run
from their own work directory with no ``PYTHONPATH``: they cannot import the tests' modules, so
a test that needs user code on an executor really tests shipping it. Leaves to others: the
drivers (`tests.cluster.drivers`) and the pytest fixture (``conftest.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import TEST_JVM_OPTIONS
from tests.servers import free_port, leftover_processes, server_env, stop_process_group

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
START_TIMEOUT_S = 180.0  # JVM start-up on a loaded 2-core machine takes tens of seconds


def spark_home() -> Path:
    """The pyspark package's directory: its jars and ``bin/`` are a complete Spark."""
    import pyspark

    return Path(pyspark.__file__).parent


def spark_env(base_dir: Path, role: str) -> dict[str, str]:
    """Environment of a cluster daemon: loopback only, no user PYTHONPATH, local dirs here."""
    env = server_env(role)
    env.pop("PYTHONPATH", None)
    conf_dir = base_dir / "conf"  # empty: no spark-defaults.conf or spark-env.sh of the host
    conf_dir.mkdir(parents=True, exist_ok=True)
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_CONF_DIR=str(conf_dir),
        SPARK_LOCAL_DIRS=str(base_dir / "local"),
        SPARK_NO_DAEMONIZE="1",
        SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
        SPARK_DAEMON_MEMORY="512m",
    )
    return env


def _spawn(cmd: list[str], env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen:
    cwd.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


@dataclass
class StandaloneCluster:
    """A running master and its workers; ``url`` is what ``--spark_master_url`` takes."""

    base_dir: Path
    port: int
    webui_port: int
    master: subprocess.Popen
    workers: list[subprocess.Popen | None] = field(default_factory=list)
    restarts: int = 0

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    # --- status ------------------------------------------------------------------

    def status(self) -> dict:
        """The master's ``/json`` document (workers, active and completed apps)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.webui_port}/json", timeout=5) as r:
            return json.load(r)

    def alive_workers(self) -> int:
        return sum(1 for w in self.status()["workers"] if w["state"] == "ALIVE")

    def apps(self, name: str) -> list[dict]:
        """Active and completed applications called ``name`` (spark.app.name / --name)."""
        doc = self.status()
        return [a for a in doc["activeapps"] + doc["completedapps"] if a["name"] == name]

    def wait_for_workers(self, count: int, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                alive = self.alive_workers()
            except OSError:
                alive = -1
            if alive == count:
                return
            dead = [p.pid for p in [self.master, *self.workers] if p and p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(
                    f"standalone cluster at {self.url}: {alive} ALIVE worker(s), want {count}"
                    f" (exited: {dead}); see the logs in {self.base_dir}"
                )
            time.sleep(0.5)

    # --- workers -------------------------------------------------------------------

    def start_worker(self, index: int) -> None:
        """Start worker ``index`` (1 core, 1g) in a fresh work directory."""
        self.restarts += 1
        name = f"worker-{index}"
        work = self.base_dir / f"{name}-run{self.restarts}"
        cmd = [
            str(spark_home() / "bin" / "spark-class"), WORKER_CLASS, self.url,
            "--cores", "1", "--memory", "1g", "--host", "127.0.0.1",
            "--webui-port", str(free_port()), "--work-dir", str(work),
        ]  # fmt: skip
        env = spark_env(self.base_dir, name)
        # Its executors inherit it, whatever launched the app (spark-submit, a Python driver,
        # a Connect server): the tests' JVM options (35 -> 17 CPU-s for one small app's two).
        env["JAVA_TOOL_OPTIONS"] = TEST_JVM_OPTIONS
        proc = _spawn(cmd, env, work, self.base_dir / f"{name}.log")
        while len(self.workers) <= index:
            self.workers.append(None)
        self.workers[index] = proc

    def ensure_workers(self) -> None:
        """Restart any killed worker; return once every worker is ALIVE."""
        for i, proc in enumerate(self.workers):
            if proc is None:
                self.start_worker(i)
        self.wait_for_workers(len(self.workers))

    def kill_worker(self, index: int) -> None:
        """SIGKILL worker ``index`` with its executor and Python workers (no clean shutdown)."""
        proc = self.workers[index]
        assert proc is not None, f"worker {index} is not running"
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(30)
        for pid, _ in leftover_processes(role=f"worker-{index}"):
            _kill(pid)  # a Python daemon in a process group of its own
        self.workers[index] = None

    # --- life cycle ------------------------------------------------------------------

    def stop(self) -> list[tuple[int, str]]:
        """Stop workers then master by PID; returns what was still alive after (killed too)."""
        for proc in [*self.workers, self.master]:
            if proc is not None:
                stop_process_group(proc, timeout=30)
        left = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            left = leftover_processes(role_prefix=("master", "worker-"))
            if not left:
                break
            time.sleep(0.5)
        for pid, _ in left:
            _kill(pid)
        return left


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def start_cluster(base_dir: Path, workers: int = 2) -> StandaloneCluster:
    """Start a master and ``workers`` workers; return once the master shows them ALIVE."""
    base_dir.mkdir(parents=True, exist_ok=True)
    port, webui = free_port(), free_port()
    cmd = [
        str(spark_home() / "bin" / "spark-class"), MASTER_CLASS, "--host", "127.0.0.1",
        "--port", str(port), "--webui-port", str(webui),
    ]  # fmt: skip
    master_dir = base_dir / "master"
    master = _spawn(cmd, spark_env(base_dir, "master"), master_dir, base_dir / "master.log")
    cluster = StandaloneCluster(base_dir, port, webui, master)
    try:
        cluster.wait_for_workers(0)
        for i in range(workers):
            cluster.start_worker(i)
        cluster.wait_for_workers(workers)
    except BaseException:
        cluster.stop()
        raise
    return cluster

"""What sparkbeam configures in a Spark session: its defaults, scheduler pool, and log levels;
and where a master's executors run (``is_local_master``, ``executors_on_this_host``).

The JVM loggers that print a stack trace per failed task attempt or lost connection are off
unless the ``sparkbeam`` logger is at DEBUG: sparkbeam reports a failure itself, in one block.
Rounds run in one declared FAIR pool (``POOL``), so Spark never warns of an unconfigured one.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import logging
import os
import socket
import tempfile

POOL = "sparkbeam"
DAEMON_MODULE = "sparkbeam.runner.spark.daemon"  # the warm Python worker daemon


def is_local_master(master: str | None) -> bool:
    """Whether ``master`` runs the executor in the driver's JVM (``local``, ``local[N]``...):
    its Python workers share the driver's host, interpreter and files."""
    return master is not None and (master == "local" or master.startswith("local["))


def executors_on_this_host(master: str) -> bool:
    """Whether every executor of ``master`` runs on this host: a local master, or
    ``local-cluster[...]`` (executors in JVMs of their own, on this host)."""
    master = master.strip()
    return is_local_master(master) or master.startswith("local-cluster[")


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (a URL's) names this machine: ``localhost``, ``::1`` or ``127.*``."""
    return host in ("localhost", "::1") or (host or "").startswith("127.")


# JVM loggers whose warnings repeat, with Java frames, what sparkbeam reports in one line.
_QUIET_JVM = {
    "org.apache.spark.executor.Executor": "OFF",  # "Exception in task ..." + frames
    "org.apache.spark.scheduler.TaskSetManager": "OFF",  # "Lost task ..." per attempt
    "org.apache.spark.storage.BlockManager": "ERROR",  # "Putting block ... failed"
    "org.apache.spark.storage.BlockManagerMaster": "ERROR",
    "org.apache.spark.storage.BlockManagerMasterEndpoint": "ERROR",
    "org.apache.spark.scheduler.FairSchedulableBuilder": "ERROR",
    "org.apache.spark.network.server.TransportChannelHandler": "OFF",
    "org.apache.spark.network.server.TransportRequestHandler": "OFF",
    "org.apache.spark.network.client.TransportResponseHandler": "OFF",
    "org.apache.spark.rpc.netty.NettyRpcEnv": "ERROR",
    "org.apache.spark.rpc.netty.Dispatcher": "ERROR",
    "org.apache.spark.deploy.client.StandaloneAppClient$ClientEndpoint": "ERROR",
    "org.apache.spark.scheduler.cluster.StandaloneSchedulerBackend": "ERROR",
    "org.apache.spark.api.python.PythonRunner": "ERROR",
}
_ALLOCATIONS = f"""<?xml version="1.0"?>
<allocations>
  <pool name="{POOL}">
    <schedulingMode>FAIR</schedulingMode>
    <weight>1</weight>
    <minShare>0</minShare>
  </pool>
</allocations>
"""


def default_conf(parallelism: int | None) -> dict[str, str]:
    """sparkbeam's Spark defaults (a user's or spark-submit's value for a key wins)."""
    return {
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(parallelism or 8),
        "spark.python.worker.reuse": "true",
        "spark.python.daemon.module": DAEMON_MODULE,
        # Pipelines' rounds share one FAIR pool: concurrent rounds get fair shares.
        "spark.scheduler.mode": "FAIR",
        "spark.scheduler.allocation.file": allocation_file(),
        "spark.sql.pyspark.jvmStacktrace.enabled": "false",
        **BOUNDED_HISTORY,
        **worker_socket_conf(),
    }


# The JVM of a local master schedules rounds and moves bytes to and from the Python workers,
# which do the work. Its optimizing compiler (C2) spent 12.6 of the JVM's 24 CPU-s over a
# minute of a 15,000 records/s streaming job on 2 cores, compiling code that runs for
# milliseconds a round; with C1 alone the JVM used 42% less CPU and word count ran as fast
# (benchmarks/RESULTS.md, "The local JVM"). A user's spark.driver.extraJavaOptions replaces it.
LOCAL_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"


def local_jvm_conf(master: str | None, jvm_running: bool) -> dict[str, str]:
    """The driver JVM's options when this process is about to start it for a local master
    (none when a JVM runs already, or the executors run elsewhere: theirs are not ours)."""
    if jvm_running or not is_local_master(master):
        return {}
    return {"spark.driver.extraJavaOptions": LOCAL_JVM_OPTIONS}


# A streaming job runs a Spark job or more a round, forever. Spark's UI keeps the last 1,000
# jobs, 1,000 stages and 100,000 tasks: the driver's JVM grows until it holds that many (20
# minutes or more of rounds); these keep the last few minutes. The cleaner's periodic GC frees
# the shuffle files and broadcasts of finished rounds every 5 minutes instead of 30.
BOUNDED_HISTORY = {
    "spark.ui.retainedJobs": "200",
    "spark.ui.retainedStages": "400",
    "spark.ui.retainedTasks": "10000",
    "spark.sql.ui.retainedExecutions": "200",
    "spark.cleaner.periodicGC.interval": "5min",
}


def worker_socket_conf() -> dict[str, str]:
    """Unix domain sockets between each JVM and its Python workers (same host, cluster or
    not), where PySpark has them (4.1+): over TCP loopback every Python task waited ~20 ms."""
    import pyspark

    version = tuple(int(part) for part in pyspark.__version__.split(".")[:2])
    if not hasattr(socket, "AF_UNIX") or version < (4, 1):
        return {}
    return {"spark.python.unix.domain.socket.enabled": "true"}


def remove_accumulator_socket_at_exit(sc) -> None:
    """PySpark removes its accumulator server's Unix socket file only in ``SparkContext.stop``,
    which a driver that exits with its session open (kept for the next run) never calls: one
    file a run in the JVM's temp directory. Remove it at exit, stopped or not."""
    path = getattr(getattr(sc, "_accumulatorServer", None), "server_address", None)
    if isinstance(path, str):  # a socket path, not a TCP (host, port)
        atexit.register(_remove_quietly, path)


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass  # stopped: PySpark removed it


@functools.cache
def allocation_file() -> str:
    """A fair-scheduler file declaring ``POOL``: one per user and content, never removed, so
    killed drivers leave no new file each."""
    digest = hashlib.sha256(_ALLOCATIONS.encode()).hexdigest()[:12]
    path = os.path.join(tempfile.gettempdir(), f"sparkbeam-pools-{os.getuid()}-{digest}.xml")
    if not os.path.exists(path):
        fd, tmp = tempfile.mkstemp(prefix="sparkbeam-pools-", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(_ALLOCATIONS)
        os.replace(tmp, path)  # whole or absent, for a driver starting beside this one
    return path


def quiet_jvm(sc) -> None:
    """Quiet the JVM and py4j loggers that duplicate sparkbeam's reports (not at DEBUG)."""
    if logging.getLogger("sparkbeam").isEnabledFor(logging.DEBUG):
        return
    py4j = logging.getLogger("py4j")
    if py4j.level == logging.NOTSET:
        py4j.setLevel(logging.CRITICAL)  # its connection errors reach the user as exceptions
    try:
        jvm = sc._jvm
        configurator = jvm.org.apache.logging.log4j.core.config.Configurator
        level = jvm.org.apache.logging.log4j.Level
        for name, value in _QUIET_JVM.items():
            configurator.setLevel(name, level.getLevel(value))
    except Exception:  # noqa: BLE001 - another logging backend: leave Spark's levels alone
        logging.getLogger(__name__).debug("Could not set Spark's log levels", exc_info=True)

"""Builds a sparkbeam session on a local master and reports what the warm-up did: its thread,
its job, and whether the worker daemon (a grandchild of this process) is running; and whether
the JVM's SQL session was built (only when something asks for it)."""

from __future__ import annotations

import os
import sys
import threading
import time

from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.runner.options import SparkRunnerOptions
from sparkbeam.runner.spark import warm_workers
from sparkbeam.runner.spark.session import get_or_create_session


def _daemons_under(root: int) -> list[int]:
    """PIDs of sparkbeam worker daemons (and the workers they forked) under ``root``."""
    parent, daemons = {}, []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                parent[pid] = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"-m\x00sparkbeam.runner.spark.daemon" in f.read():  # not the JVM's conf
                    daemons.append(pid)
        except OSError:
            continue
    found = []
    for pid in daemons:
        up = parent.get(pid, 0)
        while up > 1 and up != root:
            up = parent.get(up, 0)
        if up == root:
            found.append(pid)
    return found


def _daemon(_):
    """In a task: the module the worker's parent (the daemon) was started as, and how much of
    the heap it froze before forking."""
    import gc

    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        argv = f.read().split(b"\x00")
    yield argv[argv.index(b"-m") + 1].decode(), gc.get_freeze_count()


def children(parent: int, marker: bytes) -> list[int]:
    """PIDs of ``parent``'s children whose command line contains ``marker``."""
    found = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if ppid == parent and marker in f.read():
                    found.append(pid)
        except OSError:
            continue
    return found


if __name__ == "__main__":
    options = PipelineOptions([f"--spark_master_url={sys.argv[1]}"]).view_as(SparkRunnerOptions)
    session = get_or_create_session(options)
    warm = [t for t in threading.enumerate() if t.name == "sparkbeam-warm-workers"]
    for t in warm:
        t.join(300)
    tracker = session.sparkContext.statusTracker()
    jobs = [tracker.getJobInfo(j).status for j in tracker.getJobIdsForGroup(warm_workers.GROUP)]
    print("WARM_THREADS", len(warm))
    print("JOBS", ",".join(jobs))
    print("DAEMONS", len(_daemons_under(os.getpid())))
    ((module, frozen),) = session.sparkContext.parallelize([0], 1).mapPartitions(_daemon).collect()
    print("DAEMON_MODULE", module)  # which code forked the task's worker
    print("WORKER_FROZEN", frozen > 100_000)
    zygote = b"-m\x00sparkbeam.runner.spark.zygote"
    deadline = time.monotonic() + 10  # it exits after it forked, without being waited for
    while children(os.getpid(), zygote) and time.monotonic() < deadline:
        time.sleep(0.1)
    print("ZYGOTES_LEFT", len(children(os.getpid(), zygote)))
    from pyspark.sql import SparkSession

    sc = session.sparkContext
    print("DRIVER_JAVA_OPTIONS", sc.getConf().get("spark.driver.extraJavaOptions"))
    runtime = sc._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    print("JVM_ARGS", " ".join(runtime.getInputArguments()))
    print("SQL_SESSION_BUILT", SparkSession._instantiatedSession is not None)
    print("SAME_STAND_IN", get_or_create_session(options) is session)
    print("SQL_CONF", session.conf.get("spark.sql.shuffle.partitions"))  # builds it
    built = SparkSession._instantiatedSession
    print("SAME_CONTEXT", built is not None and built.sparkContext is session.sparkContext)
    session.stop()

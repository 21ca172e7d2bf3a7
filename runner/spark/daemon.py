"""A PySpark worker daemon that imports Beam once, before forking workers.

PySpark forks each Python worker from a daemon process. With the stock
daemon every new worker imports Beam again (seconds of CPU); this one
imports the SDK and sparkbeam's task code first, so forked workers start
warm. Used via ``spark.python.daemon.module`` when sparkbeam creates the
SparkSession. Importing does not start gRPC threads, so forking stays safe.
Two per-task costs of PySpark's worker loop are taken off here, before forking:

- a reused worker runs ``gc.collect()`` after every task, a full collection that walks every
  object Beam's import made (~60 ms per task): ``gc.freeze()`` moves what exists at fork time
  into the permanent generation, which collections skip (and whose pages forks then share);
- ``importlib.invalidate_caches()`` at every task start re-reads unchanged zip archives
  (``zip_caches``: ~0.13 s per task on Python 3.11).

And one noise: when the application stops, the JVM closes the sockets of idle reused workers;
the stock worker's last flush then raised ``BrokenPipeError`` and the daemon printed its
traceback after the run's last line (in a few runs of ten). A worker whose JVM end is gone
has no one to report to: ``worker`` lets it go quietly.

Where PySpark's stock daemon forked the worker instead (a Spark Connect server that does not have
sparkbeam installed), sparkbeam's first task in it does the same (``settle_worker``).

On a local master the imports happen while the JVM starts, in a ``zygote`` the driver started,
which then forks the daemon for the JVM; elsewhere, here.
"""

import gc
import sys

from sparkbeam.runner.spark import zygote

_stock_worker = None  # PySpark's worker loop, wrapped by ``worker``


def preload() -> None:
    """What every forked worker should find imported and frozen (here, or in a ``zygote``)."""
    global _stock_worker
    import apache_beam.runners.worker.bundle_processor  # noqa: F401
    import apache_beam.runners.worker.sdk_worker  # noqa: F401
    from pyspark import daemon

    import sparkbeam.runner.rounds.edges  # noqa: F401
    import sparkbeam.runner.task.bundle_executor  # noqa: F401
    from sparkbeam.runner.spark import zip_caches

    if _stock_worker is None:
        _stock_worker = daemon.worker
    zip_caches.install()
    gc.collect()
    gc.freeze()


def settle_worker() -> None:
    """``preload`` once in this worker, if its daemon did not (idempotent, cheap after).

    A Spark Connect server that does not have sparkbeam installed forks workers from PySpark's
    stock daemon, and pyspark and sparkbeam come from zips there: each task's zip re-reads
    took 0.2-0.4 s on Python 3.11 and each reused worker's full collection walked all of Beam.
    sparkbeam's tasks call this first (``plane.frames``), so a reused worker pays once."""
    if _stock_worker is None:
        preload()


def worker(sock, authenticated):
    """PySpark's worker loop for one task; 1 (let the worker go) if the JVM closed its end."""
    settle_worker()
    try:
        return _stock_worker(sock, authenticated)
    except (BrokenPipeError, ConnectionResetError):
        return 1


def serve() -> None:
    """PySpark's daemon loop, forking ``worker``s, for the worker module the JVM named."""
    import importlib

    from pyspark import daemon

    if len(sys.argv) > 1 and sys.argv[1].startswith("pyspark"):  # as pyspark.daemon decides
        daemon.worker_main = importlib.import_module(sys.argv[1]).main
    daemon.worker = worker  # manager() looks it up at each fork
    daemon.manager()


if __name__ == "__main__":
    if not zygote.hand_over():  # a local driver's zygote imported all this while the JVM started
        preload()
        serve()

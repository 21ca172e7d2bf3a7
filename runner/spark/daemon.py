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
"""

import gc

import apache_beam.runners.worker.bundle_processor  # noqa: F401
import apache_beam.runners.worker.sdk_worker  # noqa: F401
from pyspark import daemon

import sparkbeam.runner.rounds.edges  # noqa: F401
import sparkbeam.runner.task.bundle_executor  # noqa: F401
from sparkbeam.runner.spark import zip_caches

_stock_worker = daemon.worker


def worker(sock, authenticated):
    """PySpark's worker loop for one task; 1 (let the worker go) if the JVM closed its end."""
    try:
        return _stock_worker(sock, authenticated)
    except (BrokenPipeError, ConnectionResetError):
        return 1


if __name__ == "__main__":
    daemon.worker = worker  # manager() looks it up at each fork
    zip_caches.install()
    gc.collect()
    gc.freeze()
    daemon.manager()

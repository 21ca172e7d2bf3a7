"""A PySpark worker daemon (``spark.python.daemon.module``) that imports Beam once, before
forking workers, which the stock daemon's workers each did again (seconds of CPU). Importing
starts no gRPC threads, so forking stays safe. Before forking it also takes off two per-task
costs of PySpark's worker loop:

- a reused worker's full ``gc.collect()`` after every task walked all of Beam (~60 ms):
  ``gc.freeze()`` puts what exists at fork time where collections skip it, and
  ``PacedCollections`` runs that collection at most every ``FULL_COLLECTION_EVERY_S`` (what
  the worker built since the fork still took ~9 ms a task, 9% of the workers' busy time in a
  streaming window count at 22,500 records/s);
- ``importlib.invalidate_caches()`` at every task start re-read unchanged zip archives
  (``zip_caches``: ~0.13 s per task on Python 3.11).

A worker whose JVM end closed (idle reused workers, when the application stops) goes quietly
instead of printing a ``BrokenPipeError`` after the run's last line. Under PySpark's stock
daemon (a Connect server without sparkbeam) sparkbeam's first task does the same
(``settle_worker``). On a local master the imports happen in a ``zygote`` while the JVM starts.
"""

import gc
import sys
import time

from sparkbeam.runner.spark import zygote

FULL_COLLECTION_EVERY_S = 10.0

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
    # The loop's only use of gc is that collection; the rest of gc passes through.
    daemon.gc = PacedCollections()  # type: ignore[assignment]
    zip_caches.install()
    gc.collect()
    gc.freeze()


class PacedCollections:
    """``gc`` as PySpark's daemon module sees it: the full collection its reused workers run
    after each task, at most once every ``every_s`` seconds per worker. Python's generational
    collections still run as objects are made, so cyclic garbage is still freed; the rest is
    ``gc``'s own."""

    def __init__(self, every_s: float = FULL_COLLECTION_EVERY_S, clock=time.monotonic) -> None:
        self.every_s, self.clock, self.last = every_s, clock, None

    def collect(self, generation: int = 2) -> int:
        now = self.clock()
        if self.last is not None and now - self.last < self.every_s:
            return 0
        self.last = now
        return gc.collect(generation)

    def __getattr__(self, name: str):
        return getattr(gc, name)


def settle_worker() -> None:
    """``preload`` once in this worker, if its daemon did not (idempotent, cheap after): on a
    Connect server without sparkbeam, each task's zip re-reads took 0.2-0.4 s and each reused
    worker's full collection walked all of Beam. sparkbeam's tasks call it first
    (``plane.frames``)."""
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

"""Start the Python worker daemon as soon as the SparkContext is up.

A Spark JVM starts its Python worker daemon (Beam imported, 1.3-3 s) only at the first Python
task. On a local master (one executor, one daemon; on a cluster executors may not have
registered yet) a one-task job on a thread of its own starts it while the driver plans the
run. A failed warm-up is logged at DEBUG: the pipeline's own job reports the cause.
"""

from __future__ import annotations

import logging
import threading

from sparkbeam.runner.spark import labels

_LOG = logging.getLogger(__name__)
GROUP = "sparkbeam-warm-up"  # its job's group in the Spark UI and status tracker
DESCRIPTION = "sparkbeam: start the Python workers (Beam imported once per worker daemon)"


def start(sc) -> threading.Thread:
    """Run a one-task Python job on a daemon thread; returns the thread (already started)."""
    thread = threading.Thread(target=_run, args=(sc,), name="sparkbeam-warm-workers", daemon=True)
    thread.start()
    return thread


def _run(sc) -> None:
    try:
        labels.describe_job(sc, GROUP, DESCRIPTION)
        sc.parallelize([0], 1).foreach(_nothing)
    except Exception:  # noqa: BLE001 - the pipeline's first job reports a real failure
        _LOG.debug("Warming the Python workers failed", exc_info=True)


def _nothing(_) -> None:
    """The task body: forking a worker from the daemon is the point, not the work."""

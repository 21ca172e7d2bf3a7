"""The data plane: how a run's datasets, shuffles and broadcasts become Spark operations.

Round code builds its datasets through a plane and calls the RDD methods both kinds of dataset
have (``map``, ``mapPartitions``, ``partitionBy``, ``persist``, ``collect``...). ``rdd`` is the
RDD plane (classic Spark only), ``frames`` the DataFrame plane (classic Spark and Connect).
``plane_for`` picks one: Connect needs ``frames``; else ``--data_plane`` chooses.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

PLANES = ("rdd", "frames")


@dataclass(frozen=True)
class Inline:
    """A small value that travels inside the task closure, read like a broadcast (``.value``):
    an empty side-input dict, which as a Spark broadcast cost a file, py4j round trips and a
    transfer to every Python worker."""

    value: Any

    def unpersist(self, blocking: bool = False) -> None:
        """Nothing to release."""


NO_SIDE_INPUTS = Inline({})


def release(broadcast) -> None:
    """Free a broadcast once the round or job that made it is done: a PySpark ``Broadcast`` is
    destroyed (``unpersist`` left the driver's copies for the session's life), other handles
    unpersist."""
    destroy = getattr(broadcast, "destroy", None)
    (destroy or broadcast.unpersist)(blocking=False)


def round_robin(index: int, items):
    """(index + n, item) for the n-th item of partition ``index``: keyed so that a
    ``partitionBy`` on the key spreads the rows evenly (subtasks of `as_subtasks`)."""
    return ((index + n, item) for n, item in enumerate(items))


def plane_for(spark, name: str | None = None):
    """The plane a run uses: ``frames`` over Spark Connect, else ``name`` (default ``rdd``)."""
    from sparkbeam.runner.spark.session import is_connect

    connect = is_connect(spark)
    name = "frames" if connect else (name or os.environ.get("SPARKBEAM_DATA_PLANE") or "rdd")
    if name not in PLANES:
        raise ValueError(f"--data_plane {name!r} is not one of {', '.join(PLANES)}.")
    if name == "frames":
        from sparkbeam.runner.plane.frames import FramePlane

        return FramePlane(spark, connect)
    from sparkbeam.runner.plane.rdd import RddPlane

    return RddPlane(spark)

"""Broadcasts over Spark Connect: uploaded once as a session artifact, read once per worker.

Connect has no ``SparkContext.broadcast``, and a value inside the functions travels once per
task and per stage of a union (the plan's components made 100 MiB task binaries and filled a
warm server's heap). So a large value is uploaded once as a file artifact named by its content
hash; the functions carry the name, and each Python worker reads it once and keeps the few it
read last. Small values still travel inside the functions: an upload costs a round trip.

Leaves to others: what the values are (``rounds``), the session (``spark``).
"""

from __future__ import annotations

import hashlib
import pickle
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

from sparkbeam.runner.plane import Inline

INLINE_BYTES = 256 << 10  # below this a value rides inside the functions
_KEPT = 8  # values a worker process keeps (one pipeline's components, its side inputs)
_MISSING = object()
_LOADED: OrderedDict[str, Any] = OrderedDict()  # per worker process, by artifact name


class ArtifactBroadcast:
    """A large broadcast's stand-in: pickles to its artifact's name, loads on first use."""

    def __init__(self, name: str, value: Any = _MISSING) -> None:
        self.name, self._value = name, value

    def __getstate__(self) -> dict:
        return {"name": self.name}

    def __setstate__(self, state: dict) -> None:
        self.name, self._value = state["name"], _MISSING

    @property
    def value(self) -> Any:
        if self._value is _MISSING:
            self._value = _load(self.name)
        return self._value

    def unpersist(self, blocking: bool = False) -> None:
        pass  # the session's artifacts go with the session


class ArtifactBroadcaster:
    """Makes a Connect session's broadcasts; uploads each distinct large value once."""

    def __init__(self, spark) -> None:
        self.spark = spark
        self._uploaded: set[str] = set()

    def __call__(self, value: Any):
        from pyspark import cloudpickle

        data = cloudpickle.dumps(value, pickle.HIGHEST_PROTOCOL)
        if len(data) < INLINE_BYTES:
            return Inline(value)  # the value travels inside each function
        name = f"sparkbeam-broadcast-{hashlib.sha256(data).hexdigest()[:32]}.pkl"
        if name not in self._uploaded:
            with tempfile.TemporaryDirectory(prefix="sparkbeam-broadcast-") as work:
                path = Path(work) / name  # the artifact's name is the file's
                path.write_bytes(data)
                self.spark.addArtifacts(str(path), file=True)
            self._uploaded.add(name)
        return ArtifactBroadcast(name, value)


def _load(name: str) -> Any:
    value = _LOADED.pop(name, _MISSING)
    if value is _MISSING:
        from pyspark import SparkFiles

        with open(SparkFiles.get(name), "rb") as f:
            value = pickle.load(f)
    _LOADED[name] = value
    while len(_LOADED) > _KEPT:
        _LOADED.popitem(last=False)
    return value

"""A classic SparkContext that stands in for its SparkSession until SQL is needed.

The RDD plane, shipping and the executors use only ``sparkContext``, and a SparkSession costs
~2 s on a cold JVM (its SQL classes load), so a local run builds the real session only when
something asks for it (the DataFrame plane, ``spark.conf``, a user's ``getOrCreate()``). One
SparkContext per process, hence one stand-in, which later runs reuse.
"""

from __future__ import annotations

from typing import Any


class ContextSession:
    """``sparkContext`` at once; any other SparkSession attribute builds the session first."""

    def __init__(self, sc) -> None:
        self.sparkContext = sc
        self._session: Any = None

    @property
    def built(self) -> bool:
        """Whether the real SparkSession exists yet."""
        return self._session is not None

    @property
    def version(self) -> str:
        return self.sparkContext.version

    def session(self):
        """The real SparkSession of this context (built on first use)."""
        if self._session is None:
            from pyspark.sql import SparkSession

            self._session = SparkSession.builder.getOrCreate()
        return self._session

    def stop(self) -> None:
        forget(self.sparkContext)
        if self._session is not None:
            self._session.stop()
        else:
            self.sparkContext.stop()

    def __getattr__(self, name: str):
        if name.startswith("__"):  # pickling, copying: not a session's business
            raise AttributeError(name)
        return getattr(self.session(), name)

    def __repr__(self) -> str:
        return f"ContextSession({self.sparkContext.master!r}, session built: {self.built})"


_CURRENT: ContextSession | None = None  # the stand-in of this process's SparkContext


def for_context(sc) -> ContextSession:
    """The stand-in of ``sc`` (made once per context)."""
    global _CURRENT
    if existing(sc) is None:
        _CURRENT = ContextSession(sc)
    assert _CURRENT is not None
    return _CURRENT


def existing(sc) -> ContextSession | None:
    """The stand-in made for ``sc``, if any."""
    return _CURRENT if _CURRENT is not None and _CURRENT.sparkContext is sc else None


def forget(sc) -> None:
    global _CURRENT
    if existing(sc) is not None:
        _CURRENT = None

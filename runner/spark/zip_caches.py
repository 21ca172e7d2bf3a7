"""Make ``importlib.invalidate_caches()`` cheap for zip archives that did not change.

PySpark's worker calls ``importlib.invalidate_caches()`` at the start of every task. Before
Python 3.12 that re-reads the central directory of every cached zip importer (``pyspark.zip``
once per sub-package, the 15 MB ``spark-core`` jar): 126 ms per task in a local worker.
``install()`` (the warm daemon's, before it forks) re-reads an archive only when its size,
modification time or inode changed, so a rewritten zip is still picked up. Python 3.12 made
the re-read lazy; there nothing is changed.
"""

from __future__ import annotations

import importlib
import os
import zipimport

_real_invalidate = zipimport.zipimporter.invalidate_caches
_read: dict[str, tuple[int, int, int]] = {}  # archive -> (size, mtime_ns, inode) when read


def needed() -> bool:
    """True where invalidation re-reads every archive eagerly (Python before 3.12)."""
    return not hasattr(zipimport.zipimporter, "_get_files")


def install() -> None:
    """Replace the eager re-read with a stat check (idempotent), then record every archive."""
    if not needed() or zipimport.zipimporter.invalidate_caches is _invalidate_if_changed:
        return
    zipimport.zipimporter.invalidate_caches = _invalidate_if_changed  # type: ignore[method-assign]
    importlib.invalidate_caches()  # read each cached archive once, recording its signature


def _signature(archive: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(archive)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def _invalidate_if_changed(self: zipimport.zipimporter) -> None:
    signature = _signature(self.archive)
    cached = zipimport._zip_directory_cache.get(self.archive)  # type: ignore[attr-defined]
    if signature is not None and cached is not None and _read.get(self.archive) == signature:
        self._files = cached  # type: ignore[attr-defined]
        return
    _real_invalidate(self)
    if signature is not None:
        _read[self.archive] = signature

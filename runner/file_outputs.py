"""The files a pipeline writes: named in the start line, and cleaned after a failed run.

Beam's file sinks (``iobase.WriteImpl``) write into ``<dir>/beam-temp-<name>-<uuid>/`` until
the write finalizes; a failed run leaves the folder behind. ``WriteToFilesOnCheckpoint`` has
its own staging (cleaned on restore).
"""

from __future__ import annotations

import logging

from apache_beam.io import filebasedsink, iobase
from apache_beam.io.filesystems import FileSystems
from apache_beam.pipeline import PipelineVisitor

_LOG = logging.getLogger(__name__)


def of(pipeline) -> list[str]:
    """The path prefixes of the pipeline's file sinks, in pipeline order."""
    found: list[str] = []

    class _Sinks(PipelineVisitor):
        def enter_composite_transform(self, node) -> None:
            self.visit_transform(node)

        def visit_transform(self, node) -> None:
            prefix = _prefix(node.transform)
            if prefix and prefix not in found:
                found.append(prefix)

    pipeline.visit(_Sinks())
    return found


def _prefix(transform) -> str | None:
    from sparkbeam.io.files import WriteToFilesOnCheckpoint

    if isinstance(transform, iobase.WriteImpl) and isinstance(
        transform.sink, filebasedsink.FileBasedSink
    ):
        prefix = transform.sink.file_path_prefix
        return prefix.get() if prefix.is_accessible() else None
    if isinstance(transform, WriteToFilesOnCheckpoint):
        return transform.path_prefix
    return None


def remove_beam_temp_dirs(prefixes: list[str], since_s: float) -> None:
    """Remove the ``beam-temp-*`` folders Beam's sinks for ``prefixes`` made at or after
    ``since_s`` (epoch seconds): what a failed run leaves. Best effort: a folder that cannot
    be listed or removed is named at DEBUG and left."""
    for prefix in prefixes:
        base, name = FileSystems.split(prefix)
        pattern = FileSystems.join(base, f"beam-temp-{name}-*", "*")  # a match lists files
        try:
            (result,) = FileSystems.match([pattern])
        except Exception:  # noqa: BLE001 - cleanup never hides the run's own error
            _LOG.debug("could not list %s", pattern, exc_info=True)
            continue
        folders = {
            _top_folder(base, m.path)
            for m in result.metadata_list
            if m.last_updated_in_seconds >= since_s - 1
        }
        for folder in sorted(folders):
            try:
                FileSystems.delete([folder])
                _LOG.info("removed %s, left by the failed run", folder)
            except Exception:  # noqa: BLE001
                _LOG.debug("could not remove %s", folder, exc_info=True)


def _top_folder(base: str, path: str) -> str:
    """``<base>/beam-temp-...`` of ``path``, a file in it."""
    rest = path[len(base) :].lstrip("/")
    return FileSystems.join(base, rest.split("/", 1)[0])

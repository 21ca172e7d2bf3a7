"""``WriteToFilesOnCheckpoint``: a line-file sink whose files appear only once committed.

Each bundle's lines go to a uniquely named staged file under
``<dirname(path_prefix)>/.sparkbeam-staging/``, renamed to its final name only when the Spark
task attempt that wrote it is committed (batch: at the end of a successful run; streaming:
after the checkpoint covering it), so each element appears in exactly one visible file. Final
names (round, stage, partition, a per-task sequence; never the attempt) make finalizing twice
harmless. The protocol, and the removal of what lost rounds published, live in
``sparkbeam.runner.rounds.sink_files``. Outside a sparkbeam task (other runners) a staged file
is renamed at once: at-least-once, like Beam's own file sinks.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import apache_beam as beam
from apache_beam.coders import Coder, StrUtf8Coder
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from sparkbeam.runner.rounds import sink_files

__all__ = ["WriteToFilesOnCheckpoint"]


class WriteToFilesOnCheckpoint(beam.PTransform):
    """Write each element as one line to files named ``<path_prefix>-...<file_name_suffix>``.

    ``format_fn`` turns an element into the value ``coder`` encodes (default: the element
    itself, which must then be a ``str``). A suffix such as ``.gz`` compresses the files.
    The output PCollection is empty; the files are visible once the pipeline (batch) or the
    covering checkpoint (streaming) commits.
    """

    def __init__(
        self,
        path_prefix: str,
        file_name_suffix: str = "",
        coder: Coder | None = None,
        format_fn: Callable[[Any], Any] | None = None,
    ) -> None:
        super().__init__()
        # Absolute on the driver: a Spark worker's working directory is another one.
        self.path_prefix = _check_prefix(path_prefix)
        self.file_name_suffix = file_name_suffix
        self.coder = coder or StrUtf8Coder()
        self.format_fn = format_fn

    def annotations(self):
        # The runner finds the output directory here: a restore that falls back past a
        # lost checkpoint removes what the lost rounds published (``sink_files``).
        directory = FileSystems.split(self.path_prefix)[0]
        return {**super().annotations(), sink_files.DIRECTORY_ANNOTATION: directory}

    def expand(self, pcoll):
        fn = _WriteStagedFn(self.path_prefix, self.file_name_suffix, self.coder, self.format_fn)
        return pcoll | "WriteStagedFiles" >> beam.ParDo(fn)


def _check_prefix(path_prefix: str) -> str:
    """The prefix made absolute; fails at construction, naming the path, not inside a task."""
    if not isinstance(path_prefix, str) or not path_prefix.strip():
        raise ValueError(
            f"WriteToFilesOnCheckpoint needs a path prefix such as '/data/out/part', "
            f"got {path_prefix!r}."
        )
    try:
        directory, base = FileSystems.split(path_prefix)
    except ValueError:
        raise ValueError(
            f"WriteToFilesOnCheckpoint path prefix {path_prefix!r} is on no filesystem Beam "
            "knows. Use a local path or a registered scheme (gs://, s3://, hdfs://), "
            "and install the Beam extra for it."
        ) from None
    if not base or path_prefix.endswith(("/", "\\")):
        raise ValueError(
            f"WriteToFilesOnCheckpoint path prefix {path_prefix!r} names a directory; add a "
            "file name prefix, e.g. "
            f"{FileSystems.join(path_prefix, 'part')!r}."
        )
    return FileSystems.join(directory, base)


class _WriteStagedFn(beam.DoFn):
    """Buffers a bundle's lines; in finish_bundle writes one staged file and registers it."""

    def __init__(self, path_prefix: str, suffix: str, coder: Coder, format_fn) -> None:
        self.path_prefix = path_prefix
        self.suffix = suffix
        self.coder = coder
        self.format_fn = format_fn
        self._lines: list[bytes] = []

    def start_bundle(self) -> None:
        self._lines = []

    def process(self, element):
        value = self.format_fn(element) if self.format_fn is not None else element
        if isinstance(self.coder, StrUtf8Coder) and not isinstance(value, str):
            raise TypeError(
                f"WriteToFilesOnCheckpoint({self.path_prefix!r}) got a "
                f"{type(value).__name__} ({value!r:.80}), but writes str lines by default; "
                "pass format_fn=str (or a formatter), or a coder for this type."
            )
        self._lines.append(self.coder.encode(value))
        return ()

    def finish_bundle(self):
        if not self._lines:
            return
        directory, base = FileSystems.split(self.path_prefix)
        task = sink_files.current_task()
        if task is not None:
            seq = sink_files.next_sequence()
            name = sink_files.final_name(task.round, task.stage, task.partition, seq)
        else:
            name = f"direct-{uuid.uuid4().hex}"
        final = f"{self.path_prefix}-{name}{self.suffix}"
        # The final name (it names the stage) plus a fresh id: each attempt stages its own file.
        staged = sink_files.staging_path(directory, f"{base}-{name}.{uuid.uuid4().hex}")
        self._write(staged, final)
        self._lines = []
        if not sink_files.stage(staged, final):
            sink_files.finalize([(staged, final)])  # no commit to wait for: at-least-once

    def _write(self, staged: str, final: str) -> None:
        compression = CompressionTypes.detect_compression_type(final)
        try:
            with FileSystems.create(staged, compression_type=compression) as f:
                for line in self._lines:
                    f.write(line)
                    f.write(b"\n")
        except Exception as e:
            raise OSError(
                f"WriteToFilesOnCheckpoint({self.path_prefix!r}) could not write staged file "
                f"{staged!r}: {e}. Check that the output directory is writable."
            ) from e

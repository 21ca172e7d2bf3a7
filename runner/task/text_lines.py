"""The lines of a ``ReadFromText`` range, read in bulk in a Spark task (``translation.text_reads``).

The lines are Beam's: a range ``[start, end)`` owns the lines that start in it (past the
file's start it begins just after the first ``\\n`` at or after ``start - 1``, as Beam's and
Hadoop's readers do); a line ends at ``\\n`` (a ``\\r`` before it dropped) or at the end of
the file. A compressed file is one range, read through Beam's ``FileSystems``.

Each block is checked to be UTF-8 (a file that is not fails, naming the byte) and goes to the
stage as one chunk of ``\\n``-ended lines, which ``TextLinesInputOperation`` (the data input
of ``TEXT_LINES_INPUT_URN``) emits as Beam's ``Read`` does -- global window, minimum timestamp
-- without a windowed-value encoding and the data input's lock per line (~6% of a word
count's read stage, py-spy).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.worker import bundle_processor
from apache_beam.runners.worker.bundle_processor import BeamTransformFactory, DataInputOperation
from apache_beam.transforms.window import GlobalWindows

from sparkbeam.translation.text_reads import TEXT_LINES_INPUT_URN

BLOCK_BYTES = 1 << 20
# What Beam's Read emits for each line: the Impulse's window, the minimum timestamp, no pane.
_READ_VALUE = GlobalWindows.windowed_value(None)


def read_ranges(ranges: Iterable[tuple]) -> Iterator[bytes]:
    """Chunks of the lines of ``ranges``: (path, compression, start, end or None)."""
    for path, compression, start, end in ranges:
        for lines in _lines(path, compression, start, end):
            lines.append(b"")
            yield b"\n".join(lines)


def _lines(path: str, compression: str, start: int, end: int | None) -> Iterator[list[bytes]]:
    """Blocks of the lines that start in ``[start, end)`` (``end`` None: to the file's end)."""
    with FileSystems.open(
        path, mime_type="application/octet-stream", compression_type=compression
    ) as f:
        at = start  # the file offset of ``data``'s first byte
        if start > 0:  # skip up to and including the first separator at or after start - 1
            f.seek(start - 1)
            at = start - 1
        skipping = start > 0
        pending = b""
        while True:
            block = f.read(BLOCK_BYTES)
            data = pending + block if pending else block
            if skipping:
                cut = data.find(b"\n")
                if cut < 0:
                    if not block:
                        return  # the line begun before ``start`` runs to the end
                    at, pending = at + len(data), b""
                    continue
                at, data, skipping = at + cut + 1, data[cut + 1 :], False
            if not block:  # the end of the file: what is left is its last line, kept whole
                if data and (end is None or at < end):
                    _check_utf8(path, at, data, len(data))
                    yield [data]
                return
            lines = data.split(b"\n")
            pending = lines.pop()
            _check_utf8(path, at, data, len(data) - len(pending))
            after = at + len(data) - len(pending)  # where ``pending`` starts
            done = end is not None and after >= end
            if end is not None and after > end:
                lines = _starting_before(lines, at, end)
            if lines:
                if b"\r" in data:
                    lines = [x[:-1] if x[-1:] == b"\r" else x for x in lines]
                yield lines
            if done:
                return
            at = after


def _check_utf8(path: str, at: int, data: bytes, length: int) -> None:
    """Beam's reader decodes each line; a file that is not UTF-8 fails naming where."""
    try:
        str(memoryview(data)[:length], "utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"ReadFromText: {path} is not UTF-8 text at byte {at + e.start} ({e.reason}). "
            "ReadFromText decodes lines as UTF-8: convert the file, or read it with "
            "ReadFromText(..., coder=...) or as bytes (e.g. fileio)."
        ) from None


def _starting_before(lines: list[bytes], at: int, end: int) -> list[bytes]:
    """The first of ``lines`` (the first at offset ``at``, each followed by one separator
    byte) that start before ``end``."""
    position = at
    for i, line in enumerate(lines):
        if position >= end:
            return lines[:i]
        position += len(line) + 1
    return lines


def compression_of(path: str, compression: str) -> str:
    """The codec ``path`` is read with: ``compression``, or by its extension when "auto"."""
    if compression == CompressionTypes.AUTO:
        return CompressionTypes.detect_compression_type(path)
    return compression


class TextLinesInputOperation(DataInputOperation):
    """The data input of a ``ReadFromText`` buffer: chunks of ``\\n``-ended UTF-8 lines. It
    never splits: text is split by byte range (``text_ranges``), and no SDF stage reads it."""

    def process_encoded(self, chunk: bytes) -> None:
        lines = chunk.decode("utf-8").split("\n")
        lines.pop()  # what follows the last line's separator
        receive = self.receivers[0].receive
        with_value = _READ_VALUE.with_value
        for line in lines:
            receive(with_value(line))
        self.index += len(lines)

    def try_split(self, fraction_of_remainder, total_buffer_size, allowed_split_points):
        return None


@BeamTransformFactory.register_urn(TEXT_LINES_INPUT_URN, beam_fn_api_pb2.RemoteGrpcPort)
def create_text_lines_input(factory, transform_id, transform_proto, grpc_port, consumers):
    """Built as the SDK builds a data input (``bundle_processor.create_source_runner``)."""
    return TextLinesInputOperation(
        bundle_processor.common.NameContext(transform_proto.unique_name, transform_id),
        transform_proto.unique_name,
        consumers,
        factory.counter_factory,
        factory.state_sampler,
        factory.get_coder(grpc_port.coder_id),
        transform_id=transform_id,
        data_channel_factory=functools.partial(
            factory.data_channel_factory.create_data_channel, grpc_port
        ),
    )

"""The lines of a ``ReadFromText`` range, read in bulk in a Spark task (``translation.text_reads``).

The lines are Beam's: a range ``[start, end)`` of a file owns the lines that start in it (a
range past the file's start begins just after the first ``\\n`` at or after ``start - 1``, as
Beam's text source and Hadoop's line reader do); a line ends at ``\\n``, a ``\\r`` just before
it dropped too, or at the end of the file, kept whole. A compressed file is one range, read to
its end through Beam's ``FileSystems`` (which knows the codecs, as it knows ``s3://``).

Lines are not decoded here: each block is checked to be UTF-8 (a file that is not fails, as in
Beam's reader, naming the byte), and each line is written, as its bytes, in the read coder's
encoding of a windowed value in the global window at the minimum timestamp (what Beam's
``Read`` emits), one chunk per block read; the stage decodes them. The encoding is checked
against the coder once per task; a coder laid out otherwise (not expected) encodes each line
through Beam.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from apache_beam.coders.coder_impl import create_OutputStream
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import PANE_INFO_UNKNOWN, WindowedValue

from sparkbeam.runner.task.worker_context import plan_context, register_plan

BLOCK_BYTES = 1 << 20
_SHORT = 1 << 14  # lines shorter than this get their header from a table


def read_ranges(
    components: bytes, plan_key: str, coder: str, ranges: Iterable[tuple]
) -> Iterator[bytes]:
    """Encoded chunks of the lines of ``ranges``: (path, compression, start, end or None)."""
    register_plan(plan_key, components)
    encode = _encoder(plan_context(plan_key).coders[coder].get_impl())
    for path, compression, start, end in ranges:
        for lines in _lines(path, compression, start, end):
            yield encode(lines)


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


def _encoder(impl) -> Callable[[list[bytes]], bytes]:
    """Lines -> one chunk of encoded windowed values, by table when the layout is the usual."""
    window = (GlobalWindow(),)

    def through_beam(lines: list[bytes]) -> bytes:
        out = create_OutputStream()
        for line in lines:
            value = WindowedValue(line.decode("utf-8"), MIN_TIMESTAMP, window, PANE_INFO_UNKNOWN)
            impl.encode_to_stream(value, out, True)
        return out.get()

    prefix = through_beam([b""])[:-1]  # the element's header; then varint length, bytes
    heads = [prefix + _varint(n) for n in range(_SHORT)]
    samples = [b"", b"a", b"x" * 200, "\u00e9t\u00e9".encode(), b"y" * (_SHORT + 5)]
    if through_beam([b""])[-1:] != b"\x00" or any(
        through_beam([s]) != prefix + _varint(len(s)) + s for s in samples
    ):
        return through_beam

    def by_table(lines: list[bytes]) -> bytes:
        parts: list[bytes] = []
        append = parts.append
        for line in lines:
            n = len(line)
            append(heads[n] if n < _SHORT else prefix + _varint(n))
            append(line)
        return b"".join(parts)

    return by_table


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def compression_of(path: str, compression: str) -> str:
    """The codec ``path`` is read with: ``compression``, or by its extension when "auto"."""
    if compression == CompressionTypes.AUTO:
        return CompressionTypes.detect_compression_type(path)
    return compression

"""The changelog (Flink's DSTL): append-only segment files of state changes.

Owns: the segment file format, the in-memory segment buffer of one writer, and reading segments
back. Changes are buffered and become one segment file when the buffer exceeds ``flush_bytes``
or a checkpoint asks: few, larger files, never one per key or operator. Leaves to others: which
segments a checkpoint names (`manifest`, `store`) and where they live (`filesystem`).

Segment format (little endian)::

    header  b"SBCL" version:u8 pad:3
    body    version 2: blocks, each the records of a key-group sub-range as one zstd frame,
            then the block index (per block kg_lo:u16 kg_hi:u16 offset:u64 length:u32
            raw_length:u32 crc32:u32), then blocks:u32 crc32(index):u32
            version 1 (still read): the records as they are
    record  op:u8 key_group:u16 ns_len:u16 key_len:u32 value_len:u32 ns key value   (repeated)
    footer  records:u64 crc32(header + body):u32 b"SBCLEND1"

The records compress to about 0.6 of their size even when the values do not (the namespace
repeats on every record, keys share prefixes): the tail a range carries between snapshots is
what keeps a store near its live size. A segment of `BLOCK_MIN_BYTES` or more is cut into up to
`BLOCKS` blocks by key-group sub-range (a key's records stay in order in its block), so a
restore at another parallelism reads only its blocks (`read_records`: ranged reads, each block
checked by its crc32). A torn, truncated or bit-flipped segment fails the footer check and
raises `CheckpointCorruptError` naming the file.
"""

from __future__ import annotations

import bisect
import struct
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from enum import IntEnum
from functools import cache

import pyarrow as pa

from sparkbeam.checkpoint.errors import CheckpointCorruptError, NoChangelogError
from sparkbeam.checkpoint.filesystem import Storage, checksum, read_checked
from sparkbeam.checkpoint.ids import FileEntry
from sparkbeam.checkpoint.keygroups import KeyGroupRange

HEADER = b"SBCL\x02\x00\x00\x00"
_V1 = 1
_BLOCK = struct.Struct("<HHQIII")  # kg_lo kg_hi offset length raw_length crc32
_INDEX_TAIL = struct.Struct("<II")  # blocks, crc32 of the index
BLOCKS = 8  # like a range snapshot's key-group sub-ranges (`staging.SPLITS`)
BLOCK_MIN_BYTES = 256 << 10  # records below this stay one block (one read is cheaper)
RANGED_READ_MIN_BYTES = BLOCK_MIN_BYTES // 4  # a smaller segment is read whole (`read_records`)
_RECORD = struct.Struct("<BHHII")
_FOOTER = struct.Struct("<QI8s")
_FOOTER_MAGIC = b"SBCLEND1"
DEFAULT_FLUSH_BYTES = 8 << 20


class Op(IntEnum):
    """What a changelog record does."""

    PUT = 1
    DELETE = 2


_OPS = {op.value: op for op in Op}  # a dict lookup: ``Op(value)`` costs ~0.6 us a record

Record = tuple[Op, int, str, bytes, bytes]
"""(op, key group, namespace, key, value) -- value is ``b""`` for deletes."""
PutFn = Callable[[str, bytes, bytes, int], None]
DeleteFn = Callable[[str, bytes, int], None]


def apply_records(records: Iterable[Record], put: PutFn, delete: DeleteFn) -> None:
    """Each record in order as ``put(ns, key, value, kg)`` or ``delete(ns, key, kg)``."""
    for op, kg, ns, key, value in records:
        if op is Op.PUT:
            put(ns, key, value, kg)
        else:
            delete(ns, key, kg)


class SegmentBuffer:
    """Encodes records into one segment's bytes."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._starts: list[int] = []  # per record: its first part
        self._kgs: list[int] = []
        self._ns_cache: dict[str, bytes] = {}
        self.size = len(HEADER)  # uncompressed: what flush thresholds count
        self.records = 0
        self.kg_start, self.kg_stop = 1 << 16, 0  # key groups covered: [kg_start, kg_stop)

    def append(self, op: Op, kg: int, namespace: str, key: bytes, value: bytes = b"") -> None:
        if kg < self.kg_start:
            self.kg_start = kg
        if kg >= self.kg_stop:
            self.kg_stop = kg + 1
        ns = self._ns_cache.get(namespace)
        if ns is None:
            ns = self._ns_cache[namespace] = namespace.encode()
        self._starts.append(len(self._parts))
        self._kgs.append(kg)
        self._parts.append(_RECORD.pack(op, kg, len(ns), len(key), len(value)))
        self._parts.append(ns)
        self._parts.append(key)
        if value:
            self._parts.append(value)
        self.size += _RECORD.size + len(ns) + len(key) + len(value)
        self.records += 1

    def finish(self) -> bytes:
        out, index, offset = [HEADER], [], len(HEADER)
        for lo, hi, records in self._blocks():
            frame = _zstd().compress(records, asbytes=True)
            crc = zlib.crc32(frame) & 0xFFFFFFFF
            index.append(_BLOCK.pack(lo, hi, offset, len(frame), len(records), crc))
            out.append(frame)
            offset += len(frame)
        table = b"".join(index)
        out += [table, _INDEX_TAIL.pack(len(index), zlib.crc32(table) & 0xFFFFFFFF)]
        body = b"".join(out)
        crc = zlib.crc32(body) & 0xFFFFFFFF
        return body + _FOOTER.pack(self.records, crc, _FOOTER_MAGIC)

    def _blocks(self) -> Iterator[tuple[int, int, bytes]]:
        """(kg_lo, kg_hi, records) of each block, records in append order within it."""
        lo, hi = min(self.kg_start, self.kg_stop), self.kg_stop
        n = min(BLOCKS, hi - lo) if self.size >= BLOCK_MIN_BYTES else 1
        if n <= 1:
            yield lo, max(hi, lo + 1), b"".join(self._parts)
            return
        bounds = [lo + (hi - lo) * i // n for i in range(n + 1)]
        members: list[list[int]] = [[] for _ in range(n)]
        which = [bisect.bisect_right(bounds, kg) - 1 for kg in range(lo, hi)]
        for i, kg in enumerate(self._kgs):
            members[which[kg - lo]].append(i)
        starts, parts = self._starts + [len(self._parts)], self._parts
        for b, records in enumerate(members):
            if records:
                data = b"".join(b"".join(parts[starts[i] : starts[i + 1]]) for i in records)
                yield bounds[b], bounds[b + 1], data


@cache
def _zstd() -> pa.Codec:
    return pa.Codec("zstd", compression_level=1)  # ~300 MB/s a core; level 3 saves 3% more


def _index(
    data: bytes, path: str, end: int, first: int = len(HEADER)
) -> list[tuple[int, int, int, int, int, int]]:
    """A version-2 segment's block index, which ends at ``end`` of ``data`` (where the footer
    starts) and begins at ``first`` or later."""
    if end < first + _INDEX_TAIL.size:
        raise CheckpointCorruptError(path, "changelog segment has no block index")
    count, crc = _INDEX_TAIL.unpack_from(data, end - _INDEX_TAIL.size)
    start = end - _INDEX_TAIL.size - count * _BLOCK.size
    table = memoryview(data)[max(0, start) : end - _INDEX_TAIL.size]
    if start < first or zlib.crc32(table) & 0xFFFFFFFF != crc:
        raise CheckpointCorruptError(path, "changelog segment's block index is damaged")
    return [_BLOCK.unpack_from(table, i * _BLOCK.size) for i in range(count)]


def _block_records(frame, raw_length: int, crc: int, path: str) -> bytes:
    if zlib.crc32(frame) & 0xFFFFFFFF != crc:
        raise CheckpointCorruptError(path, "a block of the changelog segment fails its crc32")
    try:
        return _zstd().decompress(frame, raw_length, asbytes=True)
    except (OSError, ValueError) as e:  # pyarrow's codec errors
        raise CheckpointCorruptError(path, f"changelog segment does not decompress: {e}") from e


def _blocks_of(data: bytes, path: str, lo: int, hi: int) -> Iterator[bytes]:
    """The records of a checked segment's blocks that may hold key groups ``[lo, hi)``."""
    end = len(data) - _FOOTER.size
    if data[4] == _V1:
        yield data[len(HEADER) : end]
        return
    if data[4] != HEADER[4]:
        raise CheckpointCorruptError(path, f"changelog segment version {data[4]} is not known")
    view = memoryview(data)
    for b_lo, b_hi, offset, length, raw, crc in _index(data, path, end):
        if b_lo < hi and lo < b_hi:
            yield _block_records(view[offset : offset + length], raw, crc, path)


class ChangelogWriter:
    """Buffers one writer's changes and flushes them to ``<writer>-<session>-<sequence>.seg``
    files; the random session keeps a restarted or retried writer off earlier files."""

    def __init__(
        self,
        storage: Storage,
        directory: str,
        writer: str,
        flush_bytes: int = DEFAULT_FLUSH_BYTES,
        name_prefix: str = "",
    ):
        self.storage = storage
        self.directory = directory
        self.writer = writer
        self.flush_bytes = flush_bytes
        self.session = uuid.uuid4().hex[:12]
        self.sequence = 0
        self.name_prefix = name_prefix
        self._buffer = SegmentBuffer()

    def append(
        self, op: Op, kg: int, namespace: str, key: bytes, value: bytes = b""
    ) -> FileEntry | None:
        """Buffer one record; returns the flushed segment if the buffer got full."""
        self._buffer.append(op, kg, namespace, key, value)
        if self._buffer.size >= self.flush_bytes:
            return self.flush()
        return None

    def flush(self) -> FileEntry | None:
        """Write the buffer as one segment (None if empty); the name is relative to storage."""
        if self._buffer.records == 0:
            return None
        buffer = self._buffer
        data = buffer.finish()
        name = f"{self.name_prefix}{self.writer}-{self.session}-{self.sequence + 1:08d}.seg"
        self.storage.write(f"{self.directory}/{name}", data)  # on failure the buffer is kept
        self.sequence += 1
        self._buffer = SegmentBuffer()
        return FileEntry(
            name=name,
            size=len(data),
            checksum=checksum(data),
            records=buffer.records,
            kg_start=buffer.kg_start,
            kg_stop=buffer.kg_stop,
        )

    def discard(self) -> None:
        """Drop buffered records (their changes are covered by a materialization)."""
        self._buffer = SegmentBuffer()


class NoChangelog:
    """The driver's changelog of a run without ``--checkpoint_dir``: it keeps no bytes at all;
    flushing after a change refuses (`NoChangelogError`), as a checkpoint would miss it."""

    def __init__(self, what: str) -> None:
        self.what = what  # the pipeline and store, for the error
        self.changes = 0

    def append(
        self, op: Op, kg: int, namespace: str, key: bytes, value: bytes = b""
    ) -> FileEntry | None:
        self.changes += 1
        return None

    def flush(self) -> FileEntry | None:
        if self.changes:
            raise NoChangelogError(self.what)
        return None

    def discard(self) -> None:
        """A materialization or a restore covers every change so far."""
        self.changes = 0


def _check_ends(head: bytes, footer_magic: bytes, path: str) -> None:
    if head[:4] != HEADER[:4]:
        raise CheckpointCorruptError(path, "not a changelog segment (bad header magic)")
    if footer_magic != _FOOTER_MAGIC:
        raise CheckpointCorruptError(path, "torn changelog segment (footer missing)")


def check_segment(data: bytes, path: str) -> int:
    """Validate a segment's framing and checksums; returns its record count."""
    if len(data) < len(HEADER) + _FOOTER.size:
        raise CheckpointCorruptError(path, f"truncated changelog segment ({len(data)} bytes)")
    records, crc, magic = _FOOTER.unpack_from(data, len(data) - _FOOTER.size)
    _check_ends(data, magic, path)
    body = memoryview(data)[: len(data) - _FOOTER.size]
    if zlib.crc32(body) & 0xFFFFFFFF != crc:
        raise CheckpointCorruptError(path, "changelog segment fails its crc32 check")
    return records


def iter_records(
    data: bytes, path: str, key_groups: KeyGroupRange | None = None
) -> Iterator[Record]:
    """Decode a checked segment's records (optionally only those in ``key_groups``)."""
    lo, hi = (key_groups.start, key_groups.stop) if key_groups is not None else (0, 1 << 16)
    for records in _blocks_of(data, path, lo, hi):
        yield from _decode(records, path, lo, hi)


def _decode(data: bytes, path: str, lo: int, hi: int) -> Iterator[Record]:
    end = len(data)
    pos = 0
    unpack = _RECORD.unpack_from
    rsize = _RECORD.size
    ns_cache: dict[bytes, str] = {}
    while pos < end:
        if pos + rsize > end:
            raise CheckpointCorruptError(path, f"record header runs past the end at byte {pos}")
        op, kg, ns_len, key_len, val_len = unpack(data, pos)
        pos += rsize
        stop = pos + ns_len + key_len + val_len
        if stop > end:
            raise CheckpointCorruptError(path, f"record runs past the end at byte {pos}")
        if lo <= kg < hi:
            ns_b = data[pos : pos + ns_len]
            ns = ns_cache.get(ns_b)
            if ns is None:
                ns = ns_cache[ns_b] = ns_b.decode()
            k_end = pos + ns_len + key_len
            known = _OPS.get(op)
            if known is None:
                raise CheckpointCorruptError(path, f"unknown record operation {op} at byte {pos}")
            yield known, kg, ns, data[pos + ns_len : k_end], data[k_end:stop]
        pos = stop


def read_records(
    storage: Storage, path: str, entry: FileEntry, key_groups: KeyGroupRange
) -> Iterator[Record]:
    """The records of ``key_groups`` in the segment ``entry``, reading only its index and the
    blocks that may hold them (each checked by its crc32, as the file's checksum needs all of
    it); a segment below `RANGED_READ_MIN_BYTES` or of version 1 is read whole."""
    lo, hi = key_groups.start, key_groups.stop
    size = entry.size
    tail_size = _INDEX_TAIL.size + _FOOTER.size
    if size < RANGED_READ_MIN_BYTES or size < len(HEADER) + tail_size:
        yield from iter_records(read_segment(storage, path, entry), path, key_groups)
        return
    try:
        head = storage.read_range(path, 0, len(HEADER))
        tail = storage.read_range(path, size - tail_size, tail_size)
    except FileNotFoundError:
        raise CheckpointCorruptError(path, "file is missing") from None
    if len(tail) != tail_size:
        raise CheckpointCorruptError(path, f"shorter than the manifest's {size} bytes")
    _check_ends(head, tail[-len(_FOOTER_MAGIC) :], path)
    if head[4] != HEADER[4]:
        yield from iter_records(read_segment(storage, path, entry), path, key_groups)
        return
    (count, _) = _INDEX_TAIL.unpack_from(tail, 0)
    index_at = size - tail_size - count * _BLOCK.size
    if index_at < len(HEADER):
        raise CheckpointCorruptError(path, "changelog segment's block index is damaged")
    table = storage.read_range(path, index_at, count * _BLOCK.size) + tail[: _INDEX_TAIL.size]
    for b_lo, b_hi, offset, length, raw, crc in _index(table, path, len(table), first=0):
        if b_lo < hi and lo < b_hi:
            frame = storage.read_range(path, offset, length)
            yield from _decode(_block_records(frame, raw, crc, path), path, lo, hi)


def read_segment(storage: Storage, path: str, expected: FileEntry | None = None) -> bytes:
    """Read and check one segment; raises `CheckpointCorruptError` naming ``path``."""
    data = read_checked(storage, path, expected)
    check_segment(data, path)
    return data

"""Where a ``ReadFromText`` is read: its files, matched on the driver (Beam's ``FileSystems``),
in byte ranges. As in Beam's file source an empty file is skipped and a compressed one is one
range; an uncompressed one is cut into ranges of about the total over the parallelism, within
the bounds Spark's file sources use, packed into partitions as Spark packs files (many small
files make a few partitions). ``runner.task.text_lines`` reads them.
"""

from __future__ import annotations

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from sparkbeam.runner.task.text_lines import compression_of
from sparkbeam.translation.text_reads import TextRead

MIN_RANGE_BYTES = 4 << 20
MAX_RANGE_BYTES = 128 << 20
OPEN_COST_BYTES = 64 << 10  # opening a file costs about what reading this much does


Range = tuple[str, str, int, "int | None"]  # path, compression, start, end (None: to the end)


def text_partitions(read: TextRead, parallelism: int) -> list[list[Range]]:
    """The ranges of ``read``'s files, packed into partitions of about one range's bytes."""
    files = sorted(
        (m.path, m.size_in_bytes, compression_of(m.path, read.compression))
        for m in FileSystems.match([read.pattern])[0].metadata_list
        if m.size_in_bytes > 0
    )
    total = sum(size + OPEN_COST_BYTES for _, size, _ in files)
    step = -(-total // max(1, parallelism))
    step = min(MAX_RANGE_BYTES, max(MIN_RANGE_BYTES, step))
    ranges: list[tuple[int, Range]] = []
    for path, size, compression in files:
        if compression != CompressionTypes.UNCOMPRESSED:
            ranges.append((size, (path, compression, 0, None)))
            continue
        for s in range(0, size, step):
            end = min(s + step, size)
            ranges.append((end - s, (path, compression, s, end)))
    return _packed(ranges, step)


def _packed(ranges: list[tuple[int, Range]], step: int) -> list[list[Range]]:
    """Largest first, each range into the open partition while it holds less than ``step``
    (with each range's open cost), as Spark packs files into partitions."""
    partitions: list[list[Range]] = []
    current: list[Range] = []
    size = 0
    for length, r in sorted(ranges, key=lambda x: -x[0]):
        if current and size + length > step:
            partitions.append(current)
            current, size = [], 0
        current.append(r)
        size += length + OPEN_COST_BYTES
    if current:
        partitions.append(current)
    return partitions

"""Where a ``ReadFromText`` is read: its files, matched on the driver, in byte ranges.

Beam's ``FileSystems`` matches the pattern (any filesystem it knows, with the run's options);
an empty file is skipped and a compressed one is a single range, as Beam's file source does.
An uncompressed file is cut into ranges of about the total over the parallelism, at least
``MIN_RANGE_BYTES`` and at most ``MAX_RANGE_BYTES`` (the sizes Spark's file sources use), one
Spark partition each; ``runner.task.text_lines`` reads them.
"""

from __future__ import annotations

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from sparkbeam.runner.task.text_lines import compression_of
from sparkbeam.translation.text_reads import TextRead

MIN_RANGE_BYTES = 4 << 20
MAX_RANGE_BYTES = 128 << 20


def text_ranges(read: TextRead, parallelism: int) -> list[tuple[str, str, int, int | None]]:
    """(path, compression, start, end) of each range; end None: to the end of the file."""
    files = sorted(
        (m.path, m.size_in_bytes, compression_of(m.path, read.compression))
        for m in FileSystems.match([read.pattern])[0].metadata_list
        if m.size_in_bytes > 0
    )
    splittable = sum(size for _, size, c in files if c == CompressionTypes.UNCOMPRESSED)
    step = -(-splittable // max(1, parallelism))
    step = min(MAX_RANGE_BYTES, max(MIN_RANGE_BYTES, step))
    ranges: list[tuple[str, str, int, int | None]] = []
    for path, size, compression in files:
        if compression != CompressionTypes.UNCOMPRESSED:
            ranges.append((path, compression, 0, None))
            continue
        ranges.extend((path, compression, s, min(s + step, size)) for s in range(0, size, step))
    return ranges

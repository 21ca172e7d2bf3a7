"""The runner's bulk line reader gives Beam's lines (``task.text_lines``, ``rounds.text_ranges``).

Beam's own text source is the reference: over files with ``\\n``, ``\\r\\n``, lone ``\\r``, empty
lines, lines longer than a block and no final separator, the lines of any cut of a file into
ranges, read in blocks of a few bytes, are exactly the lines Beam reads from it.
"""

from __future__ import annotations

import gzip
import random

import pytest
from apache_beam import coders
from apache_beam.io import source_test_utils
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.textio import _TextSource

from sparkbeam.runner.rounds.text_ranges import MIN_RANGE_BYTES, text_partitions
from sparkbeam.runner.task import text_lines
from sparkbeam.translation.text_reads import TextRead

PIECES = ["a", "bc", " ", "\u00e9", "\n", "\n", "\r\n", "\r", "", "word", "x" * 40]


def _beam_lines(path: str) -> list[str]:
    source = _TextSource(path, 0, CompressionTypes.AUTO, True, coders.StrUtf8Coder())
    return source_test_utils.read_from_source(source)


def _ours(path: str, cuts: list[int], size: int) -> list[str]:
    bounds = [0, *cuts, size]
    lines = []
    for start, end in zip(bounds, bounds[1:]):
        for block in text_lines._lines(path, CompressionTypes.UNCOMPRESSED, start, end):
            lines += [line.decode("utf-8") for line in block]
    return lines


@pytest.mark.parametrize("seed", range(40))
def test_any_cut_into_ranges_reads_beams_lines(tmp_path, monkeypatch, seed):
    rng = random.Random(seed)
    monkeypatch.setattr(text_lines, "BLOCK_BYTES", rng.choice([1, 2, 3, 7, 64]))
    text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 60)))
    path = tmp_path / "f.txt"
    path.write_bytes(text.encode("utf-8"))
    size = path.stat().st_size
    cuts = sorted(rng.sample(range(1, size), min(size - 1, rng.randint(0, 6)))) if size > 1 else []
    assert _ours(str(path), cuts, size) == _beam_lines(str(path)), (text, cuts)


def test_every_single_cut_reads_beams_lines(tmp_path, monkeypatch):
    monkeypatch.setattr(text_lines, "BLOCK_BYTES", 4)
    text = "ab\r\n\ncd\r\re\n\n\r\nlast\r"
    path = tmp_path / "f.txt"
    path.write_bytes(text.encode())
    expected = _beam_lines(str(path))
    assert expected[-1] == "last\r"  # no separator after it: kept whole
    for cut in range(1, len(text)):
        assert _ours(str(path), [cut], len(text)) == expected, cut


def test_a_compressed_file_is_one_range_read_to_its_end(tmp_path):
    plain = tmp_path / "a.txt"
    plain.write_bytes(b"x\n" * 3_000_000)  # 6 MB: more than one range
    packed = tmp_path / "b.txt.gz"
    packed.write_bytes(gzip.compress(b"one\r\ntwo\nthree"))
    (tmp_path / "empty.txt").write_bytes(b"")
    read = TextRead("Read", str(tmp_path / "*"), CompressionTypes.AUTO, "text:p")
    partitions = text_partitions(read, parallelism=4)
    assert partitions == [  # ranges of at least MIN_RANGE_BYTES, packed largest first
        [(str(plain), CompressionTypes.UNCOMPRESSED, 0, MIN_RANGE_BYTES)],
        [
            (str(plain), CompressionTypes.UNCOMPRESSED, MIN_RANGE_BYTES, 6_000_000),
            (str(packed), CompressionTypes.GZIP, 0, None),  # one range, read to its end
        ],
    ]  # and no range of the empty file
    ranges = sorted(r for p in partitions for r in p)
    lines = [x for r in ranges for block in text_lines._lines(*r) for x in block]
    assert lines[-3:] == [b"one", b"two", b"three"] and len(lines) == 3_000_003


def test_many_small_files_share_a_few_partitions(tmp_path):
    for i in range(50):
        (tmp_path / f"part-{i:03d}").write_bytes(b"line\n" * 200)
    read = TextRead("Read", str(tmp_path / "part-*"), CompressionTypes.AUTO, "text:p")
    partitions = text_partitions(read, parallelism=2)
    assert len(partitions) == 1  # 50 KB in all: one task, not one per file
    assert sorted(r[0] for r in partitions[0]) == sorted(str(p) for p in tmp_path.iterdir())

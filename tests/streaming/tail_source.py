"""A file-tailing offset SDF for startpoint tests: positions are visible in the output.

Each element is the path of one partition's data file. Record ``i`` of a partition is line ``i``
of its file; the test appends lines while the job is down (or running), like a log that grows.
The restriction is ``OffsetRange(0, stop)`` with ``stop`` read from ``<path>.stop`` when the
element starts, so a job ends once every partition has read ``stop`` records. Output:
``"<partition> <position>"`` lines, through the exactly-once sink, one file set per run.
"""

from __future__ import annotations

import glob
import os
from collections import Counter

import apache_beam as beam
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.transforms.core import RestrictionProvider
from apache_beam.utils.timestamp import Duration

SOURCE = "ReadTail"
PIPELINE = "pipeline-0"


def available(path: str) -> int | None:
    """Records written so far (None: the partition has no file yet)."""
    try:
        with open(path) as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return None


class TailProvider(RestrictionProvider):
    """OffsetRange restrictions, plus the startpoint hooks a log-like source defines."""

    def initial_restriction(self, path):
        with open(path + ".stop") as f:
            return OffsetRange(0, int(f.read()))

    def create_tracker(self, restriction):
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, path, restriction):
        return restriction.size()

    def latest_offset(self, path):
        """For ``upcoming``: the offset the next record gets."""
        return available(path)

    def startpoint_key(self, path):
        """Operators name a partition, not the path: ``--key a``."""
        return os.path.basename(path)


class TailFiles(beam.DoFn):
    """Reads what is there, then checks again after ``delay_s`` until ``stop`` records."""

    def __init__(self, delay_s: float = 0.05) -> None:
        self.delay_s = delay_s

    def process(self, path, tracker=beam.DoFn.RestrictionParam(TailProvider())):
        restriction = tracker.current_restriction()
        pos, name = restriction.start, os.path.basename(path)
        end = min(available(path) or 0, restriction.stop)
        while pos < end:
            if not tracker.try_claim(pos):
                return
            yield f"{name} {pos}"
            pos += 1
        if pos < restriction.stop:
            tracker.defer_remainder(Duration(seconds=self.delay_s))


def tail(p, data_dir: str, partitions, delay_s: float = 0.05):
    paths = [os.path.join(data_dir, name) for name in partitions]
    return p | "Partitions" >> beam.Create(paths) | SOURCE >> beam.ParDo(TailFiles(delay_s))


def write(data_dir: str, name: str, upto: int, stop: int | None = None) -> None:
    """Grow partition ``name`` to ``upto`` records at once (temp + rename; and set its stop)."""
    os.makedirs(data_dir, exist_ok=True)
    path = os.path.join(data_dir, name)
    with open(path + ".tmp", "w") as f:
        f.writelines(f"record {i}\n" for i in range(upto))
    os.replace(path + ".tmp", path)
    if stop is not None:
        with open(path + ".stop", "w") as f:
            f.write(str(stop))


def visible(out_dir: str) -> Counter:
    """How often each ``"<partition> <position>"`` line is in the sink's visible files."""
    lines: Counter = Counter()
    for path in glob.glob(os.path.join(out_dir, "out-*")):
        with open(path) as f:
            lines.update(line.rstrip("\n") for line in f if line.strip())
    return lines


def positions(name: str, start: int, stop: int) -> Counter:
    return Counter(f"{name} {i}" for i in range(start, stop))

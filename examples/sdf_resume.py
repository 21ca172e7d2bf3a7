"""Tail a growing file with a splittable DoFn that resumes itself.

Each input element is a file path. The SDF's restriction is an ``OffsetRange``
of byte offsets ``[0, 2**62)`` (an "unbounded" range). Each call reads the
complete lines currently in the file from the restriction's start, claims each
line's start offset and emits the line. At the current end of the file it
calls ``tracker.defer_remainder(Duration(seconds=--poll_s))``: the runner keeps
the rest of the range as a residual and re-feeds it after the delay. When the
sentinel line ``__END__`` is read the SDF finishes the restriction with
Beam's own idiom ``tracker.try_claim(tracker.current_restriction().stop)``:
claiming the end of the range claims nothing (it returns False) but marks the
range as done, so ``check_done`` passes (``apache_beam.dataframe.io`` ends its
reads the same way). That also holds if the runner has split the range.

A line belongs to a restriction if its start offset is inside it (as in
``ReadFromText``). A residual starts one byte after the last claimed line
start, i.e. possibly mid-line, so a call whose range does not start at 0 skips
to the first line that starts at or after the range's start.

    python examples/sdf_resume.py --demo --output out/tail --runner=SparkCheckpointRunner
    python examples/sdf_resume.py --path /var/log/app.log --output out/tail \\
        --runner=SparkCheckpointRunner --checkpoint_dir /tmp/ckpt

With ``--demo`` a background thread appends ``--demo_lines`` lines to the file
over ``--demo_s`` seconds (default 5) and then writes the sentinel, so the job ends by
itself. Other flags go to Beam (``--spark_master_url local[2]``,
``--residual_budget_s 0``, ``--checkpoint_dir DIR``, ...).
"""

from __future__ import annotations

import argparse
import glob
import os
import threading
import time

import apache_beam as beam
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.core import RestrictionProvider
from apache_beam.utils.timestamp import Duration

SENTINEL = "__END__"
UNBOUNDED = 2**62
START_TIMEOUT_S = 120.0


class TailRestrictionProvider(RestrictionProvider):
    """Restriction ``[0, 2**62)`` of byte offsets for a file path."""

    def initial_restriction(self, element):
        return OffsetRange(0, UNBOUNDED)

    def create_tracker(self, restriction):
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, element, restriction):
        # The bytes known to be there now (the range's own size is meaningless).
        try:
            size = os.path.getsize(element)
        except OSError:
            size = 0
        return max(1, size - restriction.start)


class TailFile(beam.DoFn):
    """Emit the complete lines of a growing file until its ``__END__`` line."""

    def __init__(self, poll_s: float = 0.5, mark_start: bool = False) -> None:
        self.poll_s = poll_s
        # Demo only: create <path>.tailing on the first call, so the demo writer
        # starts appending once the tailer runs (whatever the start-up time).
        self.mark_start = mark_start
        self.calls = Metrics.counter("tail", "calls")
        self.lines = Metrics.counter("tail", "lines")

    def process(self, path, tracker=beam.DoFn.RestrictionParam(TailRestrictionProvider())):
        self.calls.inc()
        if self.mark_start and not os.path.exists(path + ".tailing"):
            open(path + ".tailing", "w").close()
        yield from self._read(path, tracker)

    def _read(self, path, tracker):
        start = tracker.current_restriction().start
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            tracker.defer_remainder(Duration(seconds=self.poll_s))
            return
        with f:
            if start > 0:
                # Skip to the first line starting at or after `start`.
                f.seek(start - 1)
                skipped = f.readline()
                if not skipped.endswith(b"\n"):
                    # That line is not complete yet: nothing to read until it is.
                    tracker.defer_remainder(Duration(seconds=self.poll_s))
                    return
            pos = f.tell()
            while True:
                line = f.readline()
                if not line.endswith(b"\n"):
                    # End of the file for now (an incomplete last line is not read).
                    tracker.defer_remainder(Duration(seconds=self.poll_s))
                    return
                text = line[:-1].decode("utf-8").rstrip("\r")
                if text == SENTINEL:
                    # Done: claiming the range's end marks it fully claimed.
                    tracker.try_claim(tracker.current_restriction().stop)
                    return
                if not tracker.try_claim(pos):
                    # The runner split the range here; the rest is not ours.
                    return
                self.lines.inc()
                yield text
                pos += len(line)


def demo_lines(n: int) -> list[str]:
    return [f"line {i:04d}" for i in range(n)]


def start_demo_writer(path: str, n_lines: int, seconds: float) -> threading.Thread:
    """Append ``n_lines`` lines to ``path`` over ``seconds`` seconds, then the sentinel.

    Appending starts when the tailer has first opened the file (``<path>.tailing``
    exists), or after START_TIMEOUT_S seconds.

    Lines are written in two pieces with a pause between, so the tailer also sees
    incomplete last lines.
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    open(path, "w").close()
    marker = path + ".tailing"
    if os.path.exists(marker):
        os.remove(marker)
    pause = seconds / max(1, n_lines)

    def write() -> None:
        deadline = time.time() + START_TIMEOUT_S
        while not os.path.exists(marker) and time.time() < deadline:
            time.sleep(0.05)
        with open(path, "a", encoding="utf-8") as f:
            for line in demo_lines(n_lines):
                half = len(line) // 2
                f.write(line[:half])
                f.flush()
                time.sleep(pause / 2)
                f.write(line[half:] + "\n")
                f.flush()
                time.sleep(pause / 2)
            f.write(SENTINEL + "\n")
            f.flush()

    thread = threading.Thread(target=write, name="demo-writer", daemon=True)
    thread.start()
    return thread


def build(
    p: beam.Pipeline, path: str, output: str, poll_s: float, mark_start: bool = False
) -> None:
    (
        p
        | "Path" >> beam.Create([path])
        | "Tail" >> beam.ParDo(TailFile(poll_s, mark_start))
        | "Write" >> beam.io.WriteToText(output)
    )


def read_output(output: str) -> list[str]:
    lines: list[str] = []
    for shard in sorted(glob.glob(output + "-*-of-*")):
        with open(shard, encoding="utf-8") as f:
            lines.extend(f.read().splitlines())
    return lines


def _counter(result, name: str):
    """The committed value of counter tail/<name>, or None if the runner has no metrics."""
    try:
        found = result.metrics().query(MetricsFilter().with_name(name))["counters"]
    except Exception:  # noqa: BLE001 - metrics are informational here
        return None
    return sum(c.committed or 0 for c in found if c.key.metric.namespace == "tail")


def run(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--path", default=None, help="File to tail. Default with --demo: <output>.input.txt"
    )
    parser.add_argument("--output", default="out/tail", help="Output prefix. Default: %(default)s")
    parser.add_argument(
        "--poll_s",
        type=float,
        default=0.5,
        help="Resume delay at the end of the file. Default: %(default)s",
    )
    parser.add_argument(
        "--demo",
        action="store_true",
        help="Append lines to the file in a background thread, then __END__.",
    )
    parser.add_argument("--demo_lines", type=int, default=40, help="Default: %(default)s")
    parser.add_argument("--demo_s", type=float, default=5.0, help="Default: %(default)s")
    args, beam_args = parser.parse_known_args(argv)
    path = args.path or (args.output + ".input.txt" if args.demo else None)
    if path is None:
        parser.error("--path is required without --demo")
    path = os.path.abspath(path)
    for old in glob.glob(args.output + "-*-of-*"):
        os.remove(old)

    writer = start_demo_writer(path, args.demo_lines, args.demo_s) if args.demo else None
    t0 = time.time()
    p = beam.Pipeline(options=PipelineOptions(beam_args))
    build(p, path, args.output, args.poll_s, mark_start=args.demo)
    result = p.run()
    result.wait_until_finish()
    elapsed = time.time() - t0
    calls = _counter(result, "calls")
    if writer is not None:
        writer.join(timeout=1)

    lines = read_output(args.output)
    print(f"read {len(lines)} line(s) from {path} in {elapsed:.1f} s, {calls} call(s) of the SDF:")
    for line in sorted(lines):
        print(f"  {line}")
    if args.demo:
        ok = sorted(lines) == demo_lines(args.demo_lines)
        print("demo: all appended lines read exactly once" if ok else "demo: MISMATCH")
    return lines


if __name__ == "__main__":
    run()

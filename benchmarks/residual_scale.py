"""Benchmark: does the driver stay flat while the SDF residuals pending grow? (issue 30, item 4)

A real ``--streaming`` job with a checkpoint store, one child process per size: N elements,
each read by a splittable DoFn that claims one position per call and defers the rest of its
restriction (``--positions`` in all) -- N residuals pending after every round, as a poller of
N partitions or files would keep them. Reported per size: wall time, the driver's peak
resident memory (the Python driver process; Spark's JVM is apart), its growth against the
smallest size, the driver's growth per pending residual, and exactness (every position read
once, counted by a Beam metric).

Before residuals were task-owned, every residual went to the driver's table and timer heap
each round; now the tasks keep them in their key groups and the driver holds three numbers
per stage.

    python benchmarks/residual_scale.py --residuals 1e4,1e5
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _harness  # noqa: E402


def child(args: argparse.Namespace) -> None:
    """One ``--streaming`` run over ``args.n`` deferring elements; one JSON line."""
    import resource

    import apache_beam as beam
    from apache_beam.io.restriction_trackers import OffsetRange
    from apache_beam.metrics import Metrics
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.utils.timestamp import Duration

    from sparkbeam.sdf import OffsetRangeProvider

    n, shards, positions = args.n, args.shards, args.positions

    class Elements(beam.DoFn):
        def process(self, shard):
            yield from range(shard, n, shards)

    class Positions(OffsetRangeProvider):
        def initial_restriction(self, element):
            return OffsetRange(0, positions)

    class Poll(beam.DoFn):
        """Claims one position a call, then defers the rest (a poller of ``n`` sources)."""

        def __init__(self):
            self.read = Metrics.counter("residual_scale", "read")

        def process(self, element, tracker=beam.DoFn.RestrictionParam(Positions())):
            pos = tracker.current_restriction().start
            if tracker.try_claim(pos):
                self.read.inc()
                yield element, pos
                if pos + 1 < tracker.current_restriction().stop:
                    tracker.defer_remainder(Duration(seconds=args.delay_s))

    options = PipelineOptions(
        [
            "--runner=SparkCheckpointRunner",
            "--streaming",
            f"--checkpoint_dir={args.store}",
            f"--parallelism={args.parallelism}",
            "--spark_master_url=local[2]",
        ]
    )
    t0 = time.perf_counter()
    p = beam.Pipeline(options=options)
    _ = p | beam.Create(list(range(shards))) | beam.ParDo(Elements()) | beam.ParDo(Poll())
    result = p.run()
    result.wait_until_finish()
    wall = time.perf_counter() - t0
    counters = result.metrics().query()["counters"]
    read = sum(c.committed or c.attempted or 0 for c in counters if c.key.metric.name == "read")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"n": n, "wall": wall, "driver_peak_mb": peak_mb, "read": read}))


def run_sizes(args: argparse.Namespace) -> int:
    _harness.become_subreaper()
    rows, base = [], None
    for n in [int(float(k)) for k in args.residuals.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            log = os.path.join(tmp, "child.log")
            cmd = [
                sys.executable, __file__, "--child", "--n", str(n),
                "--store", os.path.join(tmp, "ckpt"), "--parallelism", str(args.parallelism),
                "--shards", str(args.shards), "--positions", str(args.positions),
                "--delay_s", str(args.delay_s),
            ]  # fmt: skip
            got, problem = _harness.json_child(cmd, log, args.timeout)
            if got is None:
                print(f"N={n}: failed: {problem}")
                return 1
        base = base or got
        grown = got["driver_peak_mb"] - base["driver_peak_mb"]
        per = grown * 1e6 / (n - base["n"]) if n > base["n"] else float("nan")
        exact = got["read"] == n * args.positions
        rows.append(
            (
                f"{n:.0e}",
                f"{got['wall']:.1f}",
                f"{got['driver_peak_mb']:.0f}",
                f"{grown:+.0f}",
                f"{per:.0f}",
                "yes" if exact else f"no ({got['read']} of {n * args.positions})",
            )
        )
    head = ("residuals", "wall s", "driver peak MB", "vs first", "B/residual", "exact")
    print(_harness.format_table(head, rows))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--residuals", default="1e4,1e5", help="pending residuals (default: 1e4,1e5)")
    ap.add_argument("--positions", type=int, default=3, help="positions per element (default: 3)")
    ap.add_argument("--delay_s", type=float, default=0.2, help="resume delay (default: 0.2)")
    ap.add_argument("--parallelism", type=int, default=2, help="job parallelism (default: 2)")
    ap.add_argument("--shards", type=int, default=4, help="source shards (default: 4)")
    ap.add_argument("--timeout", type=float, default=1800, help="per child, s (default: 1800)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return 0
    return run_sizes(args)


if __name__ == "__main__":
    sys.exit(main())

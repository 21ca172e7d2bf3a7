"""Benchmark: does the driver stay flat while a durable batch SDF stage's output grows?
(issue 30, item 5)

A real batch job with a checkpoint store, one child process per size: ``--shards`` elements,
each read by a splittable DoFn that emits ``--chunk_kb`` KB records, a share a call, and defers
the rest of its restriction (``--rounds`` rounds in all); a Reshuffle takes the output to a
stage that counts it.
Every round's output chunks are kept in the checkpoint until the stage ends (a killed job
resumes from them). Reported per size: wall time, the driver's peak resident memory (the
Python driver; Spark's JVM is apart), its growth against the smallest size per MB of output,
the store's size, and exactness (every record counted once).

Before the output chunks were task-owned, every chunk went through the driver's table (and
its snapshots); now the tasks keep them in their key groups and the driver holds handles.

    python benchmarks/stage_output_scale.py --output_mb 20,200
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _harness  # noqa: E402


def child(args: argparse.Namespace) -> None:
    """One batch run emitting ``args.output_mb`` MB; one JSON line."""
    import resource

    import apache_beam as beam
    from apache_beam.io.restriction_trackers import OffsetRange
    from apache_beam.metrics import Metrics
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.utils.timestamp import Duration

    from sparkbeam.sdf import OffsetRangeProvider

    chunk = args.chunk_kb * 1024
    per_shard = max(1, int(float(args.output_mb) * 2**20 / chunk / args.shards))
    per_call = max(1, -(-per_shard // args.rounds))

    class Records(OffsetRangeProvider):
        def initial_restriction(self, element):
            return OffsetRange(0, per_shard)

    class Emit(beam.DoFn):
        """Emits ``per_call`` records a call, then defers the rest."""

        def __init__(self):
            self.emitted = Metrics.counter("stage_output_scale", "emitted")

        def process(self, shard, tracker=beam.DoFn.RestrictionParam(Records())):
            pos = tracker.current_restriction().start
            end = min(pos + per_call, per_shard)
            while pos < end and tracker.try_claim(pos):
                self.emitted.inc()
                yield b"%08d%08d" % (shard, pos) + b"x" * (chunk - 16)
                pos += 1
            if pos < tracker.current_restriction().stop:
                tracker.defer_remainder(Duration(seconds=args.delay_s))

    class Count(beam.DoFn):
        def __init__(self):
            self.counted = Metrics.counter("stage_output_scale", "counted")

        def process(self, record):
            self.counted.inc()

    options = PipelineOptions(
        [
            "--runner=SparkCheckpointRunner",
            f"--checkpoint_dir={args.store}",
            f"--parallelism={args.parallelism}",
            "--spark_master_url=local[2]",
        ]
    )
    t0 = time.perf_counter()
    p = beam.Pipeline(options=options)
    emitted = p | beam.Create(list(range(args.shards))) | beam.ParDo(Emit())
    _ = emitted | beam.Reshuffle() | beam.ParDo(Count())  # the SDF stage's output: a buffer
    result = p.run()
    result.wait_until_finish()
    wall = time.perf_counter() - t0
    counters = {
        c.key.metric.name: c.committed or c.attempted or 0
        for c in result.metrics().query()["counters"]
    }
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    store_mb = sum(
        os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(args.store) for f in fs
    ) / 2**20  # fmt: skip
    print(
        json.dumps(
            {
                "output_mb": per_shard * args.shards * chunk / 2**20,
                "records": per_shard * args.shards,
                "wall": wall,
                "driver_peak_mb": peak_mb,
                "store_mb": store_mb,
                "emitted": counters.get("emitted", 0),
                "counted": counters.get("counted", 0),
            }
        )
    )


def run_sizes(args: argparse.Namespace) -> int:
    flags = [
        "--parallelism", str(args.parallelism), "--shards", str(args.shards),
        "--rounds", str(args.rounds), "--chunk_kb", str(args.chunk_kb),
        "--delay_s", str(args.delay_s),
    ]  # fmt: skip
    sizes = args.output_mb.split(",")
    results = _harness.sized_runs(__file__, sizes, "--output_mb", flags, args.timeout)
    if results is None:
        return 1
    rows = []
    for got in results:
        grown, per = _harness.driver_growth(got, results[0], "output_mb")
        exact = got["counted"] == got["records"]
        rows.append(
            (
                f"{got['output_mb']:.0f}", f"{got['wall']:.1f}", f"{got['driver_peak_mb']:.0f}",
                grown, per, f"{got['store_mb']:.0f}",
                "yes" if exact else f"no ({got['counted']} of {got['records']})",
            )
        )  # fmt: skip
    head = ("output MB", "wall s", "driver MB", "vs first", "MB/output MB", "store MB", "exact")
    print(_harness.format_table(head, rows))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--output_mb", default="20,200", help="output sizes (default: 20,200)")
    ap.add_argument("--chunk_kb", type=int, default=64, help="record size (default: 64)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds to emit it in (default: 4)")
    ap.add_argument("--delay_s", type=float, default=0.1, help="resume delay (default: 0.1)")
    ap.add_argument("--parallelism", type=int, default=2, help="job parallelism (default: 2)")
    ap.add_argument("--shards", type=int, default=4, help="SDF elements (default: 4)")
    ap.add_argument("--timeout", type=float, default=1800, help="per child, s (default: 1800)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return 0
    return run_sizes(args)


if __name__ == "__main__":
    sys.exit(main())

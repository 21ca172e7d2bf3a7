"""Benchmark: does the driver stay flat while a streaming side input grows? (issue 30, item 5)

A real streaming job, one child process per size: ``--side_mb`` MB of side input made by
tasks (``--shards`` elements, each expanded into ``--chunk_kb`` KB records), read as an
``AsIter`` by a stage whose main input a splittable DoFn emits over ``--rounds`` rounds; each
main element counts the records it sees of the side input. Reported per size: wall time, the
driver's peak resident memory (the Python driver; Spark's JVM is apart), its growth against
the smallest size per MB of side input, the store's size, and exactness (every main element
saw every side record).

Before, the driver collected the side input, kept it in its table and checkpoints, and
broadcast all of it to the reading stage every round; now the tasks that made it keep it in
their key groups, and the reading tasks read its files (the driver passes handles).

    python benchmarks/side_input_scale.py --side_mb 10,100
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _harness  # noqa: E402


def child(args: argparse.Namespace) -> None:
    """One streaming run with ``args.side_mb`` MB of side input; one JSON line."""
    import apache_beam as beam
    from apache_beam.io.restriction_trackers import OffsetRange
    from apache_beam.metrics import Metrics
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.utils.timestamp import Duration

    from sparkbeam.sdf import OffsetRangeProvider

    chunk = args.chunk_kb * 1024
    per_shard = max(1, int(float(args.side_mb) * 2**20 / chunk / args.shards))
    side_records = per_shard * args.shards
    main_records = args.rounds * 2

    class Main(OffsetRangeProvider):
        def initial_restriction(self, element):
            return OffsetRange(0, main_records)

    class Emit(beam.DoFn):
        """Two main elements a round, then defers the rest."""

        def process(self, element, tracker=beam.DoFn.RestrictionParam(Main())):
            pos = tracker.current_restriction().start
            end = min(pos + 2, main_records)
            while pos < end and tracker.try_claim(pos):
                yield pos
                pos += 1
            if pos < tracker.current_restriction().stop:
                tracker.defer_remainder(Duration(seconds=args.delay_s))

    class Sees(beam.DoFn):
        def __init__(self):
            self.whole = Metrics.counter("side_input_scale", "saw_all")

        def process(self, element, side):
            if sum(1 for _ in side) == side_records:
                self.whole.inc()

    options = PipelineOptions(
        [
            "--runner=SparkCheckpointRunner",
            "--streaming",
            f"--checkpoint_dir={args.store}",
            "--checkpoint_interval_s=0.05",
            f"--parallelism={args.parallelism}",
            "--spark_master_url=local[2]",
        ]
    )
    t0 = time.perf_counter()
    p = beam.Pipeline(options=options)
    side = (
        p
        | "Shards" >> beam.Create(list(range(args.shards)))
        | "Expand"
        >> beam.FlatMap(
            lambda s: (b"%08d%08d" % (s, i) + b"x" * (chunk - 16) for i in range(per_shard))
        )
    )
    main = p | "Seed" >> beam.Create([0]) | "Emit" >> beam.ParDo(Emit())
    _ = main | "Sees" >> beam.ParDo(Sees(), side=beam.pvalue.AsIter(side))
    result = p.run()
    result.wait_until_finish()
    wall = time.perf_counter() - t0
    counters = {
        c.key.metric.name: c.committed or c.attempted or 0
        for c in result.metrics().query()["counters"]
    }
    _harness.print_scale_result(
        args.store,
        side_mb=side_records * chunk / 2**20,
        main=main_records,
        wall=wall,
        saw_all=counters.get("saw_all", 0),
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _harness.scale_arguments(
        ap, "--side_mb", "10,100", "side input sizes", "side input shards", "rounds of main input"
    )
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return 0
    return _harness.scale_table(__file__, args, "--side_mb", "side", ("saw_all", "main"))


if __name__ == "__main__":
    sys.exit(main())

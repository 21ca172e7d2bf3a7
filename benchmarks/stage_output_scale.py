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
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _harness  # noqa: E402


def child(args: argparse.Namespace) -> None:
    """One batch run emitting ``args.output_mb`` MB; one JSON line."""
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
    _harness.print_scale_result(
        args.store,
        output_mb=per_shard * args.shards * chunk / 2**20,
        records=per_shard * args.shards,
        wall=wall,
        emitted=counters.get("emitted", 0),
        counted=counters.get("counted", 0),
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _harness.scale_arguments(
        ap, "--output_mb", "20,200", "output sizes", "SDF elements", "rounds to emit it in"
    )
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return 0
    return _harness.scale_table(__file__, args, "--output_mb", "output", ("counted", "records"))


if __name__ == "__main__":
    sys.exit(main())

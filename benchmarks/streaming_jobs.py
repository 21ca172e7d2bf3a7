"""The jobs ``streaming.py`` times, each run in a child process of its own.

``build``: the Beam pipeline (sparkbeam ``--streaming``, sparkbeam batch, DirectRunner), an
offset-style SDF source -> ``FixedWindows`` -> GroupByKey (or a stateful DoFn) -> one line per
(key, window). ``_spark_streaming``: the same windowed count in Spark's own Structured
Streaming, the latency baseline. ``run_child`` runs one of them and writes its round times.
"""

from __future__ import annotations

import argparse
import json
import os
import time

STATE_STORES = {"rocksdb": "RocksDBStateStoreProvider", "hdfs": "HDFSBackedStateStoreProvider"}


def build(p, args: argparse.Namespace, call_log: str, out: str) -> None:
    """The benchmark job; ``rate <= 0`` means every record is due at once."""
    import apache_beam as beam
    from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
    from apache_beam.transforms import window
    from apache_beam.transforms.core import WatermarkEstimatorProvider
    from apache_beam.utils.timestamp import Duration, Timestamp

    from sparkbeam.io import WriteToFilesOnCheckpoint
    from sparkbeam.sdf import OffsetRangeProvider

    shards, keys, per_call, delay_s = args.shards, args.keys, args.per_call, args.delay_s
    rate_per_shard = args.rate / shards if args.rate > 0 else 0.0

    class Manual(WatermarkEstimatorProvider):
        def initial_estimator_state(self, element, restriction):
            return None

        def create_watermark_estimator(self, state):
            return ManualWatermarkEstimator(state)

    class KeyedSource(beam.DoFn):
        """Element (shard, n, t0): emits the shard's records due by now, then defers."""

        def process(
            self,
            element,
            tracker=beam.DoFn.RestrictionParam(OffsetRangeProvider()),
            estimator=beam.DoFn.WatermarkEstimatorParam(Manual()),
        ):
            shard, _, t0 = element
            start = time.time()
            pos = tracker.current_restriction().start
            due = int((start - t0) * rate_per_shard) + 1 if rate_per_shard else pos + per_call
            limit = min(due, pos + per_call)
            emitted = 0
            while pos < limit and tracker.try_claim(pos):
                t = time.time()
                yield window.TimestampedValue((f"k{(pos * shards + shard) % keys:06d}", t), t)
                pos += 1
                emitted += 1
            estimator.set_watermark(Timestamp(time.time()))
            with open(call_log, "a") as f:
                f.write(f"{start} {time.time()} {emitted}\n")
            if pos < tracker.current_restriction().stop:
                tracker.defer_remainder(Duration(seconds=delay_s))

    def line(kv, win=beam.DoFn.WindowParam):
        key, ts = kv
        yield f"{key} {int(win.start)} {len(ts)} {min(ts):.3f} {sum(ts):.3f}"

    n = args.records
    sizes = [n // shards + (1 if s < n % shards else 0) for s in range(shards)]
    windowed = (
        p
        | beam.Create(list(enumerate(sizes)))
        | "Start" >> beam.MapTuple(lambda s, size: (s, size, time.time()))  # at run time
        | "Source" >> beam.ParDo(KeyedSource())
        | beam.WindowInto(window.FixedWindows(args.window_s))
    )
    if args.grouping == "state":
        lines = windowed | beam.ParDo(_StatefulLines())
    else:
        lines = windowed | beam.GroupByKey() | beam.ParDo(line)
    _ = lines | WriteToFilesOnCheckpoint(os.path.join(out, "part"))


def _stateful_lines_dofn():
    """``--grouping state``: the GroupByKey's line from user state and an event-time timer
    at the window's end (per key and window: a count, the least and the sum of ``t``)."""
    import operator

    import apache_beam as beam
    from apache_beam.coders import FloatCoder, VarIntCoder
    from apache_beam.transforms.timeutil import TimeDomain
    from apache_beam.transforms.userstate import CombiningValueStateSpec, TimerSpec, on_timer

    class Scalar(beam.CombineFn):
        """A combine whose accumulator is the value itself (so a scalar coder encodes it)."""

        def __init__(self, fn, zero):
            self.fn, self.zero = fn, zero

        def create_accumulator(self):
            return self.zero

        def add_input(self, acc, value):
            return self.fn(acc, value)

        def merge_accumulators(self, accs):
            out = self.zero
            for acc in accs:
                out = self.fn(out, acc)
            return out

        def extract_output(self, acc):
            return acc

    class StatefulLines(beam.DoFn):
        COUNT = CombiningValueStateSpec("count", VarIntCoder(), Scalar(operator.add, 0))
        LEAST = CombiningValueStateSpec("least", FloatCoder(), Scalar(min, float("inf")))
        TOTAL = CombiningValueStateSpec("total", FloatCoder(), Scalar(operator.add, 0.0))
        END = TimerSpec("end", TimeDomain.WATERMARK)

        def process(
            self,
            kv,
            win=beam.DoFn.WindowParam,
            count=beam.DoFn.StateParam(COUNT),
            least=beam.DoFn.StateParam(LEAST),
            total=beam.DoFn.StateParam(TOTAL),
            end=beam.DoFn.TimerParam(END),
        ):
            _, t = kv
            count.add(1)
            least.add(t)
            total.add(t)
            end.set(win.max_timestamp())

        @on_timer(END)
        def flush(
            self,
            key=beam.DoFn.KeyParam,
            win=beam.DoFn.WindowParam,
            count=beam.DoFn.StateParam(COUNT),
            least=beam.DoFn.StateParam(LEAST),
            total=beam.DoFn.StateParam(TOTAL),
        ):
            yield f"{key} {int(win.start)} {count.read()} {least.read():.3f} {total.read():.3f}"
            for state in (count, least, total):
                state.clear()

    return StatefulLines


def _StatefulLines():  # noqa: N802 - builds the DoFn where Beam is imported (the child)
    return _stateful_lines_dofn()()


def _spark_streaming(args: argparse.Namespace) -> None:
    """The baseline: the same windowed count as Spark's own Structured Streaming stateful
    micro-batch (RocksDB state store with changelog checkpointing, exactly-once text sink),
    ``--rate`` rows/s from Spark's ``rate`` source, one trigger per ``--interval_s``."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    provider = "org.apache.spark.sql.execution.streaming.state." + STATE_STORES[args.spark_store]
    spark = (
        SparkSession.builder.master(args.master)
        .config("spark.sql.shuffle.partitions", str(args.shards))  # = sparkbeam's parallelism
        .config("spark.sql.streaming.stateStore.providerClass", provider)
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.sql.streaming.numRecentProgressUpdates", "100000")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    t = F.col("timestamp").cast("double")
    lines = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", int(args.rate))
        .option("numPartitions", args.shards)
        .load()
        .withWatermark("timestamp", "0 seconds")
        # Rows past the last still move the watermark: the filter names the event time too,
        # so the optimizer keeps it above the watermark (``value < records`` alone is pushed
        # below it, and the watermark stops with the last record).
        .where(F.when(F.col("value") < args.records, F.col("timestamp")).isNotNull())
        .withColumn("key", F.format_string("k%06d", F.col("value") % args.keys))
        .groupBy(F.window("timestamp", f"{args.window_s} seconds"), "key")
        .agg(F.count("*").alias("n"), F.min(t).alias("least"), F.sum(t).alias("total"))
        .select(
            F.format_string(
                "%s %d %d %.3f %.3f",
                "key", F.col("window.start").cast("long"), "n", "least", "total",
            ).alias("value")
        )
    )  # fmt: skip
    t0 = time.time()
    query = (
        lines.writeStream.format("text")
        .option("path", args.out)
        .option("checkpointLocation", args.ckpt)
        .outputMode("append")
        .trigger(processingTime=f"{args.interval_s} seconds")
        .start()
    )
    # Rows are due for records / rate s; the last window closes once the watermark passes it.
    last_end = t0 + args.records / args.rate + args.window_s
    deadline = last_end + 120
    while time.time() < deadline and _watermark(query.lastProgress) <= last_end:
        time.sleep(args.interval_s / 4)
    query.stop()
    t1 = time.time()
    with open(args.call_log, "w") as f:  # the source's span, as the Beam source logs it
        f.write(f"{t0} {t0 + args.records / args.rate} {args.records}\n")
    rounds = []
    for p in query.recentProgress:
        if not p.numInputRows:
            continue
        d = p.durationMs
        started = _epoch(p.timestamp)
        job = d.get("addBatch", 0) / 1000.0  # the batch's Spark job, state store commit included
        rounds.append(
            {"round_no": p.batchId, "started": started, "job_s": job,
             "commit_s": d["triggerExecution"] / 1000.0 - job}
        )  # fmt: skip
    with open(args.result, "w") as f:
        json.dump({"run_start": t0, "run_end": t1, "rounds": rounds}, f)
    spark.stop()


def _watermark(progress) -> float:
    """A Structured Streaming progress's event-time watermark, epoch seconds (0: none yet)."""
    mark = progress and progress.eventTime.get("watermark")
    return _epoch(mark) if mark else 0.0


def _epoch(iso: str) -> float:
    """Epoch seconds of a Structured Streaming progress time (ISO 8601, UTC, ``Z``)."""
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def run_child(args: argparse.Namespace) -> None:
    """One system's run of the job (``streaming.py --child``): its round times to ``--result``."""
    if args.child_system == "spark-streaming":
        _spark_streaming(args)
        return
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    if args.child_system == "direct":
        flags = ["--runner=DirectRunner"]
    else:
        flags = ["--runner=SparkCheckpointRunner", f"--spark_master_url={args.master}"]
        flags.append(f"--parallelism={args.shards}")
    if args.child_system == "streaming":
        flags += [
            "--streaming",
            f"--checkpoint_dir={args.ckpt}",
            f"--checkpoint_interval_s={args.interval_s}",
        ]
    p = beam.Pipeline(options=PipelineOptions(flags))
    build(p, args, args.call_log, args.out)
    t0 = time.time()
    result = p.run()
    result.wait_until_finish()
    t1 = time.time()
    rounds = []
    executor = getattr(result, "executor", None)
    for loop in getattr(executor, "loops", ()):
        rounds += [r._asdict() for r in loop.round_times]
    with open(args.result, "w") as f:
        json.dump({"run_start": t0, "run_end": t1, "rounds": rounds}, f)

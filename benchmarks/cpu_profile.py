"""Where a record's CPU goes: py-spy over sparkbeam's whole process tree (issue 45, 1).

Runs one workload on a warm session in this process, with py-spy on this process (the
driver) and on the Python workers (the zygote and everything it forks), and ``/proc`` CPU
times around it: the driver, the JVM, the workers (with their kernel time and librdkafka's own
threads), the broker; each also net of a 100-record run's. By default py-spy samples the
thread that holds the GIL (Python's CPU); ``--native`` samples C and Cython frames of every
thread, leaving out those that wait (py-spy stops the process for each sample: slower). Each
sample is charged to its *owner*: the innermost frame of a package we can name (sparkbeam's
own code, Beam, PySpark and py4j, confluent-kafka/librdkafka, Python's standard library),
walking out of the interpreter's and libc's own frames. Beam's Cython operators show no Python
frame of their own: without ``--native`` their time lands on the Python frame that called
them. Prints CPU microseconds per record by owner and process, and the functions that cost
the most, against Beam's own per-element path (FnApiRunner, one core) for the same operations.

    python benchmarks/cpu_profile.py kafka --records 2000000
    python benchmarks/cpu_profile.py wordcount --size-mb 100

Workloads: ``kafka`` is ``ReadFromKafka | Map | Count`` over a 2-partition topic of 100-byte
values (``benchmarks/kafka.py``'s throughput run); ``wordcount`` is
``examples/wordcount.py`` over ``benchmarks/wordcount.py``'s corpus (one record = one word).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[1])
sys.path.insert(0, REPO)

from benchmarks._harness import process_tree  # noqa: E402

PY_SPY = os.path.join(os.path.dirname(sys.executable), "py-spy")
PACKAGES = ("runner/", "sdf/", "checkpoint/", "translation/", "sparkbeam/")
OURS = tuple(f"{REPO}/{d}" for d in PACKAGES) + PACKAGES  # absolute, or as a worker names them
# A frame "name (file:line)" or "name (library.so)" of py-spy's raw output.
_FRAME = re.compile(r"^(?P<name>.*?) \((?P<where>[^()]*)\)$")


def owner(where: str, name: str) -> str | None:
    """The package a frame belongs to, or None for the interpreter, libc and unknown native
    frames (the sample's owner is then a frame further out)."""
    if where.startswith(OURS) or "/sparkbeam/" in where:
        # librdkafka's consume, a C call that holds the GIL while it builds the messages
        return "kafka client" if name == "poll" and "kafka_client.py" in where else "sparkbeam"
    for package, key in (
        ("beam", "apache_beam"), ("pyspark", "pyspark"), ("pyspark", "py4j"),
        ("kafka client", "confluent_kafka"), ("kafka client", "rdkafka"),
        ("pyarrow", "pyarrow"), ("cloudpickle", "cloudpickle"), ("rocksdict", "rocksdict"),
    ):  # fmt: skip
        if key in where or key in name:
            return package
    if "/lib/python3" in where and where.endswith(".py"):
        return "python stdlib"
    return None


# Where a thread waits: a ``--native`` sample whose innermost frame is one of these is idle.
WAITS = (
    "clock_nanosleep", "nanosleep", "futex", "pthread_cond", "cnd_timedwait", "epoll_wait",
    "poll (libc", "select (libc", "__libc_recv", "recv (libc", "read (libc", "accept",
)  # fmt: skip


def charge(stack: str) -> tuple[str, str]:
    """(owner, owning function) of one collapsed stack, innermost frame last; ("idle", ...)
    for a thread that waits (``--native`` samples every thread)."""
    frames = stack.split(";")
    if any(frames[-1].startswith(w) or w in frames[-1] for w in WAITS):
        return "idle", frames[-1][:100]
    for frame in reversed(frames):
        m = _FRAME.match(frame)
        if m is None:
            continue
        who = owner(m["where"], m["name"])
        if who is not None:
            where = m["where"].replace(REPO + "/", "").split("site-packages/")[-1]
            return who, f"{m['name']} ({where})"
    return "other", frames[-1][:100]


def read_raw(path: str) -> tuple[Counter, Counter]:
    """Samples by owner and by owning function of a py-spy ``--format raw`` file."""
    owners: Counter = Counter()
    functions: Counter = Counter()
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not count.isdigit():
                continue
            who, function = charge(stack)
            owners[who] += int(count)
            functions[(who, function)] += int(count)
    return owners, functions


class Recorder:
    """py-spy on one process (and, with ``subprocesses``, what it forks) until ``stop``."""

    def __init__(self, pid: int, out: str, rate: int, subprocesses: bool, native: bool) -> None:
        self.out = out
        how = ["--native"] if native else ["--gil", "--nonblocking"]
        cmd = [PY_SPY, "record", *how, "--pid", str(pid), "--rate", str(rate),
               "--format", "raw", "--output", out]  # fmt: skip
        if subprocesses:
            cmd.append("--subprocesses")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(120)


def cpu_by_kind(driver: int, broker: int | None) -> dict[str, float]:
    """CPU seconds so far of the driver, its JVM, the Python workers and the broker."""
    ticks = os.sysconf("SC_CLK_TCK")
    out: Counter = Counter()
    for pid, f in process_tree(driver).items():
        try:
            with open(f"/proc/{pid}/comm") as c:
                comm = c.read().strip()
        except OSError:
            continue
        kind = "driver" if pid == driver else ("jvm" if comm == "java" else "python workers")
        out[kind] += (int(f[11]) + int(f[12])) / ticks
        if kind == "python workers":  # the kernel's share; librdkafka's threads (rdk:*)
            out["  of which in the kernel"] += int(f[12]) / ticks
            out["  of which librdkafka threads"] += _threads_cpu(pid, "rdk:") / ticks
    if broker is not None:
        with open(f"/proc/{broker}/stat") as s:
            f = s.read().rsplit(")", 1)[1].split()
        out["broker"] = (int(f[11]) + int(f[12])) / ticks
    return out


def _threads_cpu(pid: int, prefix: str) -> int:
    """CPU ticks of ``pid``'s threads whose name starts with ``prefix``."""
    ticks = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as c:
                if not c.read().startswith(prefix):
                    continue
            with open(f"/proc/{pid}/task/{tid}/stat") as s:
                f = s.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(f[11]) + int(f[12])
    return ticks


def zygote_of(driver: int) -> int:
    """The zygote that forks the driver's Python workers (it detaches from the driver)."""
    for pid in process_tree(driver):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"sparkbeam.runner.spark.zygote" in f.read():
                return pid
    raise RuntimeError("no Python worker zygote: did the warm-up run start Spark's workers?")


def kafka_workload(args, log_dir: str):
    """(broker pid, a run of n records, the records of the measured run, Beam's floor)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from sparkbeam.io import ReadFromKafka
    from tests.servers import start_kafka_broker

    broker = start_kafka_broker(Path(log_dir))
    broker.create_topic("bench", 2, {"retention.ms": "-1"})
    value = b"x" * 100
    broker.produce("bench", [(b"%d" % i, value, None) for i in range(args.records)])
    config = {**broker.config(), "auto.offset.reset": "earliest"}
    options = PipelineOptions(["--runner=SparkCheckpointRunner", "--parallelism=2"])

    def run(n: int) -> None:
        p = beam.Pipeline(options=options)
        _ = (
            p
            | ReadFromKafka(config, ["bench"], max_num_records=n, max_poll_s=5.0)
            | beam.Map(lambda kv: len(kv[1]))
            | beam.combiners.Count.Globally()
        )
        p.run().wait_until_finish()

    from benchmarks.kafka import beam_floor

    return broker, run, args.records, lambda: beam_floor(min(args.records, 1_000_000), 100)


def wordcount_workload(args, log_dir: str):
    """(no broker, a run (any n: the corpus), the corpus's words, Beam's floor)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from benchmarks.wordcount import generate_corpus
    from examples.wordcount import build

    corpus = generate_corpus(args.size_mb, 0, os.path.join(tempfile.gettempdir(), "sb-bench"))
    small = os.path.join(log_dir, "small.txt")
    with open(small, "w") as f:
        f.write("warm up the session\n" * 100)

    def run(n: int) -> None:
        p = beam.Pipeline(options=PipelineOptions(["--runner=SparkCheckpointRunner"]))
        build(p, small if n < 1000 else corpus.path, os.path.join(log_dir, f"out{n}/out"))
        p.run().wait_until_finish()

    def floor() -> float:
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        def once(path: str) -> float:
            p = beam.Pipeline(runner=FnApiRunner())
            build(p, path, os.path.join(log_dir, "floor/out"))
            started = time.perf_counter()
            p.run().wait_until_finish()
            return time.perf_counter() - started

        once(small)
        return corpus.n_words / max(once(corpus.path) - once(small), 1e-9)

    return None, run, corpus.n_words, floor


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workload", choices=("kafka", "wordcount"))
    ap.add_argument("--records", type=int, default=2_000_000, help="kafka: records to read")
    ap.add_argument("--size-mb", type=float, default=100.0, help="wordcount: corpus size")
    ap.add_argument("--rate", type=int, default=97, help="py-spy samples a second")
    ap.add_argument("--top", type=int, default=25, help="functions to list")
    ap.add_argument(
        "--native", action="store_true",
        help="sample C and Cython frames too, every thread (py-spy stops the process for each "
        "sample: slower, but shows CPU spent without the GIL); default: the GIL holder only",
    )  # fmt: skip
    ap.add_argument("--no-floor", action="store_true", help="skip Beam's FnApiRunner floor")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workload = kafka_workload if args.workload == "kafka" else wordcount_workload
        broker, run, records, floor = workload(args, tmp)
        try:
            run(100)  # warm: the session, the worker daemon, imports
            me = os.getpid()
            bpid = broker.proc.pid if broker else None
            small = cpu_by_kind(me, bpid)
            run(100)  # a run's fixed cost, taken off the per-record figures
            fixed = {k: v - small.get(k, 0.0) for k, v in cpu_by_kind(me, bpid).items()}
            spies = [
                Recorder(me, f"{tmp}/driver.raw", args.rate, False, args.native),
                Recorder(zygote_of(me), f"{tmp}/workers.raw", args.rate, True, args.native),
            ]
            time.sleep(1.0)  # py-spy attaches
            before, started = cpu_by_kind(me, bpid), time.perf_counter()
            run(records)
            wall = time.perf_counter() - started
            after = cpu_by_kind(me, bpid)
            for spy in spies:
                spy.stop()
        finally:
            if broker is not None:
                from tests.servers import stop_process_group

                stop_process_group(broker.proc)
        report(args, records, wall, before, after, fixed, spies, floor)
    return 0


def report(args, records: int, wall: float, before, after, fixed, spies, floor) -> None:
    us = 1e6 / records
    print(f"{args.workload}: {records:,} records in {wall:.2f} s ({records / wall:,.0f}/s)")
    print("CPU per record by process (/proc; whole run, and net of a 100-record run's):")
    used = {k: v - before.get(k, 0.0) for k, v in after.items()}
    for kind in sorted(used, key=lambda k: (k.startswith(" "), -used[k])):
        net = (used[kind] - fixed.get(kind, 0.0)) * 1e6 / (records - 100)
        print(f"  {kind:30s} {used[kind] * us:7.2f} us  net {net:7.2f} us")
    for spy, what in zip(spies, ("driver", "python workers")):
        owners, functions = read_raw(spy.out)
        idle = owners.pop("idle", 0)
        functions = Counter({k: v for k, v in functions.items() if k[0] != "idle"})
        total = sum(owners.values())
        if idle:
            print(f"{what}: {idle} samples of waiting threads left out")
        print(f"{what}: {total} samples at {args.rate}/s, {total / args.rate * us:.2f} us/record")
        for who, n in owners.most_common():
            print(f"  {who:15s} {n / args.rate * us:7.2f} us  {100 * n / max(total, 1):5.1f}%")
        if what == "python workers":
            print("  costliest functions (owner, function: us per record):")
            for (who, function), n in functions.most_common(args.top):
                print(f"    {n / args.rate * us:6.2f}  {who:13s} {function}")
    if not args.no_floor:
        rate = floor()
        print(f"Beam's own per-element path (FnApiRunner, one core): {1e6 / rate:.2f} us/record")


if __name__ == "__main__":
    sys.exit(main())

"""Soak: does a streaming job hold up over time? (issue 43, "What to build" 6)

Starts a Tansu broker (``tests/servers.py``), produces ``--rate`` records a second (keys
``k000``.. round-robin over ``--partitions`` partitions, each stamped with its create time) for
``--minutes``, and runs ``soak_job.py`` (Kafka -> 10 s windows -> a count per key and window,
optionally reading a ``--side-input-kb`` KB-a-second windowed side input -> files) on it: at
``--kill-at`` of the duration its driver is SIGKILLed and restarted at
``--rescale-parallelism``; at ``--stop-at`` it is stopped (SIGTERM) and restarted at
``--parallelism``. Every ~10 s (less in short runs) it samples the driver's RSS, the RSS of its
whole process tree (JVM and Python workers, ``_harness.process_tree``), the store's bytes and
files, and how far the newest window with output lags the clock. The driver writes its round
times (Spark job + commit) as it goes. At the end it waits for the output, checks it exactly
(every acknowledged record counted once in its key's window, no pane twice, every side-input
window whole) and prints a summary against the issue's goals (``soak_report.py``), scaled to
the duration for runs shorter than an hour; ``--result`` writes it as JSON.

    python benchmarks/soak.py --minutes 60
    python benchmarks/soak.py --minutes 60 --side-input-kb 100
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _harness, soak_report  # noqa: E402

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "soak_job.py")
PAGE = os.sysconf("SC_PAGE_SIZE")


class PacedProducer(threading.Thread):
    """``rate`` records a second, every 5 ms what is due (so the broker gets many small
    batches, as from a live source), round-robin over the partitions, each stamped with its
    create time (never earlier than the one before); counts the acknowledged ones per (key,
    window start), which is the output the job owes."""

    def __init__(self, broker, topic: str, args: argparse.Namespace) -> None:
        super().__init__(name="soak-producer", daemon=True)
        self.broker, self.topic, self.args = broker, topic, args
        self.expected: Counter = Counter()
        self.sent = self.failed = self.unacked = 0
        self.errors: Counter = Counter()
        self.stop = threading.Event()

    def run(self) -> None:
        from confluent_kafka import Producer

        args, window_ms = self.args, self.args.window_s * 1000
        producer = Producer(self.broker.config(**{"enable.idempotence": "true", "linger.ms": "5"}))
        value = b"v" * args.value_bytes

        def acked(err, msg) -> None:
            if err is not None:
                self.failed += 1
                self.errors[str(err)] += 1
            else:
                ms = msg.timestamp()[1]
                self.expected[(msg.key().decode(), ms // window_ms * args.window_s)] += 1

        started, last_ms = time.time(), 0
        while not self.stop.is_set():
            due = int((time.time() - started) * args.rate)
            while self.sent < due:
                last_ms = max(last_ms, int(time.time() * 1000))
                key = b"k%03d" % (self.sent % args.keys)
                try:
                    producer.produce(
                        self.topic, key=key, value=value, partition=self.sent % args.partitions,
                        timestamp=last_ms, on_delivery=acked,
                    )  # fmt: skip
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.1)
                    continue
                self.sent += 1
            producer.poll(0)
            time.sleep(0.005)
        self.unacked = producer.flush(60)


class TailProbe:
    """A bare consumer's time to read the newest ``n`` records of partition 0: what the broker
    alone costs a read as the topic grows, beside the job's rounds (issue 43, 4: is a round-time
    creep the broker's?). A new consumer each time (a kept one waited out its previous long
    poll: 0.5 s). None when it did not get them within 10 s, or the broker did not answer
    (a busy broker timed the offsets query out and ended a soak after 17 minutes)."""

    def __init__(self, broker, topic: str, n: int = 1000) -> None:
        self.broker, self.topic, self.n = broker, topic, n

    def __call__(self) -> float | None:
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        started = time.perf_counter()
        consumer = Consumer(
            self.broker.config(**{"group.id": "soak-tail-probe", "enable.auto.commit": "false"})
        )
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(self.topic, 0), 5)
            start = max(low, high - self.n)
            consumer.assign([TopicPartition(self.topic, 0, start)])
            got = 0
            while got < high - start and time.perf_counter() - started < 10:
                got += sum(1 for m in consumer.consume(500, 0.5) if not m.error())
            return time.perf_counter() - started if got >= high - start else None
        except KafkaException:
            return None
        finally:
            consumer.close()


class Output:
    """The sink's visible lines, read a new file at a time: the newest window with output."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir, self.read, self.newest = out_dir, set(), None

    def newest_window(self) -> int | None:
        for path in sorted(Path(self.out_dir).glob("out-*")):
            if path.name not in self.read:
                self.read.add(path.name)
                for line in path.read_text().splitlines():
                    start = int(line.split()[1])
                    self.newest = start if self.newest is None else max(self.newest, start)
        return self.newest


def store_size(store: str) -> tuple[int, int]:
    """(bytes, files) under the store's directory."""
    size = files = 0
    for d, _, names in os.walk(store):
        for name in names:
            try:
                size += os.path.getsize(os.path.join(d, name))
                files += 1
            except OSError:  # deleted meanwhile (retention)
                pass
    return size, files


class DriverExited(RuntimeError):
    """A driver run ended on its own (a failed job): the soak stops there."""


class Soak:
    """One soak: the broker's topic, the producer, the driver runs, the samples."""

    def __init__(self, args: argparse.Namespace, broker, work: Path) -> None:
        self.args, self.broker, self.work = args, broker, work
        self.store, self.out = str(work / "ckpt"), str(work / "out")
        self.rounds = str(work / "rounds.jsonl")
        self.runs: list[dict] = []
        self.samples: list[dict] = []
        self.driver = None
        self.t0 = time.time()
        self.failure = ""
        self.at_stop: dict = {}  # the output's check when the producer stopped
        self.tail_probe: TailProbe | None = None

    def start_driver(self, parallelism: int) -> None:
        a = self.args
        n = len(self.runs) + 1
        cmd = [
            sys.executable, JOB, "--bootstrap", self.broker.bootstrap, "--topic", "soak",
            "--store", self.store, "--out", self.out, "--rounds", self.rounds,
            "--parallelism", str(parallelism), "--master", a.master,
            "--window-s", str(a.window_s), "--lateness-s", str(a.lateness_s),
            "--side-input-kb", str(a.side_input_kb), "--side-start", str(self.side_start),
        ]  # fmt: skip
        cmd += [f"--consumer={item}" for item in a.consumer]
        cmd += [f"--spark_conf={item}" for item in a.spark_conf]
        log = open(self.work / f"driver-{n}.log", "w")  # noqa: SIM115 - closed in end_driver
        self.driver = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, cwd=_harness.REPO,
            env=_harness.child_env(), start_new_session=True,
        )  # fmt: skip
        self.driver.log = log
        self.runs.append(
            {"run": n, "parallelism": parallelism, "start": time.time() - self.t0,
             "log": log.name}
        )  # fmt: skip

    def end_driver(self, how: str, sig: int, timeout_s: float) -> None:
        """Signal the driver; wait for it and its tree (JVM, Python workers) to exit; kill
        (and count) whatever is left after ``timeout_s``."""
        tree = _harness.process_tree(self.driver.pid)
        if self.driver.poll() is None:
            os.kill(self.driver.pid, sig)
        deadline = time.time() + timeout_s
        while time.time() < deadline and (self.driver.poll() is None or _alive(tree)):
            time.sleep(0.2)
        left = _alive(tree)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        self.driver.wait()
        self.driver.log.close()
        self.runs[-1].update(
            end=time.time() - self.t0, how=how, returncode=self.driver.returncode,
            left_behind=len(left),
        )  # fmt: skip

    def sample(self) -> dict:
        """Memory of the driver and of its process tree, the store, the output's lag."""
        tree = _harness.process_tree(self.driver.pid) if self.driver.poll() is None else {}
        own = tree.get(self.driver.pid)
        jvm = [f for pid, f in tree.items() if _comm(pid) == "java"]
        size, files = store_size(self.store)
        newest, now = self.out_reader.newest_window(), time.time()
        return {
            "t": now - self.t0, "run": len(self.runs),
            "driver_mb": int(own[21]) * PAGE / 2**20 if own else None,
            "tree_mb": sum(int(f[21]) for f in tree.values()) * PAGE / 2**20 if tree else None,
            "jvm_mb": sum(int(f[21]) for f in jvm) * PAGE / 2**20 if jvm else None,
            "processes": len(tree), "store_mb": size / 2**20, "store_files": files,
            "output_lag_s": None if newest is None else now - (newest + self.args.window_s),
            "tail_read_s": self.tail_probe() if self.tail_probe else None,
        }  # fmt: skip

    def sample_until(self, t_end: float, done=None) -> None:
        """Sample every ``sample_s`` until ``t_end`` (seconds since the start) or ``done()``."""
        a = self.args
        while time.time() - self.t0 < t_end:
            self.samples.append(self.sample())
            if self.driver.poll() is not None:
                raise DriverExited(
                    f"driver run {len(self.runs)} exited ({self.driver.returncode}): "
                    f"{_harness.error_line(self.runs[-1]['log'])}"
                )
            if done is not None and done():
                return
            time.sleep(max(0.0, min(a.sample_s, t_end - (time.time() - self.t0))))

    def until_rounds(self, n: int) -> None:
        """Sample on until the running driver has committed ``n`` rounds (at most
        ``--drain-s``): a kill before its first checkpoint would test nothing."""
        since = self.t0 + self.runs[-1]["start"]
        mine = lambda: sum(1 for r in soak_report.read_rounds(self.rounds) if r["started"] >= since)  # noqa: E731
        self.sample_until(time.time() - self.t0 + self.args.drain_s, lambda: mine() >= n)

    def run(self) -> dict:
        a = self.args
        seconds = a.minutes * 60
        self.broker.create_topic("soak", a.partitions)
        self.out_reader = Output(self.out)
        self.tail_probe = TailProbe(self.broker, "soak")
        producer = PacedProducer(self.broker, "soak", a)
        self.t0 = time.time()
        self.side_start = int(self.t0 // a.window_s * a.window_s)
        self.start_driver(a.parallelism)
        producer.start()
        try:
            if 0 < a.kill_at < 1:
                self.sample_until(a.kill_at * seconds)
                self.until_rounds(a.min_rounds)
                self.end_driver("SIGKILL", signal.SIGKILL, 60)
                self.start_driver(a.rescale_parallelism)
            if 0 < a.stop_at < 1:
                self.sample_until(a.stop_at * seconds)
                self.until_rounds(a.min_rounds)
                self.end_driver("SIGTERM", signal.SIGTERM, 300)
                self.start_driver(a.parallelism)
            self.sample_until(seconds)
            producer.stop.set()
            producer.join()
            produced_s = time.time() - self.t0
            self.at_stop = soak_report.check(self.out, producer.expected, a.window_s, None)
            drained = lambda: soak_report.owed(self.out, producer.expected) == 0  # noqa: E731
            self.sample_until(produced_s + a.drain_s, drained)
            self.end_driver("SIGTERM", signal.SIGTERM, 300)
        except DriverExited as e:
            self.failure = str(e)
            self.end_driver("its own exit (failed)", signal.SIGKILL, 30)
            producer.stop.set()
            producer.join()
            produced_s = time.time() - self.t0
        finally:
            if self.driver.poll() is None:
                self.end_driver("killed", signal.SIGKILL, 30)
        return soak_report.analyse(
            a, self, producer, produced_s, soak_report.read_rounds(self.rounds)
        )


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _alive(tree: dict) -> list[int]:
    return [pid for pid in tree if os.path.exists(f"/proc/{pid}") and _not_zombie(pid)]


def _not_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=60.0, help="produce for (default: 60)")
    ap.add_argument("--rate", type=float, default=1000.0, help="records/s (default: 1000)")
    ap.add_argument("--partitions", type=int, default=4, help="(default: 4)")
    ap.add_argument("--keys", type=int, default=100, help="distinct keys (default: 100)")
    ap.add_argument("--value-bytes", type=int, default=100, help="(default: 100)")
    ap.add_argument("--window-s", type=int, default=10, help="fixed windows (default: 10)")
    ap.add_argument("--lateness-s", type=int, default=10, help="allowed lateness (default: 10)")
    ap.add_argument(
        "--side-input-kb", type=int, default=0,
        help="a windowed side input of this many KB a second (default: 0, none)",
    )  # fmt: skip
    ap.add_argument("--parallelism", type=int, default=2, help="(default: 2)")
    ap.add_argument(
        "--rescale-parallelism", type=int, default=3,
        help="parallelism after the kill (default: 3)",
    )  # fmt: skip
    ap.add_argument(
        "--kill-at", type=float, default=1 / 3,
        help="SIGKILL the driver at this fraction of the run (default: 1/3; 0: never)",
    )  # fmt: skip
    ap.add_argument(
        "--stop-at", type=float, default=2 / 3,
        help="stop (SIGTERM) and restart at --parallelism at this fraction (default: 2/3; 0: "
        "never)",
    )  # fmt: skip
    ap.add_argument(
        "--min-rounds", type=int, default=3,
        help="a kill or stop waits until the running driver committed this many rounds "
        "(default: 3)",
    )  # fmt: skip
    ap.add_argument("--sample-s", type=float, default=None, help="(default: 10, less if short)")
    ap.add_argument(
        "--drain-s", type=float, default=180.0,
        help="after the producer stops, wait this long at most for the output (default: 180)",
    )  # fmt: skip
    ap.add_argument("--master", default="local[2]", help="(default: local[2])")
    ap.add_argument(
        "--consumer", action="append", default=[], metavar="KEY=VALUE",
        help="a consumer config of the job's ReadFromKafka (repeatable), e.g. to compare "
        "fetch.wait.max.ms=500 with the source's default",
    )  # fmt: skip
    ap.add_argument(
        "--spark-conf", action="append", default=[], metavar="KEY=VALUE",
        help="a Spark setting of the job (repeatable; the runner's --spark_conf)",
    )  # fmt: skip
    ap.add_argument("--result", help="write the result as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the store, output and logs")
    args = ap.parse_args(argv)
    if args.sample_s is None:
        args.sample_s = min(10.0, max(2.0, args.minutes * 60 / 180))
    from tests.servers import start_kafka_broker, stop_process_group

    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    work = Path(tempfile.mkdtemp(prefix="sparkbeam-soak-"))
    broker = start_kafka_broker(work)
    try:
        result = Soak(args, broker, work).run()
    finally:
        stop_process_group(broker.proc)
    print(soak_report.summary(result))
    if args.result:
        Path(args.result).write_text(json.dumps(result, indent=1) + "\n")
    if result["exact"]["ok"] and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"store, output and logs kept in {work}")
    return 0 if result["exact"]["ok"] else 1


def _exit_on_sigterm(signum, _frame) -> None:
    """A SIGTERM to the soak stops it as an error does: its driver and broker stop too (they
    kept running after the soak process was gone)."""
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())

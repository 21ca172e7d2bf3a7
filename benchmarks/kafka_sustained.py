"""Sustained rate: the highest steady produce rate a streaming windowed count keeps up with.

``benchmarks/kafka.py --sustained``. Per system (sparkbeam, then each peer of
``kafka_peers``), a search over produce rates: from ``--sustained-start-rate`` doubling while
the job keeps up, then bisecting between the last rate that kept up and the first that did
not, ``--sustained-steps`` steps in all. A step is a fresh job on a fresh topic:

1. start the job: sparkbeam's ``kafka_peers.window_pipeline`` in ``--streaming`` with default
   flags (this file run as a child; ready once ``run()`` returned), or a peer's windows
   program, unbounded (ready once each process read the probe record put in each partition);
2. a producer thread in this process produces ``rate`` records/s, due every 10 ms (keys
   ``k0..`` in turn, create time = now); it records per (key, 10 s window) what it sent;
3. a watcher thread notes when each ``<key> <window start ms> <count>`` line becomes visible:
   for sparkbeam when a file with it appears in the output folder (its exactly-once sink
   publishes a round's files at the checkpoint commit: the ``latency`` mode's watch); for a
   peer when the line is in its output file, which it appends and flushes as soon as it
   closes a window -- no commit, at-least-once: the most favourable "visible" a peer has;
4. after ``--sustained-warm-s`` of producing, the windows that end in the next
   ``--sustained-s`` are measured; the producer goes on ``--sustained-p99-s`` + 3 s more so
   the last of them can close (a peer closes a window on a later record of its partition).

Latency of a window line = visible - the window's end (its last event's create time: the
event -> visible time of the event that completes the window). The job keeps up if the p99
over the measured lines (a missing line counts as late) is under ``--sustained-p99-s`` and
every count is what was sent. A rate the producer itself cannot hold (over 0.5 s behind
schedule) ends the search: the machine, not the job, is then the limit. The producer, the
watcher and the job share the 2 cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import kafka_peer_jobs
import kafka_peers

WINDOW_MS = kafka_peers.WINDOW_S * 1000


def add_arguments(parser) -> None:
    """``kafka.py``'s options of this mode."""
    parser.add_argument("--sustained", action="store_true", help="the sustained-rate search only")
    parser.add_argument("--sustained-systems", default="sparkbeam,quix,bytewax")
    parser.add_argument("--sustained-s", type=float, default=60.0, help="measured s per step")
    parser.add_argument("--sustained-warm-s", type=float, default=20.0)
    parser.add_argument("--sustained-start-rate", type=int, default=5000)
    parser.add_argument("--sustained-steps", type=int, default=6, help="steps per system")
    parser.add_argument("--sustained-p99-s", type=float, default=2.0)
    parser.add_argument("--sustained-keys", type=int, default=100)
    parser.add_argument(
        "--sustained-max-delay-s", type=float, default=0.0,
        help="sparkbeam's ReadFromKafka max_delay_s (default 0, the default flags; "
        f"{kafka_peer_jobs.STREAM_WAIT_S} waits for records on their way as bytewax does)",
    )  # fmt: skip


class SteadyProducer(threading.Thread):
    """Produce ``rate`` records/s until stopped; ``sent`` counts them per (key, window)."""

    def __init__(self, bootstrap: str, topic: str, rate: int, keys: int) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.rate = bootstrap, topic, rate
        self.keys = [f"k{k}" for k in range(keys)]
        self.sent: Counter = Counter()
        self.started = 0.0
        self.behind_s = 0.0  # the most this thread was behind its schedule
        self.stop = threading.Event()

    def run(self) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": "5"})
        keys, value, i = self.keys, b"x" * 100, 0
        self.started = time.time()
        while not self.stop.is_set():
            now = time.time()
            due, ts = int((now - self.started) * self.rate), int(now * 1000)
            self.behind_s = max(self.behind_s, (due - i) / self.rate)
            window = ts - ts % WINDOW_MS
            while i < due:
                key = keys[i % len(keys)]
                try:
                    producer.produce(self.topic, key=key.encode(), value=value, timestamp=ts)
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.05)
                    continue
                self.sent[key, window] += 1
                i += 1
            producer.poll(0)
            time.sleep(max(0.0, self.started + (i + self.rate / 100) / self.rate - time.time()))
        producer.flush(30)


class Watcher(threading.Thread):
    """Note when each window line appears in the files of ``folder`` matching ``pattern``
    (whole files renamed into place, or files appended to: read from where it left off)."""

    def __init__(self, folder: str, pattern: str) -> None:
        super().__init__(daemon=True)
        self.folder, self.pattern = Path(folder), pattern
        self.seen: dict[tuple[str, int], float] = {}
        self.counts: Counter = Counter()
        self.stop = threading.Event()

    def run(self) -> None:
        offsets: dict[Path, int] = {}
        while not self.stop.is_set():
            for path in self.folder.glob(self.pattern):
                size = path.stat().st_size
                if size <= offsets.get(path, 0):
                    continue
                with open(path) as f:
                    f.seek(offsets.get(path, 0))
                    text = f.read()
                whole = text[: text.rfind("\n") + 1]
                offsets[path] = offsets.get(path, 0) + len(whole.encode())
                now = time.time()
                for line in whole.split("\n"):
                    if line:
                        key, start, count = line.split()
                        self.seen.setdefault((key, int(start)), now)
                        self.counts[key, int(start)] += int(count)
            time.sleep(0.01)


def start_job(system: str, bootstrap: str, topic: str, tmp: str, args) -> tuple[list, str]:
    """Start ``system``'s streaming window count; wait until it is ready. (processes, the
    output glob under ``tmp``)."""
    if system == "sparkbeam":
        cmd = [sys.executable, __file__, "--bootstrap", bootstrap, "--topic", topic, "--tmp", tmp,
               "--max-delay-s", str(args.sustained_max_delay_s)]  # fmt: skip
        procs = [subprocess.Popen(cmd, cwd=kafka_peers.REPO, start_new_session=True)]
        ready, pattern = [Path(tmp, "ready")], "out/out-*"
    else:
        python = kafka_peers.peers_python()
        procs = kafka_peers.start_peer(
            python, system, "windows", bootstrap, topic, tmp, args.peer_processes, bounded=False
        )
        from confluent_kafka import Producer

        probe = Producer({"bootstrap.servers": bootstrap})
        for partition in range(args.partitions):
            probe.produce(topic, key=b"probe", value=b"", partition=partition)
        probe.flush(10)
        ready = [Path(tmp, f"ready-{i}") for i in range(args.peer_processes)]
        pattern = "windows-*.txt"
    deadline = time.monotonic() + 300
    while not all(r.exists() for r in ready):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise RuntimeError(f"{system}'s streaming job did not start; see its log in {tmp}")
        time.sleep(0.1)
    return procs, pattern


def stop_job(system: str, procs: list, tmp: str) -> None:
    if system == "sparkbeam":
        Path(tmp, "stop").touch()  # a clean cancel: its Python workers go too
        try:
            procs[0].wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
    kafka_peers.stop_peer(procs)


def step(system: str, broker, rate: int, args) -> dict:
    """One rate on a fresh job and topic: ``{p50, p99, lines, missing, wrong, behind_s, ok}``."""
    topic = f"sustained-{system}-{rate}-{time.time_ns()}"
    broker.create_topic(topic, args.partitions, {"retention.ms": "-1"})  # for Quix
    with tempfile.TemporaryDirectory() as tmp:
        procs, pattern = start_job(system, broker.bootstrap, topic, tmp, args)
        producer = SteadyProducer(broker.bootstrap, topic, rate, args.sustained_keys)
        watcher = Watcher(tmp, pattern)
        try:
            watcher.start()
            producer.start()
            time.sleep(args.sustained_warm_s)
            begin = time.time()
            time.sleep(args.sustained_s + args.sustained_p99_s + 3)
        finally:
            producer.stop.set()
            producer.join()
            watcher.stop.set()
            watcher.join()
            stop_job(system, procs, tmp)
    measured = [
        w for w in producer.sent if begin < (w[1] + WINDOW_MS) / 1000 <= begin + args.sustained_s
    ]
    lags = sorted(watcher.seen.get(w, float("inf")) - (w[1] + WINDOW_MS) / 1000 for w in measured)
    p50, p99 = (
        lags[min(len(lags) - 1, int(q * len(lags)))] if lags else float("inf") for q in (0.5, 0.99)
    )
    missing = sum(1 for w in measured if w not in watcher.seen)
    wrong = sum(1 for w in measured if w in watcher.seen and watcher.counts[w] != producer.sent[w])
    return {
        "p50": p50, "p99": p99, "lines": len(measured), "missing": missing, "wrong": wrong,
        "behind_s": producer.behind_s, "ok": p99 < args.sustained_p99_s and wrong == 0,
    }  # fmt: skip


def search(system: str, broker, args) -> int:
    """The highest rate that kept up (0 if none); a line per step."""
    rate, good, bad = args.sustained_start_rate, 0, 0
    for _ in range(args.sustained_steps):
        got = step(system, broker, rate, args)
        held = got["behind_s"] <= 0.5
        print(
            f"  {system} at {rate:,} records/s: window end -> visible "
            f"p50 {got['p50']:.3f} s, p99 {got['p99']:.3f} s "
            f"over {got['lines']} lines ({got['missing']} missing, {got['wrong']} wrong counts): "
            f"{'keeps up' if got['ok'] else 'falls behind'}"
            + ("" if held else f" (the producer fell {got['behind_s']:.1f} s behind: stop)")
        )
        if not held:
            break
        if got["ok"]:
            good = rate
        else:
            bad = rate
        rate = (good + bad) // 2 if bad else 2 * rate
        if not good and bad:
            rate = bad // 2
        if good and bad and bad - good <= max(1, bad // 20):
            break
    return good


def sustained(broker, args) -> None:
    """The search on each system of ``--sustained-systems``; ratios of sparkbeam's rate."""
    systems = [s.strip() for s in args.sustained_systems.split(",") if s.strip()]
    peers = [s for s in systems if s != "sparkbeam"]
    if peers and kafka_peers.peers_python() is None:
        systems = [s for s in systems if s == "sparkbeam"]
    print(
        f"sustained rate: {args.sustained_steps} steps per system from "
        f"{args.sustained_start_rate:,} records/s, {args.sustained_warm_s:.0f} s warm + "
        f"{args.sustained_s:.0f} s measured per step, keeps up = window end -> visible p99 "
        f"< {args.sustained_p99_s} s and exact counts, {args.sustained_keys} keys, "
        f"{args.partitions} partitions"
    )
    rates = {}
    for system in systems:
        rates[system] = search(system, broker, args)
        print(f"{system}: sustained rate {rates[system]:,} records/s")
    for peer in peers:
        if rates.get("sparkbeam") and rates.get(peer):
            print(f"  sparkbeam / {peer} sustained: {rates['sparkbeam'] / rates[peer]:.2f}x")


def sparkbeam_child(bootstrap: str, topic: str, tmp: str, max_delay_s: float) -> None:
    """sparkbeam's streaming window count (default flags); ``<tmp>/ready`` once running,
    cancelled once ``<tmp>/stop`` exists."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    flags = ["--runner=SparkCheckpointRunner", "--streaming", f"--checkpoint_dir={tmp}/ckpt"]
    p = beam.Pipeline(options=PipelineOptions(flags))
    config = {"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}
    kafka_peers.window_pipeline(p, config, topic, f"{tmp}/out", None, max_delay_s)
    result = p.run()
    Path(tmp, "ready").touch()
    while not os.path.exists(f"{tmp}/stop"):
        time.sleep(0.1)
    result.cancel()


if __name__ == "__main__":
    import argparse

    sys.path.insert(0, str(kafka_peers.REPO))
    ap = argparse.ArgumentParser(description="sparkbeam's job of the sustained-rate search")
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--max-delay-s", type=float, required=True)
    child = ap.parse_args()
    sparkbeam_child(child.bootstrap, child.topic, child.tmp, child.max_delay_s)

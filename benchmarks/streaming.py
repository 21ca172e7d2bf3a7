"""Benchmark: a 1e5-key windowed GroupByKey/count in sparkbeam ``--streaming`` mode.

The job (the same in every run): ``--shards`` elements go into ``KeyedSource``, an
offset-style splittable DoFn. Each call emits the records that are due by now (record
``i`` of a shard is due ``i / rate_per_shard`` s after the job's first call; at most
``--per_call`` per call), each as ``(key, t)`` with event time ``t`` = the wall time of
its emission and ``key`` cycling over ``--keys`` keys, sets its watermark to now and
defers the rest by ``--delay_s``. Then ``FixedWindows(--window_s)`` -> GroupByKey ->
one line per (key, window): ``key window_start count min_t sum_t`` ->
``sparkbeam.io.WriteToFilesOnCheckpoint`` (``--grouping state``: the same lines from a
stateful DoFn instead -- three combining states and an event-time timer at the window's end).
In ``--streaming`` the GroupByKey's state (per key: buffered values and trigger state; or the
DoFn's user state and timers) lives in the checkpoint store, and a round's files become
visible only after the round's checkpoint commits.

Two workloads, each in a fresh subprocess of this Python (``--child ...``; the jobs are in
``streaming_jobs.py``, this module runs, checks and prints them):

(a) ``latency``: ``--records`` records at ``--rate`` records/s, ``--streaming`` with
    ``--checkpoint_interval_s=--interval_s``. This parent polls the output directory every
    ``--poll_s`` s and notes when each file appears (a file's mtime is not used: the sink
    renames a staged file written before the commit, so its mtime is too early). Per
    output line: ``window end -> visible`` and ``oldest event -> visible`` (visible -
    ``min_t``); mean ``event -> visible`` over all records (from ``sum_t``). Windows that end
    after the source's last call are left out (they fire early, when the source ends).
    Checkpoint duration per round: ``RoundLoop.round_times`` (the round's Spark job,
    which includes the tasks staging their state changes and files, then the driver's
    commit: manifest, state, sink-file renames). The baseline, ``spark-streaming``: the same
    windowed count in Spark's own Structured Streaming, a stateful micro-batch per
    ``--interval_s`` over ``--rate`` rows/s of Spark's ``rate`` source (key ``value %
    keys``, event time = the row's timestamp), ``--shards`` shuffle partitions, the RocksDB
    state store with changelog checkpointing (``--spark_store``), a zero-delay watermark,
    append mode into Spark's exactly-once text sink: its "round" is a batch with input
    (Spark job = ``addBatch``, commit = the rest of ``triggerExecution``: offsets, planning,
    write-ahead and commit logs). The systems run ``--repeat`` times, interleaved; each
    system's table is its median run, and the ratio is of the medians.
(b) ``throughput``: the same records, all due at once (a backlog; each call emits at most
    ``--per_call``, so a streaming round takes ``shards * per_call`` records), run as
      * ``streaming``       -- ``--streaming``, every round a checkpoint;
      * ``sparkbeam-batch`` -- the same pipeline without ``--streaming`` (the SDF re-feeds
                               its residuals inside its task, one GroupByKey at the end);
      * ``direct``          -- ``--runner=DirectRunner`` (Beam's FnApiRunner).
    "Checkpoints off" is no streaming mode (every round is a checkpoint), so the batch runs
    are the baseline. Rate = records / (first source call -> pipeline finished), which
    excludes Python/JVM start-up but includes writing the output. ``overhead`` = streaming
    time / batch time - 1; ``per round`` = (streaming time - batch time) / rounds.

Every run's output is checked: each (key, window) exactly once, counts summing to
``--records`` (a mismatch exits 1 after the tables). Print the load average with the
numbers: on a shared machine they move with it.

    python benchmarks/streaming.py                       # defaults: a few minutes
    python benchmarks/streaming.py --quick               # smoke run
    python benchmarks/streaming.py --workloads latency --repeat 5   # median of 5 runs
    python benchmarks/streaming.py --keys 100000 --records 1000000 --rate 20000
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

from streaming_jobs import STATE_STORES, run_child

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYSTEMS = ("streaming", "sparkbeam-batch", "direct")
LATENCY_SYSTEMS = ("streaming", "spark-streaming")


# --------------------------------------------------------------------------- parent


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def _run_child(
    workload: str, system: str, args: argparse.Namespace, tmp: str, run: int = 0
) -> dict:
    tag = f"{workload}-{system}-{run}"
    paths = {k: os.path.join(tmp, f"{tag}.{k}") for k in ("call_log", "result", "out", "ckpt")}
    os.makedirs(paths["out"])
    rate = args.rate if workload == "latency" else 0.0
    cmd = [sys.executable, os.path.abspath(__file__), "--child", workload, "--child_system",
           system, "--rate", str(rate), "--master", args.master]  # fmt: skip
    for flag in ("keys", "records", "shards", "per_call", "delay_s", "window_s", "interval_s",
                 "grouping", "spark_store"):  # fmt: skip
        cmd += [f"--{flag}", str(getattr(args, flag))]
    for k, v in paths.items():
        cmd += [f"--{k}", v]
    env = {**os.environ, "PYTHONPATH": REPO, "PYSPARK_PYTHON": sys.executable}
    seen: dict[str, float] = {}
    stop = threading.Event()

    def poll() -> None:  # when each output file became visible
        while not stop.is_set():
            now = time.time()
            for name in os.listdir(paths["out"]):
                if name.startswith("part-"):
                    seen.setdefault(name, now)
            stop.wait(args.poll_s)

    load = os.getloadavg()[0]
    start = time.time()
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    stop.set()
    poller.join()
    poll()  # files finalized at the very end
    row = {"workload": workload, "system": system, "wall": time.time() - start, "load": load}
    if proc.returncode != 0:
        print(f"[{tag}] FAILED (exit {proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
        return {**row, "failed": True}
    with open(paths["result"]) as f:
        res = json.load(f)
    with open(paths["call_log"]) as f:
        calls = [tuple(map(float, line.split())) for line in f.read().splitlines()]
    first_call, last_call = min(c[0] for c in calls), max(c[1] for c in calls)
    row.update(
        phase_s=res["run_end"] - first_call,
        calls=len(calls),
        rounds=len(res["rounds"]),
        round_times=res["rounds"],
        **_check_output(paths["out"], seen, args, last_call),
    )
    row["records_per_s"] = args.records / row["phase_s"]
    return row


def _check_output(out: str, seen: dict[str, float], args, last_call: float) -> dict:
    """Exactly-once check and per-line latencies of the files in ``out``."""
    pairs: set[tuple[str, int]] = set()
    dupes = total = 0
    window_lat, oldest_lat = [], []
    event_sum = event_n = 0.0
    for path in glob.glob(os.path.join(out, "part-*")):
        visible = seen[os.path.basename(path)]
        with open(path) as f:
            for line in f:
                key, start, count, min_t, sum_t = line.split()
                start, count = int(start), int(count)
                dupes += (key, start) in pairs
                pairs.add((key, start))
                total += count
                end = start + args.window_s
                if end <= last_call:  # closed by the watermark, not by the end of the input
                    window_lat.append(visible - end)
                    oldest_lat.append(visible - float(min_t))
                    event_sum += visible * count - float(sum_t)
                    event_n += count
    return {
        "ok": dupes == 0 and total == args.records,
        "check": f"{len(pairs)} (key, window) lines, {dupes} duplicated, {total} records",
        "window_lat": window_lat,
        "oldest_lat": oldest_lat,
        "event_mean": event_sum / event_n if event_n else float("nan"),
    }


def _print_latency(r: dict, args) -> None:
    print(
        f"\n(a) latency, {r['system']}: {args.records:,} records at {args.rate:,.0f}/s over "
        f"{args.keys:,} keys, "
        f"{args.window_s:g} s windows, --checkpoint_interval_s={args.interval_s:g}, "
        f"load {r['load']:.2f}"
    )
    if r.get("failed"):
        print("  FAILED")
        return
    job = [x["job_s"] for x in r["round_times"]]
    commit = [x["commit_s"] for x in r["round_times"]]
    total = [a + b for a, b in zip(job, commit)]
    starts = [x["started"] for x in r["round_times"]]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    head = f"{'metric':<40}{'p50':>9}{'p99':>9}{'max':>9}{'n':>9}"
    print(head)
    print("-" * len(head))
    for name, xs in (
        ("window end -> visible (s)", r["window_lat"]),
        ("oldest event in line -> visible (s)", r["oldest_lat"]),
        ("round: Spark job (s)", job),
        ("round: checkpoint commit (s)", commit),
        ("round: job + commit (s)", total),
        ("round start -> next round start (s)", gaps),
    ):
        print(f"{name:<40}{_pct(xs, 0.5):>9.3f}{_pct(xs, 0.99):>9.3f}"
              f"{max(xs, default=float('nan')):>9.3f}{len(xs):>9}")  # fmt: skip
    print(f"mean event -> visible over all records: {r['event_mean']:.3f} s; {r['check']}")


def _latency(args, tmp: str) -> list[dict]:
    """Every latency system ``--repeat`` times, interleaved (a change in the machine's speed
    hits all of them); each system's median run, then the ratio of the medians."""
    systems = args.latency_systems.split(",")
    runs: dict[str, list[dict]] = {s: [] for s in systems}
    for run in range(args.repeat):
        for system in systems:
            print(f"running latency on {system} ...", flush=True)
            runs[system].append(_run_child("latency", system, args, tmp, run))
    medians = {s: _print_latency_runs(rs, args) for s, rs in runs.items()}
    base = medians.get("spark-streaming")
    if base and medians.get("streaming"):
        print(
            f"\nround (job + commit) p50, median of runs: sparkbeam {medians['streaming']:.3f} s, "
            f"Spark Structured Streaming {base:.3f} s: {medians['streaming'] / base:.2f}x"
        )
    return [r for rs in runs.values() for r in rs]


def _round_p50(r: dict) -> float:
    return _pct([x["job_s"] + x["commit_s"] for x in r["round_times"]], 0.5)


def _print_latency_runs(runs: list[dict], args) -> float | None:
    """The table of the median run (by round p50), then every run's round p50 (a run's p50
    moves by ~0.05 s with the machine: compare medians of runs); returns the median."""
    ok = [r for r in runs if not r.get("failed")]
    if not ok:
        _print_latency(runs[0], args)
        return None
    by_p50 = sorted(ok, key=_round_p50)
    _print_latency(by_p50[len(by_p50) // 2], args)
    if len(runs) == 1:
        return _round_p50(ok[0])
    print(
        f"round (job + commit) p50 of {len(runs)} runs: "
        + " ".join(f"{_round_p50(r):.3f}" for r in ok)
        + f"; median {_round_p50(by_p50[len(by_p50) // 2]):.3f} s"
        + (f"; {len(runs) - len(ok)} FAILED" if len(ok) < len(runs) else "")
    )
    return _round_p50(by_p50[len(by_p50) // 2])


def _print_throughput(rows: list[dict], args) -> None:
    print(
        f"\n(b) throughput: {args.records:,} records (backlog) over {args.keys:,} keys, "
        f"{args.window_s:g} s windows, at most {args.shards} x {args.per_call:,} per round"
    )
    head = (f"{'system':<17}{'load':>6}{'wall s':>8}{'phase s':>9}{'records/s':>11}{'rounds':>7}"
            f"{'vs batch':>9}{'s/round':>9}  check")  # fmt: skip
    print(head)
    print("-" * len(head))
    base = next((r for r in rows if r["system"] == "sparkbeam-batch" and not r.get("failed")), None)
    for r in rows:
        if r.get("failed"):
            print(f"{r['system']:<17}{r['load']:>6.2f}  FAILED")
            continue
        ratio = per_round = ""
        if base:
            ratio = f"{r['phase_s'] / base['phase_s']:.2f}x"
            if r["rounds"]:
                per_round = f"{(r['phase_s'] - base['phase_s']) / r['rounds']:.3f}"
        print(f"{r['system']:<17}{r['load']:>6.2f}{r['wall']:>8.1f}{r['phase_s']:>9.2f}"
              f"{r['records_per_s']:>11,.0f}{r['rounds']:>7}{ratio:>9}{per_round:>9}  "
              f"{r['check']}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--workloads", default="latency,throughput", help="Default: %(default)s")
    add("--systems", default=",".join(SYSTEMS), help="Throughput systems. Default: %(default)s")
    add("--latency_systems", default=",".join(LATENCY_SYSTEMS),
        help="Latency systems: sparkbeam --streaming, Spark's own Structured Streaming. "
             "Default: %(default)s")  # fmt: skip
    add("--keys", type=int, default=100_000, help="Default: %(default)s")
    add("--records", type=int, default=200_000, help="Default: %(default)s")
    add("--rate", type=float, default=10_000, help="Latency run, records/s. Default: %(default)s")
    add("--interval_s", type=float, default=1.0, help="Checkpoint interval. Default: %(default)s")
    add("--window_s", type=int, default=5, help="Fixed window size. Default: %(default)s")
    add("--shards", type=int, default=2, help="Source elements = parallelism. Default: %(default)s")
    add("--per_call", type=int, default=25_000, help="Max records per call. Default: %(default)s")
    add("--delay_s", type=float, default=0.1, help="defer_remainder delay. Default: %(default)s")
    add("--poll_s", type=float, default=0.02, help="Output poll interval. Default: %(default)s")
    add("--master", default="local[2]", help="Default: %(default)s")
    add("--grouping", choices=("gbk", "state"), default="gbk",
        help="Per (key, window): a GroupByKey, or a stateful DoFn with an event-time timer "
             "(user state and timers in the checkpoint store). Default: %(default)s")  # fmt: skip
    add("--spark_store", choices=sorted(STATE_STORES), default="rocksdb",
        help="spark-streaming's state store (rocksdb: with changelog checkpointing). "
             "Default: %(default)s")  # fmt: skip
    add("--repeat", type=int, default=1,
        help="Latency runs (each a fresh process); the table shows the median run. "
             "Default: %(default)s")  # fmt: skip
    add("--quick", action="store_true", help="Smoke run: 2,000 keys, 20,000 records.")
    add("--json", default=None, help="Also write all rows to this file.")
    for internal in ("child", "child_system", "call_log", "result", "out", "ckpt"):
        add(f"--{internal}", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        run_child(args)
        return 0
    if args.quick:
        args.keys, args.records, args.rate, args.per_call = 2_000, 20_000, 5_000, 5_000

    print(f"load average before: {os.getloadavg()}, cores: {os.cpu_count()}", flush=True)
    rows, ok = [], True
    with tempfile.TemporaryDirectory(prefix="sparkbeam-bench-streaming-") as tmp:
        for workload in args.workloads.split(","):
            if workload == "latency":
                rows += _latency(args, tmp)
                continue
            done = []
            for system in args.systems.split(","):
                print(f"running {workload} on {system} ...", flush=True)
                done.append(_run_child(workload, system, args, tmp))
            _print_throughput(done, args)
            rows += done
    for r in rows:
        if r.get("failed") or not r["ok"]:
            print(f"  MISMATCH or FAILURE: {r['workload']} {r['system']}: {r.get('check')}")
            ok = False
    print(f"\nload average after: {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

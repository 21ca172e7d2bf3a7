"""Benchmark: keyed state larger than a worker's memory budget (issue 30, item 3).

A real ``--streaming`` job with a checkpoint store, one child process per setting: ``--keys``
keys, each holding ``--value_kb`` of user state (``ReadModifyWriteState``), every key updated
twice over 8 rounds. Run once with a budget larger than the state (``--task_state_memory_mb``
4096: each worker holds its key-group range as a dict) and once with a budget below it (the
range spills to a RocksDB in the executor's local directory). Reported: wall time, the largest
peak resident memory of the Python workers (``VmHWM`` of every worker process: sparkbeam's
zygote and its forks; the JVM is apart), state per task, and exactness (every key's second
count seen once).

    python benchmarks/state_spill.py --keys 3e4 --value_kb 10 --budgets 4096,32
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _harness  # noqa: E402

# PySpark's worker daemon, and sparkbeam's (its zygote forks the workers)
_WORKER_COMMANDS = (
    b"pyspark.daemon",
    b"sparkbeam.runner.spark.zygote",
    b"sparkbeam.runner.spark.daemon",
)


class _WorkersPeak:
    """Samples the PySpark workers' peaks while the job runs (they end with its session)."""

    def __init__(self) -> None:
        import threading

        self.mb, self._stop = 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.mb = max(self.mb, _workers_peak_mb())

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.mb


def _workers_peak_mb() -> float:
    """The largest peak resident memory of this machine's PySpark worker processes, MB."""
    peak = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read()
            if not any(w in command for w in _WORKER_COMMANDS):
                continue
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]))
        except OSError:
            continue
    return peak / 1024


def child(args: argparse.Namespace) -> None:
    """One run; one JSON line."""
    import apache_beam as beam
    from apache_beam.coders import BytesCoder
    from apache_beam.metrics import Metrics
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.transforms import userstate

    from tests.streaming.streaming_pipelines import EventTimeOffsets

    keys, pad = args.keys, args.value_kb * 1024

    class PaddedCount(beam.DoFn):
        STATE = userstate.ReadModifyWriteStateSpec("padded", BytesCoder())

        def __init__(self):
            self.second = Metrics.counter("state_spill", "second")

        def process(self, kv, state=beam.DoFn.StateParam(STATE)):
            blob = state.read()
            count = (int(blob[:8]) if blob else 0) + 1
            state.write(b"%08d" % count + bytes(pad))
            if count == 2:
                self.second.inc()

    options = PipelineOptions(
        [
            "--runner=SparkCheckpointRunner",
            "--streaming",
            f"--checkpoint_dir={args.store}",
            f"--parallelism={args.parallelism}",
            f"--task_state_memory_mb={args.budget}",
            "--spark_master_url=local[2]",
        ]
    )
    peak = _WorkersPeak()
    t0 = time.perf_counter()
    p = beam.Pipeline(options=options)
    _ = (
        p
        | beam.Create([("a", 2 * keys)])
        | beam.ParDo(EventTimeOffsets(per_round=keys // 4, delay_s=0.05))
        | beam.Map(lambda kv: (kv[1] % keys, kv[1]))
        | beam.ParDo(PaddedCount())
    )
    result = p.run()
    result.wait_until_finish()
    wall = time.perf_counter() - t0
    counters = result.metrics().query()["counters"]
    second = sum(c.committed or c.attempted or 0 for c in counters if c.key.metric.name == "second")
    print(json.dumps({"wall": wall, "workers_peak_mb": peak.stop(), "second": second}))


def run_budgets(args: argparse.Namespace) -> int:
    _harness.become_subreaper()
    rows = []
    per_task_mb = args.keys * (args.value_kb * 1024 + 8) / args.parallelism / 2**20
    for budget in [int(b) for b in args.budgets.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            log = os.path.join(tmp, "child.log")
            cmd = [
                sys.executable, __file__, "--child", "--budget", str(budget),
                "--store", os.path.join(tmp, "ckpt"), "--parallelism", str(args.parallelism),
                "--keys", str(args.keys), "--value_kb", str(args.value_kb),
            ]  # fmt: skip
            got, problem = _harness.json_child(cmd, log, args.timeout)
        if got is None:
            print(f"budget {budget} MB: failed: {problem}")
            return 1
        exact = got["second"] == args.keys
        rows.append(
            (
                f"{budget}",
                "spilled" if per_task_mb > budget else "memory",
                f"{per_task_mb:.0f}",
                f"{got['wall']:.1f}",
                f"{got['workers_peak_mb']:.0f}",
                "yes" if exact else f"no ({got['second']} of {args.keys})",
            )
        )
    head = ("budget MB", "held in", "state/task MB", "wall s", "worker peak MB", "exact")
    print(_harness.format_table(head, rows))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=lambda v: int(float(v)), default=30_000)
    ap.add_argument("--value_kb", type=int, default=10, help="state per key (default: 10)")
    ap.add_argument("--budgets", default="4096,32", help="--task_state_memory_mb values")
    ap.add_argument("--parallelism", type=int, default=2, help="job parallelism (default: 2)")
    ap.add_argument("--timeout", type=float, default=1800, help="per child, s (default: 1800)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--budget", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return 0
    return run_budgets(args)


if __name__ == "__main__":
    sys.exit(main())

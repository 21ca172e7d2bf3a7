"""Benchmark: does the driver stay flat while the keyed state grows? (task-owned state)

Two parts, both printed as tables with ratios measured in the same run:

* ``--keys 1e5,1e6``: a real ``--streaming`` job with a checkpoint store, in a child process
  per size: N keys, each given one 100-byte ``ReadModifyWriteState`` value by a stateful DoFn,
  then ``--update_rounds`` rounds that each update ``--per_round`` of those keys (a steady
  stream over a large state). Reported: wall time, the driver's peak resident memory (the
  Python driver process; Spark's JVM is apart), the update rounds' p50 and p99 (commit to
  commit, rounds back to back) and the driver's CPU per update round, the store's bytes
  after the run (all of it, and the last checkpoint's files alone) against the live values'
  bytes, and the ratio of each to the smallest size's. Exactness: the job counts the values
  it wrote.
* ``--simulate``: the real commit code (``PipelineStore.checkpoint`` over a memory store)
  driven by commit messages of tasks that exist only as handles: ``--executors`` tasks a
  round, each naming one staged segment of its key-group range and, when its range is due
  (`task_state.NamespaceState.snapshot_due`), a snapshot of it. Reported: the driver's commit
  time per round (p50/p99), its memory (tracemalloc peak), and the manifest's size. The
  files do not exist: the driver must never open them.

    python benchmarks/state_scale.py --keys 1e5,1e6
    python benchmarks/state_scale.py --simulate --executors 100 --key_groups 10000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _harness  # noqa: E402

VALUE_BYTES = 100


# -- the real job (child process) -------------------------------------------------------------
def child(args: argparse.Namespace) -> None:
    """One ``--streaming`` run over ``args.n`` keys; prints one JSON line of measurements."""
    import resource

    import apache_beam as beam
    from apache_beam.metrics import Metrics
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.transforms.userstate import ReadModifyWriteStateSpec

    from tests.streaming.streaming_pipelines import EventTimeOffsets

    n, shards = args.n, args.shards
    rounds = _RoundTimes()

    class Keys(beam.DoFn):
        def process(self, shard):
            for i in range(shard, n, shards):
                yield (f"key-{i:09d}", i)

    class Remember(beam.DoFn):
        VALUE = ReadModifyWriteStateSpec("value", beam.coders.BytesCoder())

        def __init__(self):
            self.written = Metrics.counter("state_scale", "written")

        def process(self, kv, value=beam.DoFn.StateParam(VALUE)):
            key, i = kv
            value.write(_value(i))
            self.written.inc()

    options = PipelineOptions(
        [
            "--runner=SparkCheckpointRunner",
            "--streaming",
            f"--checkpoint_dir={args.store}",
            f"--parallelism={args.parallelism}",
            "--spark_master_url=local[2]",
            "--checkpoint_interval_s=0.01",  # rounds back to back: commit to commit is a round
        ]
    )
    per_round, updates = args.per_round, args.per_round * args.update_rounds
    t0 = time.perf_counter()
    p = beam.Pipeline(options=options)
    loaded = p | beam.Create(list(range(shards))) | beam.ParDo(Keys())
    updated = (
        p
        | "Updates" >> beam.Create([("u", updates)])
        | beam.ParDo(EventTimeOffsets(per_round=per_round, delay_s=0.0))
        | beam.Map(lambda kv: (f"key-{kv[1] * 7919 % n:09d}", kv[1]))
    )
    _ = (loaded, updated) | beam.Flatten() | beam.ParDo(Remember())
    result = p.run()
    result.wait_until_finish()
    wall = time.perf_counter() - t0
    written = result.metrics().query()["counters"]
    count = sum(c.committed or c.attempted or 0 for c in written if c.key.metric.name == "written")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    got = {"n": n, "wall": wall, "driver_peak_mb": peak_mb, "written": count - updates}
    print(json.dumps({**got, **rounds.summary(skip=3)}))


class _RoundTimes(logging.Handler):
    """The wall and driver CPU time of each round, commit to commit (sparkbeam's progress log
    names every commit at DEBUG)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.marks: list[tuple[float, float]] = []
        progress = logging.getLogger("sparkbeam.progress")
        progress.setLevel(logging.DEBUG)
        progress.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        if " committed (checkpoint " in record.getMessage():
            self.marks.append((time.perf_counter(), time.process_time()))

    def summary(self, skip: int) -> dict:
        """p50/p99 of the rounds after the first ``skip`` (loading the keys), and driver CPU."""
        marks = self.marks[skip:]
        walls = sorted(b[0] - a[0] for a, b in zip(marks, marks[1:]))
        cpus = sorted(b[1] - a[1] for a, b in zip(marks, marks[1:]))
        if not walls:
            return {"round_p50": float("nan"), "round_p99": float("nan"), "cpu_p50": float("nan")}
        p99 = walls[min(len(walls) - 1, int(0.99 * (len(walls) - 1) + 0.5))]
        return {"round_p50": statistics.median(walls), "round_p99": p99,
                "cpu_p50": statistics.median(cpus), "rounds": len(walls)}  # fmt: skip


def _value(i: int) -> bytes:
    """VALUE_BYTES of incompressible bytes (a compressed store then shows its true overhead)."""
    digest = hashlib.blake2b(b"%d" % i, digest_size=64).digest()
    return (digest + hashlib.blake2b(digest, digest_size=64).digest())[:VALUE_BYTES]


def _tree_bytes(root: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(root) for f in files)


def _last_checkpoint_bytes(root: str) -> int:
    """Bytes of the files the store's last checkpoint names (what a restore needs)."""
    from sparkbeam.checkpoint import open_store

    with open_store(root, read_only=True) as store:
        (pipeline,) = store.list_pipelines()
        last = store.list_checkpoints(pipeline)[-1].checkpoint_id
        manifest = store.load_manifest(pipeline, last)
    files = list(manifest.materialization) + list(manifest.changelog)
    if manifest.task_state is not None:
        for state in manifest.task_state.namespaces.values():
            files += list(state.files())
    return sum(f.size for f in {f.name: f for f in files}.values())


def run_sizes(args: argparse.Namespace) -> int:
    _harness.become_subreaper()
    rows, base = [], None
    for n in [int(float(k)) for k in args.keys.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            store = os.path.join(tmp, "ckpt")
            log = os.path.join(tmp, "child.log")
            cmd = [
                sys.executable, __file__, "--child", "--n", str(n), "--store", store,
                "--parallelism", str(args.parallelism), "--shards", str(args.shards),
                "--per_round", str(args.per_round), "--update_rounds", str(args.update_rounds),
            ]  # fmt: skip
            got, problem = _harness.json_child(cmd, log, args.timeout)
            if got is None:
                print(f"N={n}: failed: {problem}")
                return 1
            store_bytes, last_bytes = _tree_bytes(store), _last_checkpoint_bytes(store)
        live = n * VALUE_BYTES
        base = base or got
        rows.append(
            (
                f"{n:.0e}",
                f"{got['wall']:.1f}",
                f"{got['driver_peak_mb']:.0f}",
                f"{got['driver_peak_mb'] - base['driver_peak_mb']:+.0f}",
                f"{got['round_p50'] * 1000:.0f} ({got['round_p50'] / base['round_p50']:.2f}x)",
                f"{got['round_p99'] * 1000:.0f} ({got['round_p99'] / got['round_p50']:.2f}x p50)",
                f"{got['cpu_p50'] * 1000:.0f} ({got['cpu_p50'] / base['cpu_p50']:.2f}x)",
                f"{store_bytes / 1e6:.1f}",
                f"{store_bytes / live:.2f}",
                f"{last_bytes / live:.2f}",
                "yes" if got["written"] == n else f"no ({got['written']})",
            )
        )
    head = (
        "keys", "wall s", "driver peak MB", "vs first", "round p50 ms", "round p99 ms",
        "driver CPU/round ms", "store MB", "store/live", "last checkpoint/live", "exact",
    )  # fmt: skip
    print(_harness.format_table(head, rows))
    return 0


# -- the simulation -------------------------------------------------------------------------------
def _rounds(args: argparse.Namespace, trace: bool) -> tuple:
    """The simulated rounds: (commit times, CPU times, manifest sizes, snapshots, peak bytes);
    ``trace``: the peak under tracemalloc, which slows every allocation (its pass is untimed)."""
    from sparkbeam.checkpoint import open_store, state_layout
    from sparkbeam.checkpoint.ids import FileEntry
    from sparkbeam.checkpoint.keygroups import key_group_range
    from sparkbeam.checkpoint.manifest import encode_manifest
    from sparkbeam.checkpoint.staging import CommitMessage
    from sparkbeam.checkpoint.task_state import TaskSnapshot

    ns = state_layout.user_state("stage")
    p, m = args.executors, args.key_groups
    segment = int(args.changes_per_s * args.round_s * args.value_bytes / p)
    base = int(args.keys * args.value_bytes / p)
    store = open_store(f"memory://state-scale-{os.getpid()}-{int(trace)}", max_key_groups=m)
    st = store.pipeline("p")
    times, cpu, sizes, snapshots = [], [], [], 0
    if trace:
        tracemalloc.start()
    cid = None
    for rnd in range(args.rounds):
        chains = st.chain.task_state.namespaces.get(ns)
        messages = []
        for sub in range(p):
            g = key_group_range(sub, p, m)
            prefix = f"staged/stage/r{rnd:08d}/p{sub:05d}-a000-"
            seg = FileEntry(f"{prefix}seg-1.seg", segment, "crc32:00000000", 1, g.start, g.stop)
            snaps: tuple = ()
            if chains is not None and chains.snapshot_due(g):
                snap = FileEntry(f"{prefix}snap.arrow", base, "crc32:00000000", 1, g.start, g.stop)
                snaps = (TaskSnapshot(ns, g.start, g.stop, (snap,), args.keys // p),)
                snapshots += 1
            messages.append(
                CommitMessage(
                    st.pipeline_id, "stage", rnd, sub, 0, (seg,), max_key_groups=m,
                    namespaces=frozenset({ns}), snapshots=snaps,
                    counts=((ns, g.start, g.stop, args.keys // p),),
                )
            )  # fmt: skip
        t0, c0 = time.perf_counter(), time.process_time()
        cid = st.checkpoint(fingerprint="f", parallelism=p, commit_messages=messages)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        sizes.append(len(encode_manifest(store.load_manifest("p", cid))))
    peak = 0
    if trace:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    store.close()
    return times, cpu, sizes, snapshots, peak


def simulate(args: argparse.Namespace) -> int:
    times, cpu, sizes, snapshots, _ = _rounds(args, trace=False)
    peak = _rounds(args, trace=True)[-1]
    p, m = args.executors, args.key_groups
    times_ms = sorted(t * 1000 for t in times)
    p99 = times_ms[min(len(times_ms) - 1, int(0.99 * (len(times_ms) - 1) + 0.5))]
    rows = [
        (
            f"{args.keys:.0e} x {args.value_bytes} B",
            p, m, args.rounds,
            f"{statistics.median(times_ms):.1f}", f"{p99:.1f}",
            f"{statistics.median(cpu) * 1000:.1f}",
            f"{peak / 1e6:.1f}", f"{max(sizes) / 1e3:.0f}", snapshots,
        )
    ]  # fmt: skip
    head = (
        "state", "executors", "key groups", "rounds", "commit p50 ms", "commit p99 ms",
        "commit CPU p50 ms",
        "driver peak MB", "manifest max KB", "range snapshots",
    )  # fmt: skip
    print(_harness.format_table(head, rows))
    segment = args.changes_per_s * args.round_s * args.value_bytes / args.executors
    base = args.keys * args.value_bytes / args.executors
    print(f"segment per task per round: {segment / 1e6:.1f} MB; range base: {base / 1e9:.2f} GB")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", default="1e5,1e6", help="state sizes (default: 1e5,1e6)")
    ap.add_argument("--parallelism", type=int, default=2, help="job parallelism (default: 2)")
    ap.add_argument("--shards", type=int, default=4, help="source shards (default: 4)")
    ap.add_argument("--per_round", type=int, default=10_000, help="updates a round (1e4)")
    ap.add_argument("--update_rounds", type=int, default=20, help="rounds of updates (20)")
    ap.add_argument("--timeout", type=float, default=1800, help="per child, s (default: 1800)")
    ap.add_argument("--simulate", action="store_true", help="the commit over fake handles")
    ap.add_argument("--executors", type=int, default=100, help="simulated tasks (default: 100)")
    ap.add_argument("--key_groups", type=int, default=10_000, help="(default: 10000)")
    ap.add_argument("--rounds", type=int, default=200, help="simulated rounds (default: 200)")
    ap.add_argument("--changes_per_s", type=float, default=1e6, help="(default: 1e6)")
    ap.add_argument("--round_s", type=float, default=1.0, help="round length (default: 1)")
    ap.add_argument("--value_bytes", type=int, default=1000, help="(default: 1000)")
    ap.add_argument("--sim_keys", type=float, default=1e8, help="simulated keys (default: 1e8)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return 0
    if args.simulate:
        args.keys = int(args.sim_keys)
        return simulate(args)
    return run_sizes(args)


if __name__ == "__main__":
    sys.exit(main())

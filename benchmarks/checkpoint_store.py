"""Benchmark: changelog + materialization checkpoints vs a full snapshot at every checkpoint.

For each state size N (keys with 100-byte values) the script loads the state, materializes it
once, then runs ``--rounds`` rounds that each change ``--change`` of the keys and commit a
checkpoint -- once in changelog mode (the checkpoint flushes only the round's changelog segment
and writes a manifest) and once in full-snapshot mode (materialize every checkpoint). It reports
checkpoint duration p50/p99, bytes written per checkpoint, the ratio between the modes, restore
time of the latest checkpoint, and storage amplification (bytes on storage / logical state
bytes, with ``retain`` checkpoints kept). Local disk, fsync on every file.

    python benchmarks/checkpoint_store.py --keys 1e4,1e5,1e6
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time

from sparkbeam.checkpoint import open_store
from sparkbeam.checkpoint.layout import pipeline_dir

VALUE_BYTES = 100


def _value(i: int, r: int) -> bytes:
    head = b"%010d:%06d:" % (i, r)
    return head + b"x" * (VALUE_BYTES - len(head))


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def run_mode(root: str, n: int, mode: str, rounds: int, change: float, seed: int) -> dict:
    rng = random.Random(seed)
    store = open_store(root, materialization_interval_s=None, retain=3, job_name="bench")
    st = store.pipeline(mode)
    keys = [b"key-%010d" % i for i in range(n)]
    t0 = time.perf_counter()
    for i, k in enumerate(keys):
        st.put("bench/state", k, _value(i, 0))
    load_s = time.perf_counter() - t0
    st.materialize()
    st.checkpoint(fingerprint="bench", parallelism=4)
    logical = sum(len("bench/state") + len(k) + VALUE_BYTES for k in keys)
    durations, written = [], []
    per_round = max(1, int(n * change))
    for r in range(1, rounds + 1):
        before = store.storage.bytes_written
        for i in rng.sample(range(n), per_round):
            st.put("bench/state", keys[i], _value(i, r))
        t = time.perf_counter()
        if mode == "full":
            st.materialize()
        st.checkpoint(fingerprint="bench", parallelism=4)
        durations.append(time.perf_counter() - t)
        written.append(store.storage.bytes_written - before)
    stored = sum(store.storage.size(p) for p in store.storage.list(pipeline_dir(mode)))
    store.close()
    store = open_store(root, job_name="bench-restore")
    t = time.perf_counter()
    info = store.pipeline(mode).restore(fingerprint="bench")
    restore_s = time.perf_counter() - t
    assert info is not None and info.entries == n
    store.close()
    return {
        "load_s": load_s,
        "p50": _percentile(durations, 0.5),
        "p99": _percentile(durations, 0.99),
        "bytes": statistics.mean(written),
        "restore_s": restore_s,
        "amplification": stored / logical,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", default="1e4,1e5,1e6", help="state sizes (default: 1e4,1e5,1e6)")
    p.add_argument("--rounds", type=int, default=20, help="checkpoints per mode (default: 20)")
    p.add_argument("--change", type=float, default=0.01, help="fraction changed (default: 0.01)")
    p.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    args = p.parse_args(argv)
    sizes = [int(float(x)) for x in args.keys.split(",")]
    header = (
        f"{'keys':>9} {'mode':>9} {'ckpt p50':>9} {'ckpt p99':>9} {'MB/ckpt':>9} "
        f"{'vs full':>8} {'restore':>8} {'storage amp':>11}"
    )
    print(f"{args.rounds} checkpoints per mode, {args.change:.0%} of keys changed per round, "
          f"{VALUE_BYTES}-byte values, retain=3")  # fmt: skip
    print(header)
    print("-" * len(header))
    for n in sizes:
        results = {}
        for mode in ("changelog", "full"):
            scratch = tempfile.mkdtemp(prefix="sparkbeam-bench-", dir=args.dir)
            try:
                results[mode] = run_mode(scratch, n, mode, args.rounds, args.change, seed=n)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        for mode, r in results.items():
            ratio = results["full"]["bytes"] / r["bytes"]
            print(
                f"{n:>9} {mode:>9} {r['p50'] * 1e3:>7.1f}ms {r['p99'] * 1e3:>7.1f}ms "
                f"{r['bytes'] / 1e6:>9.3f} {ratio:>7.1f}x {r['restore_s']:>7.2f}s "
                f"{r['amplification']:>10.2f}x"
            )
    print(f"(scratch on {args.dir or tempfile.gettempdir()}, pid {os.getpid()})")


if __name__ == "__main__":
    main()

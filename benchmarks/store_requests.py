"""Benchmark: S3 requests per checkpoint round of a streaming job whose store is on ``s3://``.

Starts moto's S3 server on 127.0.0.1 (the test extras' ``moto_server``; see
``tests/servers.py``) and runs ``tests.streaming.streaming_pipelines`` (two offset SDF sources
that deliver ``--per_round`` records per round, a fixed-window count, a bounded input, the
exactly-once sink) in a child process with ``--streaming --checkpoint_dir s3://...``. Every HTTP
request the server answers is one line of its request log, so the counts are real requests from
every process (driver and Spark workers), whatever client made them.

Printed: rounds (checkpoint manifests committed), requests in all, and requests per round in
the steady state -- from the first committed manifest to the last, over the rounds in between,
which leaves out start-up (lock, restore) and shutdown -- split by kind (GET object, LIST, HEAD,
PUT, DELETE, multipart POST) and by what was touched (manifests, staged task segments, driver
changelog, materializations, lock and the rest). ``--sink s3`` also puts the sink's output on
S3 (counted separately); by default it goes to a local temp directory. Materializations (full
snapshots) are off by default (``--materialization_interval_s 3600``), so the figure is that of
an ordinary round; set a short interval to see a snapshot's cost.

Measured (moto 5.2, defaults, 2 Spark partitions; steady-state store requests per round):
79.4 with Beam's ``S3FileSystem`` calls (exists + multipart upload + exists + copy + delete per
file, HEAD + GET per read), 22.1 with ``S3Storage`` (one request per storage call). What is left
per round: each task's staged segment (PUT), the driver reading it (GET), the driver's changelog
segment (PUT), two manifest listings (next id, retention), the manifest (PUT), the retired
manifest (DELETE), the drain-request check (HEAD), and the tasks of stateful stages reading the
new manifest and segments once per Spark worker process.

    python benchmarks/store_requests.py
    python benchmarks/store_requests.py --sources a:300 --per_round 10 --sink s3
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

_LINE = re.compile(r'"(?:\x1b\[[0-9;]*m)*([A-Z]+) (\S+) HTTP/[0-9.]+(?:\x1b\[[0-9;]*m)*" (\d+)')
_MANIFEST = re.compile(r"/manifests/chk-(\d+)\.json$")


def requests(log: Path) -> list[tuple[str, str, str, int]]:
    """(method, path, query, status) of every request in moto's log, in order."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        m = _LINE.search(line)
        if m and not m.group(2).startswith("/moto-api"):
            path, _, query = m.group(2).partition("?")
            out.append((m.group(1), path, query, int(m.group(3))))
    return out


def kind(method: str, path: str, query: str) -> str:
    if method == "GET" and ("list-type" in query or "prefix=" in query or path.count("/") < 2):
        return "LIST"
    if method == "POST" or "uploadId" in query or "partNumber" in query:
        return "MULTIPART"
    return method


def area(path: str, store: str, sink: str) -> str:
    if path.startswith(sink):
        return "sink"
    if not path.startswith(store):
        return "other"
    rel = path[len(store) :]
    for name in ("manifests", "staged", "changelog", "materializations", "_LOCK", "startpoints"):
        if f"/{name}" in rel:
            return name
    return "store (other)"


def run_job(server, args, log_dir: Path) -> None:
    from tests.conftest import TEST_MASTER

    out = server.url("bench-out") if args.sink == "s3" else str(log_dir / "out")
    env = dict(os.environ, PYTHONPATH=REPO, PYSPARK_PYTHON=sys.executable)
    cmd = [
        sys.executable, "-m", "tests.streaming.streaming_pipelines",
        "--output", out, "--sources", args.sources, "--per_round", str(args.per_round),
        "--runner=SparkCheckpointRunner", f"--spark_master_url={TEST_MASTER}",
        "--streaming", f"--checkpoint_dir={server.url('bench-ckpt')}",
        f"--checkpoint_interval_s={args.interval_s}", f"--parallelism={args.parallelism}",
        f"--materialization_interval_s={args.materialization_interval_s}",
        *server.pipeline_flags(),
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        sys.exit(f"the job failed (exit {done.returncode}):\n{done.stderr[-4000:]}")


def report(reqs, bucket: str) -> None:
    store, sink = f"/{bucket}/bench-ckpt", f"/{bucket}/bench-out"
    commits = [
        i
        for i, (method, path, _q, status) in enumerate(reqs)
        if method == "PUT" and status == 200 and _MANIFEST.search(path)
    ]
    ids = {int(_MANIFEST.search(reqs[i][1]).group(1)) for i in commits}
    first = min(commits, key=lambda i: int(_MANIFEST.search(reqs[i][1]).group(1)))
    last = max(commits)
    steady = reqs[first + 1 : last + 1]
    rounds = len(ids) - 1
    store_steady = [r for r in steady if area(r[1], store, sink) != "sink"]
    print(f"checkpoints committed: {len(ids)}; requests in all: {len(reqs)}")
    print(
        f"steady state ({rounds} rounds): {len(store_steady) / rounds:.1f} store requests/round"
        f", {(len(steady) - len(store_steady)) / rounds:.1f} sink requests/round"
    )
    by_kind = Counter(kind(m, p, q) for m, p, q, _s in store_steady)
    by_area = Counter(area(p, store, sink) for _m, p, _q, _s in store_steady)
    print(
        "  store, by kind: " + ", ".join(f"{k} {n / rounds:.1f}" for k, n in by_kind.most_common())
    )
    print(
        "  store, by file: " + ", ".join(f"{k} {n / rounds:.1f}" for k, n in by_area.most_common())
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sources", default="a:80,b:60", help="name:records,... (default)")
    parser.add_argument("--per_round", type=int, default=10, help="records per source per round")
    parser.add_argument("--interval_s", type=float, default=0.05, help="--checkpoint_interval_s")
    parser.add_argument("--parallelism", type=int, default=2, help="Spark partitions (default 2)")
    parser.add_argument(
        "--materialization_interval_s",
        type=float,
        default=3600.0,
        help="snapshot interval (default 3600: rounds write changelog only, as most rounds do)",
    )
    parser.add_argument("--keep_log", help="copy moto's request log to this path")
    parser.add_argument("--sink", choices=("local", "s3"), default="local", help="sink location")
    args = parser.parse_args(argv)
    from tests.servers import start_s3_server, stop_process_group

    with tempfile.TemporaryDirectory(prefix="sparkbeam-s3bench-") as tmp:
        server = start_s3_server(Path(tmp))
        try:
            run_job(server, args, Path(tmp))
            log = Path(tmp) / "moto_server.log"
            if args.keep_log:
                shutil.copyfile(log, args.keep_log)
            report(requests(log), server.bucket)
        finally:
            stop_process_group(server.proc)


if __name__ == "__main__":
    main()

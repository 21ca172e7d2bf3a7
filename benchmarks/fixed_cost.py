"""Benchmark: the fixed cost of a tiny pipeline on FnApiRunner, sparkbeam and bare PySpark.

Method
------
1. Three tiny pipelines (``fixed_cost_pipelines.py``, each checks its output with
   ``assert_that``): ``trivial`` (Create(range(10)) | Map), ``side_inputs`` (one Map with
   10 AsSingleton side inputs) and ``combiners`` (9 x CombineGlobally(sum) + 9 x
   Sample.FixedSizeGlobally(3)). Their data is nothing: what a run costs is the fixed
   cost of planning and executing stages.
2. Each (workload, system) runs in a fresh subprocess of this Python, one pipeline per
   process:
     * ``fnapi``             -- ``--runner=FnApiRunner`` (Beam's in-process portable runner);
     * ``sparkbeam``         -- ``--runner=SparkCheckpointRunner --spark_master_url <master>``;
     * ``sparkbeam-connect`` -- ``--runner=SparkCheckpointRunner --spark_remote <URL>``, on a
                                warm Spark Connect server (only with ``--spark_remote``);
     * ``bare-pyspark``      -- not Beam: a process that starts a SparkSession on <master>
                                and runs one trivial RDD job. It is the floor of any
                                pipeline on Spark; it runs once per round, not per workload.
3. Wall time is measured by the parent around the whole subprocess (Python start-up,
   imports, JVM and SparkSession start included: the time a user waits). CPU seconds are
   user + sys from ``getrusage(RUSAGE_CHILDREN)``; this parent is a child subreaper, so the
   Spark JVM (which PySpark's driver does not wait for) is reaped here and counted. CPU of
   PySpark's worker processes is mostly missed (nobody reaps them with accounting), and a
   Spark Connect server's CPU is not in this process tree at all.
   With ``--repeat N`` all runs are interleaved (round after round, every workload on every
   system in each) so a change in machine load hits all systems; the table shows the
   fastest run of each and lists every run. The 1-minute load average before and after is
   printed: on a shared machine, distrust results taken under load.
4. Ratios, per workload: ``- bare`` is sparkbeam's time minus bare PySpark's (what
   sparkbeam adds to Spark's own floor); ``/ fnapi`` is sparkbeam's time over FnApiRunner's.
   Any failed run is listed after the table and makes the exit status 1.

    python benchmarks/fixed_cost.py --repeat 3
    python benchmarks/fixed_cost.py --workloads trivial --systems sparkbeam-connect \\
        --spark_remote sc://localhost:15002
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from _harness import (
    REPO,
    Result,
    become_subreaper,
    best_of,
    failure,
    format_table,
    load_average,
    method_note,
    parse_names,
    report,
    run_child,
)
from fixed_cost_pipelines import WORKLOADS

PIPELINES = os.path.join(REPO, "benchmarks", "fixed_cost_pipelines.py")
SYSTEMS = ("fnapi", "sparkbeam", "sparkbeam-connect", "bare-pyspark")
DEFAULT_SYSTEMS = ("fnapi", "sparkbeam", "bare-pyspark")
FLOOR = "bare-pyspark"  # also its "workload" in the table
SPARK_SYSTEMS = ("sparkbeam", "sparkbeam-connect")


def command(workload: str, system: str, args: argparse.Namespace) -> list[str]:
    """The child command line that runs ``workload`` on ``system``."""
    base = [sys.executable, PIPELINES]
    if system == FLOOR:
        return [*base, "bare_pyspark", args.master]
    flags = {
        "fnapi": ["--runner=FnApiRunner"],
        "sparkbeam": ["--runner=SparkCheckpointRunner", f"--spark_master_url={args.master}"],
        "sparkbeam-connect": [
            "--runner=SparkCheckpointRunner",
            f"--spark_remote={args.spark_remote}",
        ],
    }[system]
    return [*base, workload, *flags]


def run_one(workload: str, system: str, work: str, args: argparse.Namespace, n: int) -> Result:
    cmd = command(workload, system, args)
    log_path = os.path.join(work, f"{workload}-{system}-{n}.log")
    print(f"running {workload} on {system}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    child = run_child(cmd, log_path, args.timeout)
    if child.returncode != 0:
        problem = failure(child, log_path, args.timeout)
        print(f"  FAILED: {problem}", file=sys.stderr, flush=True)
        return Result(system, child.seconds, False, problem, cpu=child.cpu, workload=workload)
    print(f"  {child.seconds:.1f} s wall, {child.cpu:.1f} s CPU", file=sys.stderr, flush=True)
    return Result(system, child.seconds, True, cpu=child.cpu, workload=workload)


def schedule(workloads: list[str], systems: list[str], repeat: int) -> list[tuple[str, str]]:
    """(workload, system) in run order: rounds, each every workload on every system."""
    one_round = [(FLOOR, FLOOR)] if FLOOR in systems else []
    one_round += [(w, s) for w in workloads for s in systems if s != FLOOR]
    return one_round * repeat


def _diff(a: Result, b: Result | None, attr: str) -> str:
    if b is None or not (a.ok and b.ok):
        return "-"
    return f"{getattr(a, attr) - getattr(b, attr):+.1f}"


def _ratio(a: Result, b: Result | None, attr: str) -> str:
    if b is None or not (a.ok and b.ok) or getattr(b, attr) <= 0:
        return "-"
    return f"{getattr(a, attr) / getattr(b, attr):.2f}x"


def table(results: list[Result]) -> str:
    """Rows of workload x system, with sparkbeam's difference to bare PySpark and its
    ratio to FnApiRunner."""
    by = {(r.workload, r.system): r for r in results}
    floor = by.get((FLOOR, FLOOR))
    head = (
        "workload",
        "system",
        "wall s",
        "CPU s",
        "wall - bare",
        "CPU - bare",
        "wall / fnapi",
        "CPU / fnapi",
        "status",
        "runs wall s",
    )
    rows = []
    for r in results:
        vs_bare = floor if r.system in SPARK_SYSTEMS else None
        fnapi = by.get((r.workload, "fnapi")) if r.system in SPARK_SYSTEMS else None
        rows.append(
            (
                r.workload,
                r.system,
                f"{r.seconds:.1f}",
                f"{r.cpu:.1f}",
                _diff(r, vs_bare, "seconds"),
                _diff(r, vs_bare, "cpu"),
                _ratio(r, fnapi, "seconds"),
                _ratio(r, fnapi, "cpu"),
                "ok" if r.ok else "FAILED",
                " ".join(f"{x:.1f}" for x in r.runs),
            )
        )
    return format_table(head, rows)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help=f"Comma-separated subset of {','.join(WORKLOADS)}. Default: all.",
    )
    parser.add_argument(
        "--systems",
        default=None,
        help=f"Comma-separated subset of {','.join(SYSTEMS)}. Default: "
        f"{','.join(DEFAULT_SYSTEMS)}, plus sparkbeam-connect when --spark_remote is given.",
    )
    parser.add_argument(
        "--master",
        default="local[2]",
        help="Spark master of the local systems. Default: %(default)s",
    )
    parser.add_argument(
        "--spark_remote",
        default=None,
        metavar="URL",
        help="Spark Connect URL (sc://host:port) of a running server: the sparkbeam-connect "
        "system runs there. Default: none (the system is not run).",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="Rounds of runs, interleaved across systems; the fastest counts. Default: %(default)s",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=600,
        help="Per-run timeout in seconds. Default: %(default)s",
    )
    args = parser.parse_args(argv)
    default = (*DEFAULT_SYSTEMS, "sparkbeam-connect") if args.spark_remote else DEFAULT_SYSTEMS
    args.systems = parse_names(args.systems or ",".join(default), SYSTEMS, parser)
    args.workloads = parse_names(args.workloads, WORKLOADS, parser, "workloads")
    if "sparkbeam-connect" in args.systems and not args.spark_remote:
        parser.error("system sparkbeam-connect needs --spark_remote sc://host:port")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    subreaper = become_subreaper()
    work = tempfile.mkdtemp(prefix="sparkbeam-bench-fixed-cost-")
    load_before = load_average()
    plan = schedule(args.workloads, args.systems, args.repeat)
    runs = [run_one(w, s, work, args, i) for i, (w, s) in enumerate(plan)]
    order = list(dict.fromkeys(plan))
    results = [best_of(runs, s, w) for w, s in order]
    load_after = load_average()

    print(
        f"\nfixed cost of tiny pipelines; master {args.master}"
        + (f"; Spark Connect {args.spark_remote}" if args.spark_remote else "")
        + f"; one process per run, wall time includes process start (+ JVM/SparkSession start);"
        f" best of {args.repeat}; " + method_note(subreaper, load_before, load_after)
    )
    return report(results, table(results), work)


if __name__ == "__main__":
    sys.exit(main())

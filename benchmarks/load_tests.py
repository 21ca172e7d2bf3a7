"""Benchmark: Beam's own load tests on DirectRunner and on sparkbeam.

Method
------
1. The tests are the ones shipped in the installed apache-beam wheel
   (``apache_beam/testing/load_tests/``), unmodified, each reading ``--records`` records of
   a SyntheticSource (10-byte keys, 90-byte values: Beam's "100 byte records" configs):
     * ``pardo``     -- ``pardo_test``: 10 chained ParDos (``--iterations=10``), no counters
                        (``--number_of_counters=0 --number_of_counter_operations=0``);
     * ``gbk``       -- ``group_by_key_test``: one GroupByKey, values iterated once
                        (``--fanout=1 --iterations=1``);
     * ``combine``   -- ``combine_test``: CombineGlobally(Top 20) (``--fanout=1 --top_count=20``);
     * ``sideinput`` -- ``sideinput_test``: one element reads the whole input as an
                        ``AsIter`` side input (``--side_input_type=iter``); its input comes
                        from a splittable DoFn (SyntheticSDFAsSource).
   Metrics publishing is off: no ``--publish_to_big_query``, no InfluxDB options (the tests
   then only log their metrics).
2. Each (test, system) runs in a fresh subprocess of this Python,
   ``python -m apache_beam.testing.load_tests.<test> --test-pipeline-options="..."`` (through
   a one-line wrapper that turns on INFO logging, which the tests' own
   ``logging.basicConfig`` fails to do once Beam has logged a warning at import):
     * ``direct``    -- ``--runner=DirectRunner``. Beam 2.77's DirectRunner first tries Prism
                        (a Go binary it downloads); without network access, as on sparkbeam's
                        test machines, it falls back to its Python FnApiRunner;
     * ``fnapi``     -- ``--runner=FnApiRunner`` (not run by default);
     * ``sparkbeam`` -- ``--runner=SparkCheckpointRunner --spark_master_url <master>``.
3. Measured: wall time of the whole subprocess (Python start, JVM and SparkSession start
   included), CPU seconds of the reaped children (this parent is a child subreaper, so the
   Spark JVM is counted; PySpark's worker processes mostly are not), and Beam's own
   ``runtime`` metric (whole seconds from the first to the last element seen by the test's
   MeasureTime steps: processing time without start-up), when the runner reports it.
   With ``--repeat N`` the runs are interleaved round by round; the fastest counts.
4. A test that fails or times out on a system is reported (exit status and the error line
   of its log) and the others carry on; any failure makes the exit status 1.

    python benchmarks/load_tests.py                 # 1,000,000 records, every test
    python benchmarks/load_tests.py --records 100000 --tests pardo,gbk
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import tempfile

from _harness import (
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

TESTS = {
    "pardo": (
        "pardo_test",
        ["--iterations=10", "--number_of_counters=0", "--number_of_counter_operations=0"],
    ),
    "gbk": ("group_by_key_test", ["--fanout=1", "--iterations=1"]),
    "combine": ("combine_test", ["--fanout=1", "--top_count=20"]),
    "sideinput": ("sideinput_test", ["--side_input_type=iter"]),
}
SYSTEMS = ("direct", "fnapi", "sparkbeam")
DEFAULT_SYSTEMS = ("direct", "sparkbeam")
KEY_SIZE, VALUE_SIZE = 10, 90
# Runs the load test module as __main__ with INFO logging (its metrics are logged at INFO).
WRAPPER = (
    "import logging, runpy, sys; logging.basicConfig(level=logging.INFO, force=True); "
    "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)"
)
RUNTIME_RE = re.compile(r"Metric: \S*_runtime Value: (-?\d+)")


def command(test: str, system: str, args: argparse.Namespace) -> list[str]:
    """The child command line of ``test`` on ``system``."""
    module, test_flags = TESTS[test]
    runner = {
        "direct": ["--runner=DirectRunner"],
        "fnapi": ["--runner=FnApiRunner"],
        "sparkbeam": ["--runner=SparkCheckpointRunner", f"--spark_master_url={args.master}"],
    }[system]
    source = {"num_records": args.records, "key_size": KEY_SIZE, "value_size": VALUE_SIZE}
    options = [*runner, *test_flags, f"--input_options={json.dumps(source)}"]
    return [
        sys.executable,
        "-c",
        WRAPPER,
        f"apache_beam.testing.load_tests.{module}",
        f"--test-pipeline-options={shlex.join(options)}",
    ]


def beam_runtime(log_path: str) -> float | None:
    """Beam's ``runtime`` metric as the load test logged it, if it did."""
    with open(log_path, errors="replace") as f:
        found = RUNTIME_RE.findall(f.read())
    return float(found[-1]) if found else None


def run_one(test: str, system: str, work: str, args: argparse.Namespace, n: int) -> Result:
    cmd = command(test, system, args)
    log_path = os.path.join(work, f"{test}-{system}-{n}.log")
    print(f"running {test} on {system}  (log: {log_path})", file=sys.stderr, flush=True)
    child = run_child(cmd, log_path, args.timeout)
    result = Result(system, child.seconds, child.returncode == 0, cpu=child.cpu, workload=test)
    if not result.ok:
        result.problem = failure(child, log_path, args.timeout)
        print(f"  FAILED: {result.problem}", file=sys.stderr, flush=True)
        return result
    runtime = beam_runtime(log_path)
    result.note = "-" if runtime is None else f"{runtime:g}"
    print(f"  {child.seconds:.1f} s wall, {child.cpu:.1f} s CPU", file=sys.stderr, flush=True)
    return result


def table(results: list[Result]) -> str:
    """Rows of test x system, with each system's wall time over DirectRunner's."""
    by = {(r.workload, r.system): r for r in results}
    head = (
        "test",
        "system",
        "wall s",
        "CPU s",
        "Beam runtime s",
        "wall / direct",
        "status",
        "runs s",
    )
    rows = []
    for r in results:
        base = by.get((r.workload, "direct"))
        ratio = (
            f"{r.seconds / base.seconds:.2f}x"
            if base and base is not r and base.ok and r.ok
            else "-"
        )
        rows.append(
            (
                r.workload,
                r.system,
                f"{r.seconds:.1f}",
                f"{r.cpu:.1f}",
                r.note or "-",
                ratio,
                "ok" if r.ok else "FAILED",
                " ".join(f"{x:.1f}" for x in r.runs),
            )
        )
    return format_table(head, rows)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--records",
        type=int,
        default=1_000_000,
        help="Records of each test's synthetic input. Default: %(default)s",
    )
    parser.add_argument(
        "--tests",
        default=",".join(TESTS),
        help=f"Comma-separated subset of {','.join(TESTS)}. Default: all.",
    )
    parser.add_argument(
        "--systems",
        default=",".join(DEFAULT_SYSTEMS),
        help=f"Comma-separated subset of {','.join(SYSTEMS)}. Default: %(default)s",
    )
    parser.add_argument(
        "--master", default="local[2]", help="Spark master of sparkbeam. Default: %(default)s"
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
        default=3600,
        help="Per-run timeout in seconds. Default: %(default)s",
    )
    args = parser.parse_args(argv)
    args.tests = parse_names(args.tests, tuple(TESTS), parser, "tests")
    args.systems = parse_names(args.systems, SYSTEMS, parser)
    if args.records < 1:
        parser.error(f"--records must be at least 1, got {args.records}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    subreaper = become_subreaper()
    work = tempfile.mkdtemp(prefix="sparkbeam-bench-load-tests-")
    load_before = load_average()
    plan = [(t, s) for _ in range(args.repeat) for t in args.tests for s in args.systems]
    runs = [run_one(t, s, work, args, i) for i, (t, s) in enumerate(plan)]
    results = [best_of(runs, s, t) for t, s in dict.fromkeys(plan)]
    load_after = load_average()

    print(
        f"\nBeam load tests, {args.records:,} records of {KEY_SIZE + VALUE_SIZE} bytes; "
        f"master {args.master}; wall time includes process start (+ JVM/SparkSession start); "
        f"best of {args.repeat}; " + method_note(subreaper, load_before, load_after)
    )
    return report(results, table(results), work)


if __name__ == "__main__":
    sys.exit(main())

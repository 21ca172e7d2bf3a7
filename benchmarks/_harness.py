"""What the benchmarks share: run a system in a fresh child process and time it, report.

Each benchmark script (``wordcount.py``, ``fixed_cost.py``, ``load_tests.py``, ``sdf.py``)
owns its workloads and its table's columns; this module owns how a child is run and
measured, and the plain-text table format:

* ``run_child`` -- wall time measured by the parent around the whole child process
  (Python start-up, imports, JVM and SparkSession start included: the time a user
  waits), and CPU seconds from ``getrusage(RUSAGE_CHILDREN)`` around it. The child runs
  in its own session; on a timeout its whole process group is killed (a Spark JVM left
  behind would load the machine for the next system).
* ``become_subreaper`` / ``reap_orphans`` -- PySpark's driver does not wait for the
  Spark JVM it started, so its CPU is missing from RUSAGE_CHILDREN unless this process
  adopts and reaps it (Linux ``PR_SET_CHILD_SUBREAPER``). CPU of processes that nobody
  reaps with accounting (most of PySpark's worker processes) is still missed.
* ``best_of`` -- with ``--repeat N`` systems run interleaved (a, b, c, a, b, c, ...) so a
  change in machine load hits all of them; the fastest run counts.
* ``error_line`` -- the line of a failed child's log that says what went wrong.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 3.0
# The last line of a Python traceback ("ValueError: ...", "py4j.protocol.Py4JJavaError: ...").
_ERROR_RE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*")
_subreaper = False


@dataclass
class Child:
    """One finished child process."""

    returncode: int | None  # None: killed after the timeout
    seconds: float
    cpu: float  # user + sys of the reaped descendants


@dataclass
class Result:
    """One system's run (or the best of several) of one workload."""

    system: str
    seconds: float
    ok: bool
    problem: str = ""
    runs: tuple[float, ...] = ()
    cpu: float = float("nan")
    workload: str = ""
    note: str = ""  # a benchmark's own extra column, e.g. a metric the child logged


def child_env(extra_path: list[str] | None = None) -> dict[str, str]:
    """This environment, with Spark's Python workers on this interpreter.

    sparkbeam sets the same default itself; otherwise PySpark would start whatever
    ``python3`` is on PATH. ``extra_path`` is prepended to PYTHONPATH.
    """
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join([*extra_path, env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
    return env


def run_child(
    cmd: list[str], log_path: str, timeout: float | None, env: dict[str, str] | None = None
) -> Child:
    """Run ``cmd`` (output to ``log_path``), timing it; kill its process group on timeout."""
    env = child_env() if env is None else env
    before = _children_cpu()
    with open(log_path, "w") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True
        )
        try:
            returncode: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            returncode = None
        seconds = time.perf_counter() - t0
    if _subreaper:
        reap_orphans()
    return Child(returncode, seconds, _children_cpu() - before)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _children_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def become_subreaper() -> bool:
    """Adopt orphaned descendants (e.g. the Spark JVM, which PySpark's driver does not
    wait for), so that reaping them adds their CPU to RUSAGE_CHILDREN. Linux only;
    returns False where unavailable."""
    global _subreaper
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        _subreaper = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        _subreaper = False
    return _subreaper


def reap_orphans(timeout_s: float = 60.0) -> int:
    """Wait for (and reap) every orphaned descendant; return how many were still alive."""
    deadline = time.time() + timeout_s
    grace = time.time() + GRACE_S
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            # Descendants still dying elsewhere in the tree may re-parent here later.
            if time.time() > grace:
                return 0
            time.sleep(0.05)
            continue
        if pid == 0:
            if time.time() > deadline:
                return len([d for d in os.listdir("/proc") if d.isdigit() and _is_child(int(d))])
            time.sleep(0.05)


def _is_child(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:
        return False
    return int(raw[raw.rfind(")") + 2 :].split()[1]) == os.getpid()


def process_tree(pid: int) -> dict[int, list[str]]:
    """The ``/proc/<p>/stat`` fields after the command name (``[11]`` utime, ``[12]`` stime,
    ``[21]`` rss pages) of ``pid``, its live descendants, and the Python worker processes it
    started: the zygote (``runner/spark/zygote.py``, named with the driver's pid) detaches from
    the driver, and the worker daemon and its workers are forked from it."""
    stats: dict[int, list[str]] = {}
    children: dict[int, list[int]] = {}
    roots = [pid]
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            stats[int(entry.name)] = fields
            children.setdefault(int(fields[1]), []).append(int(entry.name))
            if b"sparkbeam.runner.spark.zygote" in argv and str(pid).encode() in argv:
                roots.append(int(entry.name))
    tree: dict[int, list[str]] = {}
    todo = roots
    while todo:
        p = todo.pop()
        if p in stats and p not in tree:
            tree[p] = stats[p]
            todo.extend(children.get(p, []))
    return tree


def error_line(log_path: str) -> str:
    """The last exception line of the log (a traceback's headline), else its last line."""
    try:
        with open(log_path, errors="replace") as f:
            lines = [line.rstrip() for line in f if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if _ERROR_RE.match(line)]
    chosen = errors[-1] if errors else (lines[-1] if lines else "(no output)")
    return chosen if len(chosen) <= 300 else chosen[:297] + "..."


def failure(child: Child, log_path: str, timeout: float | None) -> str:
    """A one-line account of a failed child: exit status (or timeout) and its error."""
    if child.returncode is None:
        return f"timed out after {timeout:g} s, see {log_path}"
    return f"exit status {child.returncode}: {error_line(log_path)} (log: {log_path})"


def json_child(cmd: list[str], log_path: str, timeout: float) -> tuple[dict | None, str]:
    """Run a child that prints its measurements as one JSON line: (that line's dict, "") or
    (None, a one-line account of the failure)."""
    import json

    child = run_child(cmd, log_path, timeout)
    with open(log_path, errors="replace") as f:
        lines = [line for line in f if line.startswith("{")]
    if child.returncode != 0 or not lines:
        return None, failure(child, log_path, timeout)
    return json.loads(lines[-1]), ""


def sized_runs(
    script: str, sizes: list[str], size_flag: str, flags: list[str], timeout: float
) -> list[dict] | None:
    """``script --child <size_flag> <size> --store <new dir> <flags>`` once per size, each
    with an empty store that is removed after: the children's JSON lines, in order (None,
    after printing why, if one failed)."""
    import tempfile

    become_subreaper()
    results = []
    for size in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [
                sys.executable, script, "--child", size_flag, str(size),
                "--store", os.path.join(tmp, "ckpt"), *flags,
            ]  # fmt: skip
            got, problem = json_child(cmd, os.path.join(tmp, "child.log"), timeout)
        if got is None:
            print(f"{size_flag} {size}: failed: {problem}")
            return None
        results.append(got)
    return results


def print_scale_result(store: str, **fields) -> None:
    """A scale benchmark's child: ``fields`` with this process's peak resident memory and the
    size of the store at ``store``, as one JSON line (`sized_runs` reads it)."""
    import json
    import resource

    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    store_mb = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(store) for f in fs)
    print(json.dumps({**fields, "driver_peak_mb": peak_mb, "store_mb": store_mb / 2**20}))


def driver_growth(got: dict, first: dict, size_key: str) -> tuple[str, str]:
    """The driver's peak memory against the first size's: (+MB, MB per unit of size)."""
    grown = got["driver_peak_mb"] - first["driver_peak_mb"]
    more = got[size_key] - first[size_key]
    return f"{grown:+.0f}", f"{grown / more:.2f}" if more > 0 else "-"


def scale_arguments(ap, size_flag: str, sizes: str, what: str, shards: str, rounds: str) -> None:
    """The options of a benchmark that grows one data size (``size_flag``, in MB) of a real
    job and watches the driver: sizes, record size, rounds, shards, parallelism, timeout."""
    ap.add_argument(size_flag, default=sizes, help=f"{what} (default: {sizes})")
    ap.add_argument("--chunk_kb", type=int, default=64, help="record size (default: 64)")
    ap.add_argument("--rounds", type=int, default=4, help=f"{rounds} (default: 4)")
    ap.add_argument("--delay_s", type=float, default=0.1, help="resume delay (default: 0.1)")
    ap.add_argument("--parallelism", type=int, default=2, help="job parallelism (default: 2)")
    ap.add_argument("--shards", type=int, default=4, help=f"{shards} (default: 4)")
    ap.add_argument("--timeout", type=float, default=1800, help="per child, s (default: 1800)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)


def scale_table(
    script: str, args, size_flag: str, label: str, exact: tuple[str, str]
) -> int:  # fmt: skip
    """Run ``script``'s child per size (`scale_arguments`) and print one row each: wall, the
    driver's peak and its growth, the store, and whether ``exact[0]`` reached ``exact[1]``."""
    size_key = size_flag.lstrip("-")
    flags = [
        "--parallelism", str(args.parallelism), "--shards", str(args.shards),
        "--rounds", str(args.rounds), "--chunk_kb", str(args.chunk_kb),
        "--delay_s", str(args.delay_s),
    ]  # fmt: skip
    sizes = getattr(args, size_key).split(",")
    results = sized_runs(script, sizes, size_flag, flags, args.timeout)
    if results is None:
        return 1
    rows = []
    for got in results:
        grown, per = driver_growth(got, results[0], size_key)
        done, want = got[exact[0]], got[exact[1]]
        rows.append(
            (
                f"{got[size_key]:.0f}", f"{got['wall']:.1f}", f"{got['driver_peak_mb']:.0f}",
                grown, per, f"{got['store_mb']:.0f}",
                "yes" if done == want else f"no ({done} of {want})",
            )
        )  # fmt: skip
    head = (f"{label} MB", "wall s", "driver MB", "vs first", f"MB/{label} MB", "store MB")
    print(format_table((*head, "exact"), rows))
    return 0


def best_of(runs: list[Result], system: str, workload: str = "") -> Result:
    """The fastest run of ``system`` (on ``workload``), or its first failure; every run's
    seconds attached."""
    mine = [r for r in runs if r.system == system and r.workload == workload]
    failed = [r for r in mine if not r.ok]
    chosen = failed[0] if failed else min(mine, key=lambda r: r.seconds)
    return Result(
        system,
        chosen.seconds,
        chosen.ok,
        chosen.problem,
        tuple(r.seconds for r in mine),
        chosen.cpu,
        workload,
        chosen.note,
    )


def load_average() -> float:
    """The 1-minute load average: on a shared machine, distrust results taken under load."""
    return os.getloadavg()[0]


def format_table(head: tuple[str, ...], rows: list[tuple]) -> str:
    """A plain-text table; the first column left-aligned, the others right-aligned."""
    widths = [max(len(str(x[i])) for x in [head, *rows]) for i in range(len(head))]

    def fmt(row) -> str:
        cells = (
            str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(row, widths))
        )
        return "  ".join(cells).rstrip()

    return "\n".join([fmt(head), fmt(["-" * w for w in widths]), *map(fmt, rows)])


def parse_names(value: str, known: tuple[str, ...], parser, what: str = "systems") -> list[str]:
    """A comma-separated option value (``--systems``, ``--workloads``), checked against
    ``known``; an unknown name is a usage error naming it."""
    names = [s.strip() for s in value.split(",") if s.strip()]
    unknown = set(names) - set(known)
    if unknown:
        parser.error(f"unknown {what} {sorted(unknown)}; choose from {','.join(known)}")
    if not names:
        parser.error(f"no {what} given; choose from {','.join(known)}")
    return names


def method_note(subreaper: bool, load_before: float, load_after: float) -> str:
    """The end of a benchmark's header: how CPU was counted, and the load around the runs."""
    return (
        "CPU = reaped children's rusage"
        + ("" if subreaper else " (WARNING: not a subreaper, the JVM's CPU is missing)")
        + f"; load average {load_before:.1f} before, {load_after:.1f} after"
        f" on {os.cpu_count()} CPUs\n"
    )


def report(results: list[Result], table: str, work: str) -> int:
    """Print the table and every failure; keep ``work`` (the logs) only if something failed."""
    import shutil

    print(table)
    failed = [r for r in results if not r.ok]
    for r in failed:
        print(f"\nFAILED {r.workload} on {r.system}: {r.problem}", file=sys.stderr)
    if not failed:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0

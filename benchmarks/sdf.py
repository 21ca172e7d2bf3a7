"""Benchmark: splittable DoFns on Beam's DirectRunner (FnApiRunner) vs SparkCheckpointRunner.

Two workloads, each run by each system in a fresh subprocess of this Python
(``python benchmarks/sdf.py --child ...``):

(a) ``poll``: one element; the SDF polls "is the deadline reached?" and, while it
    is not, calls ``tracker.defer_remainder(Duration(seconds=1))`` -- a polling
    SDF that waits ``--wait_s`` seconds (default 20) with 1 s resume delays. The
    deadline is computed (``time.time() + wait_s``) by a Map right before the
    SDF at run time, so Spark's start-up does not eat the wait. Systems:
      * ``direct``              -- ``--runner=DirectRunner`` (Beam's FnApiRunner);
      * ``sparkbeam``           -- ``--runner=SparkCheckpointRunner`` with the default
                                   ``--residual_budget_s`` (30 s: the first residuals
                                   are re-fed inside the task, later ones by the
                                   driver in new Spark jobs, "rounds");
      * ``sparkbeam-intask``    -- ``--residual_budget_s=3600``: every residual is
                                   re-fed inside the task (sleeping in between);
      * ``sparkbeam-budget0``   -- ``--residual_budget_s=0``: every residual goes
                                   through the driver's timer store (a Spark job per
                                   poll);
      * ``sparkbeam-sleep``     -- baseline, not an SDF: the same pipeline shape, but
                                   one DoFn call that ``time.sleep(wait_s)``. It is what
                                   an idle sparkbeam job (driver + Spark JVM + Python
                                   worker) costs for the same wall time.
    Measured: CPU seconds (user + sys) per wall second,
      * for the whole run, two ways:
        ``CPU s`` = ``resource.getrusage(RUSAGE_CHILDREN)`` of this parent around
        the subprocess. PySpark's driver does not wait for the Spark JVM, so this
        parent makes itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``)
        and reaps the orphans: the JVM's CPU IS included. It still misses CPU of
        descendants that nobody reaps with accounting (measured: most of the
        PySpark worker processes' CPU is missing), so
        ``tree CPU s`` = the sum over every process ever seen in the subprocess's
        tree of its last sampled utime+stime (below) is the better whole-run number;
      * during the waiting phase only: this parent samples ``/proc/<pid>/stat`` of
        the whole process tree every ``--sample_s`` (0.25) s, keeping the last seen
        utime+stime per pid; the cumulative tree CPU is interpolated at the first and
        last call of the SDF (each call appends its wall time to a log file), which
        excludes JVM start-up, planning and the output stage. CPU of a process
        that lives less than one sample interval is missed by the sampler.
    "polls" is the number of calls of the SDF; a system that ignores the resume
    delay polls far more often than once a second.

(b) ``offsets``: two elements (``a``, ``b``) of ``--elements / 2`` positions each;
    ``examples/sdf_offsets.py``'s SDF emits one element per position and calls
    ``defer_remainder()`` (no delay) every ``--every`` (1,000) claims; the output
    is counted per name. Rates are over the SDF phase (first call start to last
    call end, from the same call log; includes the fused downstream counting),
    so they exclude start-up: elements/s = elements / phase, residuals/s =
    residuals (calls that deferred) / phase. The counts must be exact for every
    system (checked; a mismatch exits 1 after the table). On request
    (``--systems sparkbeam-budget0``) the offsets also run with every residual
    going through the driver (a Spark job per round; slow, use few elements).

    python benchmarks/sdf.py                        # both workloads
    python benchmarks/sdf.py --workloads offsets --elements 200000
    python benchmarks/sdf.py --workloads poll --wait_s 10 --systems direct,sparkbeam
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

from _harness import REPO, become_subreaper, reap_orphans

POLL_SYSTEMS = (
    "direct",
    "sparkbeam",
    "sparkbeam-intask",
    "sparkbeam-budget0",
    "sparkbeam-sleep",
)
OFFSET_SYSTEMS = ("direct", "sparkbeam")
CLK_TCK = os.sysconf("SC_CLK_TCK")
CATEGORIES = ("driver", "jvm", "pyworkers")


# --------------------------------------------------------------------------- child


def _runner_flags(system: str, master: str) -> list[str]:
    if system == "direct":
        return ["--runner=DirectRunner"]
    flags = ["--runner=SparkCheckpointRunner", f"--spark_master_url={master}"]
    if system == "sparkbeam-budget0":
        flags.append("--residual_budget_s=0")
    elif system == "sparkbeam-intask":
        flags.append("--residual_budget_s=3600")
    return flags


def _child(args: argparse.Namespace) -> None:
    import apache_beam as beam
    from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.transforms.core import RestrictionProvider
    from apache_beam.utils.timestamp import Duration

    sys.path.insert(0, os.path.join(REPO, "examples"))
    from sdf_offsets import EmitWithCheckpoints  # noqa: E402

    from sparkbeam.sdf import OffsetRangeProvider  # noqa: E402

    call_log = args.call_log

    def log_call(*fields) -> None:
        with open(call_log, "a") as f:
            f.write(" ".join(str(x) for x in fields) + "\n")

    class OneShot(RestrictionProvider):
        def initial_restriction(self, element):
            return OffsetRange(0, 1)

        def create_tracker(self, restriction):
            return OffsetRestrictionTracker(restriction)

        def restriction_size(self, element, restriction):
            return restriction.size()

    class PollUntil(beam.DoFn):
        """Element: a deadline (epoch s). Defers by 1 s until it has passed."""

        def process(self, deadline, tracker=beam.DoFn.RestrictionParam(OneShot())):
            now = time.time()
            log_call(now)
            if now < deadline:
                tracker.defer_remainder(Duration(seconds=1))
                return
            if tracker.try_claim(0):
                yield 1

    class SleepUntil(beam.DoFn):
        """Baseline: one call that sleeps until the deadline."""

        def process(self, deadline):
            log_call(time.time())
            time.sleep(max(0.0, deadline - time.time()))
            log_call(time.time())
            yield 1

    class LoggedEmit(EmitWithCheckpoints):
        def process(self, element, tracker=beam.DoFn.RestrictionParam(OffsetRangeProvider())):
            start = time.time()
            first, stop = tracker.current_restriction().start, tracker.current_restriction().stop
            n = 0
            for out in self._emit(element[0], tracker):
                n += 1
                yield out
            log_call(start, time.time(), n, int(first + n < stop))

    options = PipelineOptions(_runner_flags(args.child_system, args.master))
    counts: dict[str, int] = {}
    t0 = time.time()
    p = beam.Pipeline(options=options)
    if args.child == "poll":
        wait_s = args.wait_s
        dofn = SleepUntil() if args.child_system == "sparkbeam-sleep" else PollUntil()
        (
            p
            | beam.Create([0])
            | "Deadline" >> beam.Map(lambda _: time.time() + wait_s)
            | "Poll" >> beam.ParDo(dofn)
            | beam.combiners.Count.Globally()
            | beam.Map(lambda n: f"done\t{n}")
            | beam.io.WriteToText(args.out, shard_name_template="")
        )
    else:
        half = args.elements // 2
        elements = [("a", half), ("b", args.elements - half)]
        (
            p
            | beam.Create(elements)
            | "Emit" >> beam.ParDo(LoggedEmit(args.every))
            | beam.combiners.Count.PerElement()
            | beam.MapTuple(lambda k, n: f"{k}\t{n}")
            | beam.io.WriteToText(args.out, shard_name_template="")
        )
    p.run().wait_until_finish()
    t1 = time.time()
    with open(args.out) as f:
        for line in f.read().splitlines():
            k, n = line.split("\t")
            counts[k] = int(n)
    with open(args.result, "w") as f:
        json.dump({"pipeline_start": t0, "pipeline_end": t1, "counts": counts}, f)


# --------------------------------------------------------------------------- parent


def _category(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "driver"
    if "java" in cmd.split(" ", 1)[0]:
        return "jvm"
    if "pyspark" in cmd:
        return "pyworkers"
    return "driver"


def _tree_cpu(root: int, last: dict[int, float], cats: dict[int, str]) -> None:
    """Update ``last[pid]`` = utime+stime (s) of every live process in ``root``'s tree."""
    children: dict[int, list[int]] = {}
    stats: dict[int, float] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                raw = f.read()
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2 :].split()
        pid, ppid = int(name), int(fields[1])
        children.setdefault(ppid, []).append(pid)
        stats[pid] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            last[pid] = stats[pid]
            # Re-read each time: spark-submit's shell exec()s into the JVM (same pid).
            cats[pid] = "driver" if pid == root else _category(pid)
        todo.extend(children.get(pid, ()))


def _run_child(workload: str, system: str, args: argparse.Namespace, tmp: str) -> dict:
    tag = f"{workload}-{system}"
    call_log = os.path.join(tmp, f"{tag}.calls")
    result = os.path.join(tmp, f"{tag}.json")
    out = os.path.join(tmp, f"{tag}.out")
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        workload,
        "--child_system",
        system,
        "--master",
        args.master,
        "--wait_s",
        str(args.wait_s),
        "--elements",
        str(args.elements),
        "--every",
        str(args.every),
        "--call_log",
        call_log,
        "--result",
        result,
        "--out",
        out,
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([REPO, os.path.join(REPO, "examples")]),
        "PYSPARK_PYTHON": sys.executable,
    }
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    samples: list[tuple[float, float]] = []
    by_cat: dict[str, list[tuple[float, float]]] = {c: [] for c in CATEGORIES}
    last: dict[int, float] = {}
    cats: dict[int, str] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            _tree_cpu(proc.pid, last, cats)
            now = time.time()
            samples.append((now, sum(last.values())))
            for c in CATEGORIES:
                by_cat[c].append((now, sum(v for p, v in last.items() if cats.get(p) == c)))
            stop.wait(args.sample_s)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output = proc.communicate()[0].decode(errors="replace")
    wall = time.time() - start
    stop.set()
    sampler.join()
    orphans_left = reap_orphans()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        print(f"[{tag}] FAILED (exit {proc.returncode}):\n{output[-3000:]}", file=sys.stderr)
        return {"system": system, "failed": True}
    with open(result) as f:
        res = json.load(f)
    with open(call_log) as f:
        calls = [list(map(float, line.split())) for line in f.read().splitlines()]
    row = {
        "system": system,
        "wall": wall,
        "cpu": cpu,
        "cpu_per_wall": cpu / wall,
        "sampled_cpu": samples[-1][1] if samples else float("nan"),
        "orphans_left": orphans_left,
        "sampled_cpu_by_category": {c: by_cat[c][-1][1] for c in CATEGORIES if by_cat[c]},
        "counts": res["counts"],
        "pipeline_s": res["pipeline_end"] - res["pipeline_start"],
    }
    if workload == "poll":
        t_first, t_last = calls[0][0], calls[-1][0]
        phase = t_last - t_first
        phase_cpu = _interp(samples, t_last) - _interp(samples, t_first)
        row.update(
            {
                f"wait_cpu_{c}": _interp(by_cat[c], t_last) - _interp(by_cat[c], t_first)
                for c in CATEGORIES
            }
        )
        row.update(
            polls=len(calls) if system != "sparkbeam-sleep" else 0,
            wait_phase_s=phase,
            wait_cpu=phase_cpu,
            wait_cpu_per_wall=phase_cpu / phase if phase > 0 else float("nan"),
        )
    else:
        t_first = min(c[0] for c in calls)
        t_last = max(c[1] for c in calls)
        phase = t_last - t_first
        emitted = int(sum(c[2] for c in calls))
        residuals = int(sum(c[3] for c in calls))
        row.update(
            sdf_phase_s=phase,
            calls=len(calls),
            emitted=emitted,
            residuals=residuals,
            elements_per_s=emitted / phase,
            residuals_per_s=residuals / phase,
        )
    return row


def _interp(samples: list[tuple[float, float]], t: float) -> float:
    """Cumulative tree CPU at wall time ``t`` (linear between samples)."""
    if not samples:
        return float("nan")
    if t <= samples[0][0]:
        return samples[0][1]
    for (t0, c0), (t1, c1) in zip(samples, samples[1:]):
        if t0 <= t <= t1:
            return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c1
    return samples[-1][1]


def _print_poll(rows: list[dict], wait_s: float) -> None:
    print(f"\n(a) polling SDF, wait_s={wait_s:g}, 1 s resume delays")
    head = (
        f"{'system':<19}{'wall s':>7}{'CPU s':>7}{'CPU/wall':>9}{'tree CPU s':>11}{'polls':>7}"
        f"{'wait s':>8}{'wait CPU s':>11}{'wait CPU/wall':>14}  wait CPU s: driver/jvm/pyworkers"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        if r.get("failed"):
            print(f"{r['system']:<19}  FAILED")
            continue
        print(
            f"{r['system']:<19}{r['wall']:>7.1f}{r['cpu']:>7.2f}{r['cpu_per_wall']:>9.3f}"
            f"{r['sampled_cpu']:>11.2f}{r['polls']:>7}{r['wait_phase_s']:>8.1f}"
            f"{r['wait_cpu']:>11.2f}{r['wait_cpu_per_wall']:>14.3f}  "
            + "/".join(f"{r['wait_cpu_' + c]:.2f}" for c in CATEGORIES)
        )


def _print_offsets(rows: list[dict], elements: int, every: int) -> None:
    print(f"\n(b) offset SDF, {elements:,} elements, defer_remainder() every {every:,}")
    head = (
        f"{'system':<19}{'wall s':>8}{'SDF phase s':>13}{'calls':>8}{'residuals':>11}"
        f"{'elements/s':>13}{'residuals/s':>13}  counts"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        if r.get("failed"):
            print(f"{r['system']:<19}  FAILED")
            continue
        print(
            f"{r['system']:<19}{r['wall']:>8.1f}{r['sdf_phase_s']:>13.2f}{r['calls']:>8}"
            f"{r['residuals']:>11}{r['elements_per_s']:>13,.0f}{r['residuals_per_s']:>13,.1f}"
            f"  {r['counts']}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="poll,offsets")
    parser.add_argument("--systems", default=None, help="Default: all of each workload.")
    parser.add_argument("--master", default="local[2]", help="Default: %(default)s")
    parser.add_argument("--wait_s", type=float, default=20.0, help="Default: %(default)s")
    parser.add_argument("--elements", type=int, default=1_000_000, help="Default: %(default)s")
    parser.add_argument("--every", type=int, default=1000, help="Default: %(default)s")
    parser.add_argument("--sample_s", type=float, default=0.25, help="Default: %(default)s")
    parser.add_argument("--json", default=None, help="Also write all rows to this file.")
    # Internal: the child process.
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child_system", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--call_log", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args)
        return 0

    ok = True
    report: dict[str, list[dict]] = {}
    subreaper = become_subreaper()
    print(
        "whole-run CPU: RUSAGE_CHILDREN "
        + (
            "(this process is a child subreaper: orphaned descendants such as the Spark "
            "JVM are reaped here, so their CPU is included)"
            if subreaper
            else "(WARNING: could not become a child subreaper; the Spark JVM's CPU is "
            "missing from it -- use the sampled tree CPU)"
        )
    )
    print(f"load average before: {os.getloadavg()[0]:.2f}, cores: {os.cpu_count()}")
    with tempfile.TemporaryDirectory(prefix="sparkbeam-bench-sdf-") as tmp:
        for workload in args.workloads.split(","):
            systems = POLL_SYSTEMS if workload == "poll" else OFFSET_SYSTEMS
            if args.systems:
                # sparkbeam-budget0 runs offsets only on request (one Spark job per round).
                allowed = (
                    POLL_SYSTEMS if workload == "poll" else (*OFFSET_SYSTEMS, "sparkbeam-budget0")
                )
                systems = tuple(s for s in args.systems.split(",") if s in allowed)
            rows = []
            for system in systems:
                print(f"running {workload} on {system} ...", flush=True)
                rows.append(_run_child(workload, system, args, tmp))
            report[workload] = rows
            if workload == "poll":
                _print_poll(rows, args.wait_s)
                for r in rows:
                    if not r.get("failed") and r["counts"] != {"done": 1}:
                        print(f"  MISMATCH {r['system']}: {r['counts']}")
                        ok = False
            else:
                _print_offsets(rows, args.elements, args.every)
                half = args.elements // 2
                want = {"a": half, "b": args.elements - half}
                for r in rows:
                    if not r.get("failed") and r["counts"] != want:
                        print(f"  MISMATCH {r['system']}: {r['counts']} != {want}")
                        ok = False
            ok = ok and not any(r.get("failed") for r in rows)
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""What ``soak.py`` concludes from a soak: the exact check of its output, the growth fits,
the store's bound, the round times, and the summary against issue 43's goals.

The goals are stated for an hour: after the first 5 minutes the driver grows at most 5 MB/h
and the process tree at most 50 MB/h (a least-squares line through the samples of each driver
run, from 5 minutes after the run started; a restarted driver starts again from nothing), the
store stays within 1.5x its size at minute 10, and the round p50 of the last 10 minutes is at
most 1.1x that of minutes 5-15. A shorter soak scales those times by its length over an hour,
and says so.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path

HOUR_S = 3600.0
DRIVER_MB_PER_H, TREE_MB_PER_H, STORE_RATIO, ROUND_RATIO = 5.0, 50.0, 1.5, 1.1
# A growth goal is judged on runs fitted over at least this long after their warm-up: a
# shorter fit extrapolates a 1 MB step or the JVM's start-up to an hour (a 3-minute soak
# "grew" GB/h). Shorter runs' fits are printed, their goal says n/a.
MIN_FIT_S = 600.0


def read_output(out_dir: str) -> tuple[Counter, Counter, dict]:
    """The sink's lines: counts per (key, window start), lines per (key, window, pane), and
    the side-input payloads each (key, window, pane) read (None: no side input)."""
    counts: Counter = Counter()
    panes: Counter = Counter()
    sides: dict = {}
    for path in Path(out_dir).glob("out-*"):
        for line in path.read_text().splitlines():
            key, start, n, pane, side = line.split()
            counts[(key, int(start))] += int(n)
            panes[(key, int(start), int(pane))] += 1
            sides[(key, int(start), int(pane))] = None if side == "-" else int(side)
    return counts, panes, sides


def owed(out_dir: str, expected: Counter) -> int:
    """(key, window) counts the output does not have exactly yet."""
    got = read_output(out_dir)[0]
    return sum(1 for k in expected.keys() | got.keys() if got[k] != expected[k])


def check(out_dir: str, expected: Counter, window_s: int, side_start: int | None) -> dict:
    """Every acknowledged record counted once in its key's window, no pane written twice;
    with a side input, every pane read its window's payloads whole (one per second from
    ``side_start``)."""
    got, panes, sides = read_output(out_dir)
    keys = expected.keys() | got.keys()
    missing = sorted(k for k in keys if k not in got)
    extra = sorted(k for k in keys if k not in expected)
    wrong = sorted(k for k in keys if k in got and k in expected and got[k] != expected[k])
    twice = sorted(k for k, n in panes.items() if n > 1)
    bad_side = []
    if side_start is not None:
        for (key, start, pane), seen in sides.items():
            whole = sum(1 for t in range(start, start + window_s) if t >= side_start)
            if seen != whole:
                bad_side.append((key, start, pane, seen, whole))
    return {
        "ok": bool(expected) and not (missing or extra or wrong or twice or bad_side),
        "windows": len(expected), "records": sum(expected.values()),
        "lines": sum(panes.values()), "late_panes": sum(1 for k in panes if k[2] > 0),
        "missing": len(missing), "extra": len(extra), "wrong": len(wrong), "twice": len(twice),
        "bad_side": len(bad_side),
        "first_problems": [list(x) for x in (missing + extra + wrong + twice + bad_side)[:5]],
        "last_window_complete": _last_complete(got, expected),
    }  # fmt: skip


def _last_complete(got: Counter, expected: Counter) -> int | None:
    """The newest window start up to which every (key, window) is exact."""
    by_window: dict[int, bool] = {}
    for k in expected.keys() | got.keys():
        by_window[k[1]] = by_window.get(k[1], True) and got[k] == expected[k]
    last = None
    for start in sorted(by_window):
        if not by_window[start]:
            break
        last = start
    return last


def read_rounds(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def slope_per_h(points: list[tuple[float, float]]) -> float | None:
    """The least-squares slope of (seconds, MB) points, in MB per hour (None: < 3 points)."""
    if len(points) < 3:
        return None
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in points) / sxx * HOUR_S


def p50(values: list[float]) -> float | None:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else None


def windows(seconds: float) -> dict:
    """The goals' times (5, 10, 5-15 and the last 10 minutes of an hour) scaled to the run."""
    scale = seconds / HOUR_S
    return {
        "scale": scale, "warm_s": 300 * scale, "store_ref_s": 600 * scale,
        "early": (300 * scale, 900 * scale), "late": (seconds - 600 * scale, seconds),
    }  # fmt: skip


def analyse(args, soak, producer, produced_s: float, rounds: list[dict]) -> dict:
    """The result of one soak (``soak.Soak`` after its run) as plain data."""
    seconds = args.minutes * 60
    w = windows(seconds)
    side_start = soak.side_start if args.side_input_kb else None
    exact = check(soak.out, producer.expected, args.window_s, side_start)
    samples = soak.samples
    growth = []
    for run in soak.runs:
        mine = [
            s for s in samples
            if s["run"] == run["run"] and s["t"] >= run["start"] + w["warm_s"]
            and s["driver_mb"] is not None
        ]  # fmt: skip
        growth.append(
            {
                "run": run["run"],
                "driver_mb_per_h": slope_per_h([(s["t"], s["driver_mb"]) for s in mine]),
                "tree_mb_per_h": slope_per_h([(s["t"], s["tree_mb"]) for s in mine]),
                "jvm_mb_per_h": slope_per_h(
                    [(s["t"], s["jvm_mb"]) for s in mine if s.get("jvm_mb") is not None]
                ),
                "samples": len(mine),
                "span_s": mine[-1]["t"] - mine[0]["t"] if mine else 0.0,
            }
        )
    # The store's reference: minute 10 (scaled), and not before the job has run for the
    # warm-up and two windows with their lateness (its state's working set).
    first_round = min((r["started"] - soak.t0 for r in rounds), default=0.0)
    settle = max(w["warm_s"], 2 * (args.window_s + args.lateness_s))
    w["store_ref_s"] = max(w["store_ref_s"], first_round + settle)
    for run in soak.runs:
        end = soak.t0 + run.get("end", float("inf"))
        run["rounds"] = sum(1 for r in rounds if soak.t0 + run["start"] <= r["started"] < end)
    after_ref = [s for s in samples if s["t"] >= w["store_ref_s"]]
    ref = after_ref[0]["store_mb"] if after_ref else None
    peak = max((s["store_mb"] for s in after_ref), default=None)
    # The store is a sawtooth (range snapshots written, older files swept): its envelope in
    # minutes 5-15 against the highest it reaches after them says whether it grows.
    early_peak = max(
        (s["store_mb"] for s in samples if w["early"][0] <= s["t"] < w["early"][1]), default=None
    )
    late_peak = max((s["store_mb"] for s in samples if s["t"] >= w["early"][1]), default=None)
    t0 = soak.t0
    job = [(r["started"] - t0, r["job_s"] + r["commit_s"]) for r in rounds]
    early = p50([d for t, d in job if w["early"][0] <= t < w["early"][1]])
    late = p50([d for t, d in job if w["late"][0] <= t < w["late"][1]])
    tails = [(s["t"], s["tail_read_s"]) for s in samples if s.get("tail_read_s") is not None]
    tail_early = p50([d for t, d in tails if w["early"][0] <= t < w["early"][1]])
    tail_late = p50([d for t, d in tails if w["late"][0] <= t < w["late"][1]])
    producing = [s for s in samples if s["t"] <= produced_s and s["output_lag_s"] is not None]
    lags = [s["output_lag_s"] for s in producing]
    judged = [g for g in growth if g["span_s"] >= MIN_FIT_S]
    worst = lambda key: max((g[key] for g in judged if g[key] is not None), default=None)  # noqa: E731
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "load_after": os.getloadavg()[0],
        "config": {k: v for k, v in vars(args).items() if k not in ("result", "keep")},
        "windows": w, "runs": soak.runs, "produced_s": produced_s, "failure": soak.failure,
        "producer": {
            "sent": producer.sent, "acknowledged": sum(producer.expected.values()),
            "failed": producer.failed, "unacknowledged": producer.unacked,
            "errors": dict(producer.errors),
        },
        "exact": exact, "growth": growth,
        "store": {"ref_mb": ref, "peak_after_mb": peak, "early_peak_mb": early_peak,
                  "later_peak_mb": late_peak, "final_mb": samples[-1]["store_mb"],
                  "final_files": samples[-1]["store_files"]},
        "rounds": {"count": len(job), "p50_s": p50([d for _, d in job]), "early_p50_s": early,
                   "late_p50_s": late,
                   "tail_read_early_p50_s": tail_early, "tail_read_late_p50_s": tail_late,
                   "tail_reads_failed": sum(1 for s in samples if s.get("tail_read_s") is None),
                   "each": [[round(t, 1), round(d, 3)] for t, d in job]},
        "lag": {"p50_s": p50(lags), "max_s": max(lags, default=None),
                "at_end_s": lags[-1] if lags else None,
                "complete_at_stop_s": _complete_lag(soak, produced_s, args.window_s)},
        "samples": samples,
    }  # fmt: skip
    result["goals"] = {
        "driver_mb_per_h": _goal(worst("driver_mb_per_h"), DRIVER_MB_PER_H),
        "tree_mb_per_h": _goal(worst("tree_mb_per_h"), TREE_MB_PER_H),
        "store_ratio": _goal(peak / ref if ref else None, STORE_RATIO),
        "round_ratio": _goal(late / early if early and late else None, ROUND_RATIO),
    }
    return result


def _complete_lag(soak, produced_s: float, window_s: int) -> float | None:
    """When the producer stopped: how long before then the last window ended up to which the
    output was exact (None: no window was)."""
    last = soak.at_stop.get("last_window_complete")
    return None if last is None else soak.t0 + produced_s - (last + window_s)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _goal(value: float | None, bound: float) -> dict:
    return {"value": value, "bound": bound, "ok": value is not None and value <= bound}


def _f(value, fmt: str = ".1f") -> str:
    return "-" if value is None else format(value, fmt)


def summary(r: dict) -> str:
    """The soak's account: what ran, exactness, each goal (PASS/MISS), and a RESULTS.md row."""
    c, w, e, g = r["config"], r["windows"], r["exact"], r["goals"]
    lines = [
        f"soak: {c['minutes']:g} min at {c['rate']:g} records/s, {c['partitions']} partitions, "
        f"{c['keys']} keys, {c['window_s']} s windows (lateness {c['lateness_s']} s), side "
        f"input {c['side_input_kb']} KB/s; load average {r['load_after']:.1f} at the end",
    ]
    if w["scale"] < 1:
        lines.append(
            f"goal windows scaled to this run (x{w['scale']:.3g} of an hour): warm-up "
            f"{w['warm_s']:.0f} s, store reference at {w['store_ref_s']:.0f} s (not before the "
            f"first round + 2 windows with lateness), early rounds "
            f"{w['early'][0]:.0f}-{w['early'][1]:.0f} s, late rounds {w['late'][0]:.0f}-"
            f"{w['late'][1]:.0f} s"
        )
    if r["failure"]:
        lines.append(f"FAILED: {r['failure']}")
    for run in r["runs"]:
        lines.append(
            f"run {run['run']}: parallelism {run['parallelism']}, {run['start']:.0f}-"
            f"{_f(run.get('end'), '.0f')} s, {run['rounds']} rounds, ended by {run.get('how')} "
            f"(exit {run.get('returncode')}), {run.get('left_behind')} process(es) left behind"
        )
    p = r["producer"]
    lines.append(
        f"produced: {p['acknowledged']:,} records acknowledged of {p['sent']:,} sent, "
        f"{p['failed']} failed, {p['unacknowledged']} unacknowledged"
    )
    lines.append(
        f"exact: {'yes' if e['ok'] else 'NO'} -- {e['windows']:,} (key, window) counts of "
        f"{e['records']:,} records in {e['lines']:,} lines ({e['late_panes']} late panes); "
        f"missing {e['missing']}, wrong {e['wrong']}, extra {e['extra']}, panes twice "
        f"{e['twice']}, side windows not whole {e['bad_side']}; complete up to the window at "
        f"{e['last_window_complete']}" + (f"; e.g. {e['first_problems']}" if not e["ok"] else "")
    )
    fits = ", ".join(
        f"run {x['run']} {_f(x['driver_mb_per_h'], '+.1f')}/{_f(x['tree_mb_per_h'], '+.1f')} "
        f"(JVM {_f(x.get('jvm_mb_per_h'), '+.1f')}; {x['samples']})"
        for x in r["growth"]
    )
    lines.append(f"growth after warm-up, driver/tree MB per hour (samples): {fits}")
    if not any(x.get("span_s", 0.0) >= MIN_FIT_S for x in r["growth"]):
        lines.append(
            f"growth goals n/a: no run was fitted over {MIN_FIT_S / 60:.0f} minutes after its "
            "warm-up (a shorter fit extrapolates start-up to an hour)"
        )
    s, rd, lag = r["store"], r["rounds"], r["lag"]
    lines += [
        _goal_line("driver grows <= 5 MB/h (worst run)", g["driver_mb_per_h"], "+.1f"),
        _goal_line("process tree grows <= 50 MB/h (worst run)", g["tree_mb_per_h"], "+.1f"),
        _goal_line(
            f"store <= 1.5x its size at the reference ({_f(s['ref_mb'])} MB; peak after "
            f"{_f(s['peak_after_mb'])} MB, final {_f(s['final_mb'])} MB in "
            f"{s['final_files']} files)",
            g["store_ratio"],
            ".2f",
        ),
        _goal_line(
            f"late round p50 <= 1.1x early ({_f(rd['early_p50_s'], '.3f')} s -> "
            f"{_f(rd['late_p50_s'], '.3f')} s; {rd['count']} rounds, p50 "
            f"{_f(rd['p50_s'], '.3f')} s)",
            g["round_ratio"],
            ".2f",
        ),
        f"store envelope: highest after minute 15 scaled / highest in minutes 5-15 scaled: "
        f"{_f(s.get('later_peak_mb'))} / {_f(s.get('early_peak_mb'))} MB = "
        f"{_f(_ratio(s.get('later_peak_mb'), s.get('early_peak_mb')), '.2f')}",
        f"a bare consumer's read of partition 0's newest 1,000 records, p50 early -> late: "
        f"{_f(rd.get('tail_read_early_p50_s'), '.3f')} s -> "
        f"{_f(rd.get('tail_read_late_p50_s'), '.3f')} s (the broker's share of a creep; "
        f"{rd.get('tail_reads_failed', 0)} reads got nothing within 10 s)",
        f"output lag (clock - newest window with output): p50 {_f(lag['p50_s'])} s, max "
        f"{_f(lag['max_s'])} s, when the producer stopped {_f(lag['at_end_s'])} s; then exact "
        f"up to a window that ended {_f(lag['complete_at_stop_s'])} s before",
        "",
        "| date | minutes | records/s | side KB/s | exact | driver MB/h | tree MB/h | "
        "store ratio | round p50 early -> late | load |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| {r['date']} | {c['minutes']:g} | {c['rate']:g} | {c['side_input_kb']} | "
        f"{'yes' if e['ok'] else 'no'} | {_f(g['driver_mb_per_h']['value'], '+.1f')} | "
        f"{_f(g['tree_mb_per_h']['value'], '+.1f')} | {_f(g['store_ratio']['value'], '.2f')} | "
        f"{_f(rd['early_p50_s'], '.2f')} -> {_f(rd['late_p50_s'], '.2f')} s | "
        f"{r['load_after']:.1f} |",
    ]
    return "\n".join(lines)


def _goal_line(what: str, goal: dict, fmt: str) -> str:
    verdict = "PASS" if goal["ok"] else ("n/a" if goal["value"] is None else "MISS")
    return f"goal: {what}: {_f(goal['value'], fmt)} {verdict}"

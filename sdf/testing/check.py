"""``check_sdf``: test a splittable DoFn's self-checkpointing locally, on the real runner.

Owns: the scenarios, their comparison and the report. A check runs, in order:

1. ``static``: restriction / watermark-state coder round trips, sizes and ``try_split``
   coverage (``sparkbeam.sdf.testing.static``), no Spark;
2. ``baseline``: ``Create(elements) | ParDo(dofn)`` on SparkCheckpointRunner;
3. ``checkpoint-every-claim``: the same with a real ``defer_remainder()`` forced after every
   successful claim (residuals re-fed by the runner);
4. ``kill-and-resume``: 3. in a child process with ``--checkpoint_dir``, SIGKILLed once a
   committed checkpoint holds pending residuals, then rerun;
5. ``resume-other-parallelism``: the same kill point, rerun at another ``--parallelism``;
6. ``runner-initiated-splits``: the runner asks every running bundle to split
   (``--sdf_split_after_s``) at seeded random fractions, while the probe paces its claims so
   the requests land mid-element; at least one split must take effect;
7. ``virtual-clock`` (on request): the elements come from a ``TestStream`` in streaming mode
   and every claim defers the remainder by an hour, resumed on the TestStream's virtual
   clock: hours of resume delays take seconds.

Every run must give the baseline's multiset of outputs (compared by ``repr``). Scenarios 4 and
5 need the DoFn in the child process: pass a ``"module:attr"`` string, or an object whose class
is importable. Leaves to others: running pipelines (``run``) and static checks (``static``).
"""

from __future__ import annotations

import collections
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkbeam.sdf.testing import run as testing_run
from sparkbeam.sdf.testing.run import Event, load_dofn
from sparkbeam.sdf.testing.static import check_static

SCENARIOS = (
    "static",
    "baseline",
    "checkpoint-every-claim",
    "kill-and-resume",
    "resume-other-parallelism",
    "runner-initiated-splits",
    "virtual-clock",
)
DEFAULT_SCENARIOS = SCENARIOS[:-1]  # virtual-clock on request: one round per claim
SPLIT_AFTER_S = 0.1  # runner-initiated splits: first request this long into a bundle
SPLIT_PACE_S = 0.05  # ... and the probe sleeps this long after each claim
RESUME_DELAY_S = 0.5  # deferral delay in the child runs: leaves time to kill between rounds
VIRTUAL_DELAY_S = 3600.0  # deferral delay under a TestStream's virtual clock


class SdfCheckError(AssertionError):
    """A splittable DoFn failed ``check_sdf``; the message lists each failed scenario."""

    def __init__(self, message: str, report: SdfCheckReport) -> None:
        super().__init__(message)
        self.report = report


@dataclass
class ScenarioResult:
    """One row of the report."""

    name: str
    outputs: int | None = None
    residuals: int | None = None
    splits: int | None = None
    passed: bool | None = None  # None: skipped
    message: str = ""
    seconds: float = 0.0

    @property
    def status(self) -> str:
        return "SKIP" if self.passed is None else ("PASS" if self.passed else "FAIL")


@dataclass
class SdfCheckReport:
    """The scenario rows of one ``check_sdf`` call."""

    dofn: str
    scenarios: list[ScenarioResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(s.passed is not False for s in self.scenarios)

    def failures(self) -> list[ScenarioResult]:
        return [s for s in self.scenarios if s.passed is False]

    def table(self) -> str:
        def cell(v):
            return "-" if v is None else str(v)

        rows = [("scenario", "outputs", "residuals", "splits", "result", "seconds")]
        rows += [
            (s.name, *map(cell, (s.outputs, s.residuals, s.splits)), s.status, f"{s.seconds:.1f}")
            for s in self.scenarios
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        for s in self.scenarios:
            if s.message and s.passed is not True:
                lines.append(f"{s.name}: {s.message}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return f"check_sdf({self.dofn}):\n{self.table()}"


def check_sdf(
    dofn: Any,
    elements: Iterable[Any],
    *,
    seed: int = 0,
    parallelism: tuple[int, int] = (2, 3),
    spark_master: str = "local[2]",
    timeout_s: float = 600.0,
    scenarios: Sequence[str] | None = None,
    raise_on_failure: bool = True,
) -> SdfCheckReport:
    """Check a splittable DoFn (object or ``"module:attr"``) on ``elements``; returns the report.

    ``scenarios`` selects a subset of ``SCENARIOS`` (default: all but ``virtual-clock``). A
    failed scenario raises ``SdfCheckError`` (an AssertionError) naming each fault, unless
    ``raise_on_failure`` is false. ``seed`` picks the random split fraction, the element order
    of the checkpointing runs and the kill round.
    """
    dofn_ref, fn = dofn, load_dofn(dofn)
    elements = list(elements)
    wanted = list(scenarios or DEFAULT_SCENARIOS)
    unknown = sorted(set(wanted) - set(SCENARIOS))
    if unknown:
        raise ValueError(f"unknown scenario(s) {unknown!r}; choose from {SCENARIOS!r}.")
    report = SdfCheckReport(dofn if isinstance(dofn, str) else type(fn).__name__)
    rng = random.Random(seed)
    shuffled = rng.sample(elements, len(elements))
    ctx = _Context(fn, dofn_ref, elements, shuffled, parallelism, spark_master, timeout_s, rng)

    if "static" in wanted:
        report.scenarios.append(_timed(ctx.static))
    dynamic = [s for s in wanted if s != "static"]
    if dynamic:
        with tempfile.TemporaryDirectory(prefix="sdf-check-") as tmp:
            ctx.tmp = tmp
            for name in dynamic:
                report.scenarios.append(_timed(getattr(ctx, name.replace("-", "_"))))
    if raise_on_failure and not report.passed:
        raise SdfCheckError(_failure_message(report), report)
    return report


def _timed(fn) -> ScenarioResult:
    start = time.monotonic()
    result = fn()
    result.seconds = time.monotonic() - start
    return result


def _failure_message(report: SdfCheckReport) -> str:
    faults = [f"- {s.name}: {s.message}" for s in report.failures()]
    return "\n".join([f"check_sdf({report.dofn}) failed:", *faults, report.table()])


class _Context:
    """The inputs shared by the scenario methods (one per scenario name)."""

    def __init__(self, fn, ref, elements, shuffled, parallelism, master, timeout_s, rng):
        self.fn, self.ref = fn, ref
        self.elements, self.shuffled = elements, shuffled
        self.parallelism, self.master, self.timeout_s = parallelism, master, timeout_s
        self.rng = rng
        self.tmp = ""
        self.baseline_events: list[Event] | None = None
        self.max_positions = 0
        self._killed: tuple[str, int] | Exception | None = None  # (store, round) or the error

    def static(self) -> ScenarioResult:
        result = check_static(self.fn, self.elements, seed=self.rng.randrange(1 << 30))
        self.max_positions = result.max_positions
        message = " ".join(result.problems[:5])
        if len(result.problems) > 5:
            message += f" (+{len(result.problems) - 5} more)"
        if not result.problems and result.notes:
            message = "; ".join(result.notes)
        return ScenarioResult(
            "static",
            splits=result.splits_checked,
            passed=not result.problems,
            message=message,
        )

    def _dir(self, name: str) -> str:
        path = os.path.join(self.tmp, name)
        os.makedirs(path, exist_ok=True)
        return path

    def _flags(self, parallelism: int, *extra: str) -> list[str]:
        return testing_run.pipeline_flags(self.master, parallelism, *extra)

    def _baseline(self) -> list[Event]:
        if self.baseline_events is None:
            self.baseline_events = testing_run.run_in_process(
                self.fn, self.elements, self._dir("baseline"), self._flags(self.parallelism[0])
            )[0]
        return self.baseline_events

    def _compare(self, name: str, run) -> ScenarioResult:
        try:
            events = run()
            expected = self._baseline()
        except Exception as e:  # noqa: BLE001 - a failed run is a failed scenario
            return ScenarioResult(name, passed=False, message=_short_error(e))
        kinds = collections.Counter(e.kind for e in events)
        message = diff_outputs(expected, events)
        return ScenarioResult(
            name, kinds["out"], kinds["residual"], splits=0, passed=not message, message=message
        )

    def baseline(self) -> ScenarioResult:
        try:
            direct = testing_run.run_direct(self.fn, self.elements)
        except Exception:  # noqa: BLE001 - no direct reference then
            direct = None
        result = self._compare("baseline", self._baseline)
        if result.passed and direct is not None:
            # The runner's baseline against process() called directly (no coders, no runner).
            diff = diff_outputs(direct, self._baseline())
            if diff:
                result.passed = False
                result.message = f"differs from calling process() directly: {diff}"
        if result.passed and not result.outputs:
            result.message = "the DoFn produced no output: the other scenarios compare nothing"
        return result

    def _in_process(self, name: str, *extra: str, **probe) -> tuple[ScenarioResult, list[int]]:
        """Scenario ``name``: the shuffled elements run here with flags ``extra`` and the
        probe's ``probe`` options, compared with the baseline; and the run's runner_splits
        counter (none if the run failed)."""
        flags = self._flags(self.parallelism[0], *extra)
        counted: list[int] = []

        def run():
            events, splits = testing_run.run_in_process(
                self.fn, self.shuffled, self._dir(name), flags, **probe
            )
            counted.append(splits)
            return events

        return self._compare(name, run), counted

    def checkpoint_every_claim(self) -> ScenarioResult:
        return self._in_process("checkpoint-every-claim", force_checkpoint=True)[0]

    def _kill_once(self) -> tuple[str, int]:
        """Run the child until the kill point once and keep a copy of its store."""
        if self._killed is None:
            testing_run.write_spec(self._spec(), self.ref, self.shuffled, True, RESUME_DELAY_S)
            kill_round = 1 + self.rng.randrange(max(1, min(self.max_positions, 6) - 2))
            flags = self._flags(self.parallelism[0], "--residual_budget_s=0")
            try:
                at = testing_run.run_until_killed(
                    self._spec(), self._store(), self._dir("out"), flags, kill_round, self.timeout_s
                )
                testing_run.reset_dir(self._store(), self._store() + "-at-kill")
                self._killed = (self._store() + "-at-kill", at)
            except Exception as e:  # noqa: BLE001 - reported by every resume scenario
                self._killed = e
        if isinstance(self._killed, Exception):
            raise self._killed
        return self._killed

    def _spec(self) -> str:
        return os.path.join(self.tmp, "spec.pkl")

    def _store(self) -> str:
        return os.path.join(self.tmp, "store")

    def _resume(self, name: str, parallelism: int) -> ScenarioResult:
        def run():
            # The same command as the killed run, on the store as it was at the kill.
            at_kill, _ = self._kill_once()
            testing_run.reset_dir(at_kill, self._store())
            shutil.rmtree(self._dir("out"))
            flags = self._flags(parallelism, "--residual_budget_s=0")
            return testing_run.rerun(
                self._spec(), self._store(), self._dir("out"), flags, self.timeout_s
            )

        result = self._compare(name, run)
        if isinstance(self._killed, tuple):
            result.message = (result.message + " " if result.message else "") + (
                f"(killed after round {self._killed[1]}, rerun at parallelism {parallelism})"
            )
        return result

    def kill_and_resume(self) -> ScenarioResult:
        return self._resume("kill-and-resume", self.parallelism[0])

    def resume_other_parallelism(self) -> ScenarioResult:
        return self._resume("resume-other-parallelism", self.parallelism[1])

    def virtual_clock(self) -> ScenarioResult:
        started = time.monotonic()
        result, _ = self._in_process(
            "virtual-clock", "--streaming", "--residual_budget_s=0",
            force_checkpoint=True, delay_s=VIRTUAL_DELAY_S, test_stream=True,
        )  # fmt: skip
        if result.passed and result.residuals:
            hours = result.residuals * VIRTUAL_DELAY_S / 3600
            took = time.monotonic() - started
            result.message = f"{hours:.0f} h of resume delays in {took:.0f} s"
        return result

    def runner_initiated_splits(self) -> ScenarioResult:
        fractions = ",".join(f"{self.rng.uniform(0.1, 0.9):.2f}" for _ in range(3))
        extra = (f"--sdf_split_after_s={SPLIT_AFTER_S}", f"--sdf_split_fractions={fractions}")
        result, counted = self._in_process("runner-initiated-splits", *extra, pace_s=SPLIT_PACE_S)
        result.splits = counted[0] if counted else None
        if result.passed is False and result.outputs is not None:
            result.message = f"{_split_fault(result.message)} on runner-initiated split: " + (
                result.message
            )
        elif result.passed and not result.splits:
            result.passed = False
            result.message = "no runner-initiated split took effect (try_split always None?)"
        if result.message:
            result.message += f" (fractions kept: {fractions})"
        return result


def _split_fault(diff: str) -> str:
    """'lost position', 'duplicated position' or both, from a ``diff_outputs`` message."""
    faults = [n for n, m in (("lost", "(lost)"), ("duplicated", "duplicated or")) if m in diff]
    return " and ".join(faults or ["wrong"]) + " position"


def _short_error(e: Exception) -> str:
    """The line naming the fault of a (possibly remote) error, not the whole traceback."""
    text = f"{type(e).__name__}: {e}"
    for line in text.splitlines():
        if "SplitCheckError:" in line:
            return line.strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return " | ".join(lines[:3]) + (" | ..." if len(lines) > 3 else "")


def diff_outputs(expected: list[Event], actual: list[Event], limit: int = 3) -> str:
    """'' when the output multisets are equal, else the first missing / duplicated outputs."""
    want = collections.Counter(e.value for e in expected if e.kind == "out")
    got = collections.Counter(e.value for e in actual if e.kind == "out")
    if want == got:
        return ""
    origin_exp = {e.value: e for e in expected if e.kind == "out"}
    origin_act: dict[str, list[Event]] = collections.defaultdict(list)
    for e in actual:
        if e.kind == "out":
            origin_act[e.value].append(e)
    parts = []
    if missing := want - got:
        shown = []
        for value in list(missing)[:limit]:
            src = origin_exp[value]
            at = f", position {src.position}" if src.position else ""
            shown.append(f"{value} (from element {src.element}, restriction {src.restriction}{at})")
        parts.append(f"{missing.total()} output(s) missing (lost), first: " + "; ".join(shown))
    if extra := got - want:
        shown = []
        for value in list(extra)[:limit]:
            srcs = ", ".join(
                f"restriction {s.restriction} position {s.position}" for s in origin_act[value][:3]
            )
            shown.append(f"{value} x{got[value]} (from {srcs})")
        first = "; ".join(shown)
        parts.append(f"{extra.total()} output(s) duplicated or unexpected, first: {first}")
    return ". ".join(parts) + "."

"""What a round feeds back: the residuals whose timers are due, and the wait until they are.

Each SDF stage's residuals have one `Keeper`:

- `TaskResiduals` (a run with a store): the stage's tasks keep them in their key groups and
  feed those due themselves (``runner.task.residual_state``); the driver holds only the sums
  of what they last reported (count, earliest timer, hold), recorded in each checkpoint's
  metadata, so a restore reads no residual.
- `DriverResiduals` (batch without a store): in the driver's memory; the round parallelizes
  the due ones.

Leaves to others: running the round (the loops) and the tasks' side.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

from sparkbeam.checkpoint import state_layout
from sparkbeam.sdf import MemoryResiduals, StateAndTimerBundleCheckpointHandler


class Due(NamedTuple):
    """A stage's residuals due this round: its tasks feed those due by ``clock_ms``, or the
    driver feeds ``rows`` ((data-input transform, element); a run without a store)."""

    clock_ms: float
    rows: tuple[tuple[str, bytes], ...] = ()


class Keeper(Protocol):
    """One SDF stage's pending residuals, as the round loop sees them."""

    @property
    def fired(self) -> int: ...

    def pending(self) -> int: ...

    def next_fire_ms(self) -> float | None: ...

    def watermark_hold_micros(self) -> int | None: ...

    def take_due(self, clock_ms: float) -> Due | None:
        """This round's due residuals (None: none due by ``clock_ms``)."""
        ...

    def absorb(self, ledger: Any) -> None:
        """What the round's tasks returned or reported of the stage's residuals."""
        ...

    def summary(self) -> dict | None:
        """What a checkpoint records of them (None: nothing, the run has no store)."""
        ...


class TaskResiduals:
    """The driver's view of residuals the stage's tasks keep: the sums of their reports."""

    def __init__(self, stage: str, summary: Mapping[str, Any] | None = None) -> None:
        summary = summary or {}
        self.stage = stage
        self.count = int(summary.get("pending", 0))
        self.next_ms: float | None = summary.get("next_fire_ms")
        self.hold: int | None = summary.get("hold_micros")
        self.fired = 0

    @classmethod
    def restored(cls, stage: str, metadata, state) -> TaskResiduals:
        """From a restored checkpoint's metadata; a checkpoint that recorded no summary of
        the stage (another batch stage's round) is read once."""
        summary = metadata.residuals.get(stage) if metadata.residuals is not None else None
        if summary is not None:
            return cls(stage, summary)
        values = state.read_task_owned(state_layout.sdf_residual(stage)).values()
        timers = [state_layout.residual_timer(v) for v in values]
        return cls(
            stage,
            {
                "pending": len(timers),
                "next_fire_ms": min((f for f, _ in timers), default=None),
                "hold_micros": min((h for _, h in timers), default=None),
            },
        )

    def pending(self) -> int:
        return self.count

    def next_fire_ms(self) -> float | None:
        return self.next_ms if self.count else None

    def watermark_hold_micros(self) -> int | None:
        return self.hold if self.count else None

    def take_due(self, clock_ms: float) -> Due | None:
        due = self.count and self.next_ms is not None and self.next_ms <= clock_ms
        return Due(clock_ms) if due else None

    def absorb(self, ledger) -> None:
        """A round that ran the stage ran every subtask: their reports are all its residuals."""
        if ledger.residuals.get(self.stage):
            raise RuntimeError(
                f"Stage {self.stage} returned residuals to the driver, but its tasks keep them; "
                "this is a sparkbeam bug, please report it."
            )
        reports = ledger.residual_reports.get(self.stage)
        if not reports:
            return  # the stage did not run this round: nothing changed
        self.count = sum(r.pending for r in reports)
        self.next_ms = min((r.next_fire_ms for r in reports if r.pending), default=None)
        self.hold = min((r.hold_micros for r in reports if r.pending), default=None)
        self.fired += sum(r.fired for r in reports)

    def summary(self) -> dict:
        return {"pending": self.count, "next_fire_ms": self.next_ms, "hold_micros": self.hold}


class DriverResiduals:
    """Residuals of a batch run without a store: in the driver's memory."""

    def __init__(self, stage: str) -> None:
        self.handler = StateAndTimerBundleCheckpointHandler(MemoryResiduals(), stage)

    @property
    def fired(self) -> int:
        return self.handler.fired

    def pending(self) -> int:
        return self.handler.pending()

    def next_fire_ms(self) -> float | None:
        return self.handler.next_fire_ms()

    def watermark_hold_micros(self) -> int | None:
        return self.handler.watermark_hold_micros()

    def take_due(self, clock_ms: float) -> Due | None:
        due = self.handler.pop_due(clock_ms)
        return Due(clock_ms, tuple((d.transform, d.element) for d in due)) if due else None

    def absorb(self, ledger) -> None:
        self.handler.add(ledger.residuals.get(self.handler.stage, ()))

    def summary(self) -> None:
        return None


def keepers(stages, durable: bool, metadata, state) -> dict[str, Keeper]:
    """Stage -> the keeper of its residuals, as of a restored checkpoint's ``metadata``."""
    if durable:
        return {s: TaskResiduals.restored(s, metadata, state) for s in stages}
    return {s: DriverResiduals(s) for s in stages}


def take_due(keepers: Mapping[str, Keeper], clock_ms: float) -> dict:
    """Stage -> its ``Due`` by ``clock_ms``, or None."""
    return {s: k.take_due(clock_ms) for s, k in keepers.items()}


def pending(keepers: Mapping[str, Keeper]) -> int:
    return sum(k.pending() for k in keepers.values())


def next_fire_ms(keepers: Mapping[str, Keeper]) -> float | None:
    """The earliest residual timer of any stage, if one is set."""
    times = [k.next_fire_ms() for k in keepers.values()]
    return min((t for t in times if t is not None), default=None)


def summaries(keepers: Mapping[str, Keeper]) -> dict[str, dict] | None:
    """What a checkpoint records of every stage's residuals (None: a run without a store)."""
    out = {s: k.summary() for s, k in keepers.items()}
    if any(v is None for v in out.values()):
        return None
    return {s: v for s, v in out.items() if v is not None}

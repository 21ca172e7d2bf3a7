"""StateAndTimerBundleCheckpointHandler: residuals become keyed state + timers.

Each residual root a bundle returns is kept under a key (the encoded residual application plus
an id the state chooses: a task's state picks one in its own key groups, so the residual stays
with its task and follows its key group when parallelism changes on restore) as keyed state of
``sdf-residual/<stage>``, under a processing-time timer at ``produced + requested_time_delay``
(ms) that holds the watermark at the min of the residual's output watermarks, else the input
element's timestamp. Due residuals are handed back to the same stage and their state cleared.
Where the state lives is the caller's: a task's key-group range
(``runner.task.residual_state``), or memory (`MemoryResiduals`: a batch run without a store).
The timers (`ResidualTimerService`) are an in-memory index over the state, rebuilt from it on
restore, never the source of truth; their holds give the stage's output watermark.
"""

from __future__ import annotations

import heapq
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from sparkbeam.checkpoint import state_layout
from sparkbeam.sdf.residuals import ResidualRecord

MAX_RESIDUALS_PER_ROUND = 50_000
"""At most this many due residuals are fed back in one round (batch and streaming alike)."""


@dataclass(frozen=True)
class DueResidual:
    """A residual whose timer fired: feed ``element`` to ``transform`` of the stage."""

    key: bytes
    transform: str
    element: bytes
    fire_at_ms: int
    hold_micros: int


class ResidualState(Protocol):
    """Where one stage's pending residuals are kept: keyed state of ``sdf-residual/<stage>``."""

    def items(self) -> Iterator[tuple[bytes, bytes]]: ...

    def get(self, key: bytes) -> bytes | None: ...

    def put(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> None: ...

    def new_key(self, element: bytes) -> bytes:
        """A key no residual has had: ``element`` + 0x00 + a unique id."""
        ...


class MemoryResiduals:
    """Residuals in memory (a batch run without a store: nothing is durable)."""

    def __init__(self) -> None:
        self.values: dict[bytes, bytes] = {}

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        return iter(self.values.items())

    def get(self, key: bytes) -> bytes | None:
        return self.values.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self.values[key] = value

    def delete(self, key: bytes) -> None:
        self.values.pop(key, None)

    def new_key(self, element: bytes) -> bytes:
        return element + b"\x00" + uuid.uuid4().bytes


class StateAndTimerBundleCheckpointHandler:
    """Keeps one stage's pending residuals as keyed state, under timers."""

    def __init__(self, state: ResidualState, stage: str) -> None:
        self.state = state
        self.stage = stage
        self.namespace = state_layout.sdf_residual(stage)
        self.timers = ResidualTimerService()
        self.fired = 0

    def add(self, records: Iterable[ResidualRecord]) -> None:
        """Write each residual as state and set its timer."""
        for r in records:
            key = self.state.new_key(r.element)
            fire_at = int(r.produced_ms + r.delay_ms + 0.999)  # never earlier than asked
            value = state_layout.encode_residual(
                r.transform, r.element, fire_at, r.hold_micros, r.delay_ms
            )
            self.state.put(key, value)
            self.timers.set(key, fire_at, r.hold_micros)

    def pending(self) -> int:
        return len(self.timers)

    def next_fire_ms(self) -> int | None:
        return self.timers.next_fire_ms()

    def watermark_hold_micros(self) -> int | None:
        return self.timers.hold_micros()

    def pop_due(self, now_ms: float, limit: int = MAX_RESIDUALS_PER_ROUND) -> list[DueResidual]:
        """Residuals whose timers fired by ``now_ms``; their state and holds are cleared."""
        due = []
        for key in self.timers.pop_due(now_ms, limit):
            value = self.state.get(key)
            if value is None:
                continue
            transform, element, fire_at, hold, _ = state_layout.decode_residual(
                value, self.namespace
            )
            self.state.delete(key)
            due.append(DueResidual(key, transform, element, fire_at, hold))
        self.fired += len(due)
        return due

    def restore(self) -> int:
        """Rebuild the timers from the state (as a round or a restore finds it)."""
        entries = []
        for key, value in self.state.items():
            fire_at, hold = state_layout.residual_timer(value, self.namespace)
            entries.append((key, fire_at, hold))
        self.timers.restore(entries)
        return len(entries)


class ResidualTimerService:
    """Timers keyed by state key; fire time in ms, watermark hold in micros."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, bytes]] = []
        self._timers: dict[bytes, tuple[int, int]] = {}  # key -> (fire_at_ms, hold_micros)
        self._holds: list[tuple[int, bytes]] = []

    def __len__(self) -> int:
        return len(self._timers)

    def set(self, key: bytes, fire_at_ms: int, hold_micros: int) -> None:
        self._timers[key] = (fire_at_ms, hold_micros)
        heapq.heappush(self._heap, (fire_at_ms, key))
        heapq.heappush(self._holds, (hold_micros, key))
        self._compact()

    def _compact(self) -> None:
        """Rebuild the heaps from the live timers once they are mostly cleared entries
        (amortized O(1) a change: a rebuild follows at least as many changes as it keeps)."""
        bound = 2 * len(self._timers) + 64
        if len(self._heap) <= bound and len(self._holds) <= bound:
            return
        self._heap = [(fire, key) for key, (fire, _) in self._timers.items()]
        self._holds = [(hold, key) for key, (_, hold) in self._timers.items()]
        heapq.heapify(self._heap)
        heapq.heapify(self._holds)

    def next_fire_ms(self) -> int | None:
        """Fire time of the earliest live timer (lazily drops cleared ones)."""
        return self._live_top(self._heap, 0)

    def pop_due(self, now_ms: float, limit: int) -> list[bytes]:
        """Keys of up to ``limit`` timers due at ``now_ms``, earliest first; they are cleared."""
        due: list[bytes] = []
        while len(due) < limit:
            fire_at = self.next_fire_ms()
            if fire_at is None or fire_at > now_ms:
                break
            _, key = heapq.heappop(self._heap)
            self._timers.pop(key, None)
            due.append(key)
        self._compact()
        return due

    def hold_micros(self) -> int | None:
        """Minimum output-timestamp hold over live timers (None when none pending)."""
        return self._live_top(self._holds, 1)

    def _live_top(self, heap: list[tuple[int, bytes]], field: int) -> int | None:
        """The smallest value of ``heap`` that is still its key's live timer's ``field``
        (0: fire time, 1: hold), popping those a clear or a reset left behind."""
        while heap:
            value, key = heap[0]
            live = self._timers.get(key)
            if live is not None and live[field] == value:
                return value
            heapq.heappop(heap)
        return None

    def restore(self, entries: Iterable[tuple[bytes, int, int]]) -> None:
        for key, fire_at_ms, hold_micros in entries:
            self.set(key, fire_at_ms, hold_micros)

"""Processing-time timers for pending residuals: earliest first, nobody spins.

An in-memory index (a heap of (fire time, key)) over timers whose payloads
live in the checkpoint store. Rebuilt from the store on restore, so it is
never the source of truth. Holds give the stage's output watermark.

Both heaps drop cleared timers lazily (when they reach the top); once dead entries
outnumber the live timers, the heaps are rebuilt from the live ones, so a fired residual's
key is not kept alive (a polling SDF fires one per poll for as long as it runs).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable


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
        while self._heap:
            fire_at, key = self._heap[0]
            live = self._timers.get(key)
            if live is not None and live[0] == fire_at:
                return fire_at
            heapq.heappop(self._heap)
        return None

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
        while self._holds:
            hold, key = self._holds[0]
            live = self._timers.get(key)
            if live is not None and live[1] == hold:
                return hold
            heapq.heappop(self._holds)
        return None

    def restore(self, entries: Iterable[tuple[bytes, int, int]]) -> None:
        for key, fire_at_ms, hold_micros in entries:
            self.set(key, fire_at_ms, hold_micros)

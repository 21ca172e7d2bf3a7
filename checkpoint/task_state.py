"""Task-owned state in a manifest: per namespace, key-group ranges of snapshot + changelog tail.

Owns the handles a manifest holds for state that tasks keep, write and snapshot themselves
(`state_layout.is_task_owned`), and the pure operations the driver's commit applies to them; the
driver never reads these bytes. For one namespace (`NamespaceState`):

- ``log``: the staged segments committed after some range's base, in commit order, numbered. A
  segment may hold keys of several ranges (a task after a rescale).
- ``ranges``: disjoint key-group ranges covering ``[0, max_key_groups)``, each its ``base``
  files (Arrow snapshots, possibly of a wider range: read filtered) then the log segments with
  ``seq > since``. A snapshot of ``[a, b)`` splits the ranges at ``a`` and ``b`` and replaces
  those inside; log segments no range needs any more are dropped (truncation).
- ``entries``: keys per range, as tasks last reported them (a restore needs no scan).
- ``rebase_below``: ranges with ``since`` below it snapshot in the next round, so the fallback
  guarantee of `retention` holds for task-owned state too.

Leaves to others: reading the files (`reader`, the runner's task-side reads), the commit steps
(`commit`), what the values mean (`state_layout`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import cached_property

from sparkbeam.checkpoint.ids import FileEntry
from sparkbeam.checkpoint.keygroups import KeyGroupRange

SNAPSHOT_MIN_BYTES = 1 << 20
"""A range snapshots once its tail holds this many bytes and a quarter of its base (its files
stay within about 1.25x its snapshot; a byte of change costs about four of snapshot)..."""
SNAPSHOT_TAIL_SHARE = 4
SNAPSHOT_MAX_SEGMENTS = 32
"""... or about this many segments (half to all of it, by range, so ranges that grow alike do
not all snapshot in one round). Written in the background (`Due.GROWN`); twice these bounds
make it `Due.OVERDUE`, written in the round, so a manifest holds at most twice this many log
segments per range."""


class Due(Enum):
    """Why a range should snapshot after this round."""

    GROWN = "grown"  # its tail passed the bounds: in the background, reported later
    OVERDUE = "overdue"  # twice past them (no background snapshot came back): in the round
    REQUESTED = "requested"  # the commit asked (the fallback guarantee): in the round


def _segments_due(start: int) -> int:
    half = SNAPSHOT_MAX_SEGMENTS // 2
    return half + (start * 7919) % max(1, half)


@dataclass(frozen=True)
class RangeState:
    """One key-group range of a namespace: its snapshot files and where its tail starts."""

    start: int
    stop: int
    base: tuple[FileEntry, ...] = ()
    since: int = -1
    """Log segments with a larger sequence number apply on top of ``base``."""
    entries: int = 0
    checkpoint: int = -1
    """The checkpoint that committed ``base`` (-1: none)."""

    def to_json(self) -> dict:
        return dict(vars(self), base=[f.to_json() for f in self.base])

    @classmethod
    def from_json(cls, d: dict) -> RangeState:
        return cls(
            int(d["start"]),
            int(d["stop"]),
            tuple(FileEntry.from_json(f) for f in d["base"]),
            int(d["since"]),
            int(d.get("entries", 0)),
            int(d.get("checkpoint", -1)),
        )


def _file_range(entry: FileEntry, max_key_groups: int) -> tuple[int, int]:
    """The key groups a file may hold (a file that did not record them: all)."""
    if entry.kg_stop <= entry.kg_start:
        return 0, max_key_groups
    return entry.kg_start, entry.kg_stop


@dataclass(frozen=True)
class NamespaceState:
    """The handles of one task-owned namespace; see the module docstring."""

    ranges: tuple[RangeState, ...]
    log: tuple[tuple[int, FileEntry], ...] = ()
    next_seq: int = 0
    rebase_below: int = -1
    """Ranges whose base an earlier checkpoint committed snapshot in the next round."""

    @classmethod
    def empty(cls, max_key_groups: int) -> NamespaceState:
        return cls((RangeState(0, max_key_groups),))

    @property
    def max_key_groups(self) -> int:
        return self.ranges[-1].stop

    @property
    def entries(self) -> int:
        return sum(r.entries for r in self.ranges)

    def files(self) -> Iterator[FileEntry]:
        for r in self.ranges:
            yield from r.base
        for _, f in self.log:
            yield f

    # -- the commit's operations ---------------------------------------------------------------
    def append(self, files: Iterable[FileEntry]) -> NamespaceState:
        """Segments a task attempt staged, in order, after everything committed before."""
        log, seq = list(self.log), self.next_seq
        for f in files:
            log.append((seq, f))
            seq += 1
        return replace(self, log=tuple(log), next_seq=seq)

    @cached_property
    def _starts(self) -> list[int]:
        return [r.start for r in self.ranges]

    def _span(self, start: int, stop: int) -> tuple[int, int]:
        """Indices ``[i, j)`` of the (sorted, disjoint, covering) ranges in ``[start, stop)``."""
        starts = self._starts
        return max(0, bisect.bisect_right(starts, start) - 1), bisect.bisect_left(starts, stop)

    def _overlapping(self, start: int, stop: int) -> tuple[RangeState, ...]:
        i, j = self._span(start, stop)
        return self.ranges[i:j]

    def _split_at(self, *points: int) -> NamespaceState:
        """The same ranges, cut at ``points`` (a new part counts no entries until told)."""
        state = self
        for at in points:
            i, _ = state._span(at, at + 1)
            r = state.ranges[i]
            if r.start < at < r.stop:
                parts = (replace(r, stop=at), replace(r, start=at, entries=0))
                state = replace(state, ranges=state.ranges[:i] + parts + state.ranges[i + 1 :])
        return state

    def count(self, start: int, stop: int, entries: int) -> NamespaceState:
        """A task's report: ``[start, stop)`` now holds ``entries`` keys."""
        state = self._split_at(start, stop)
        i, j = state._span(start, stop)
        inside = state.ranges[i:j]
        if inside[0].entries == entries and all(r.entries == 0 for r in inside[1:]):
            return state
        counted = (replace(inside[0], entries=entries),) + tuple(
            replace(r, entries=0) for r in inside[1:]
        )
        return replace(state, ranges=state.ranges[:i] + counted + state.ranges[j:])

    def rebase(
        self, start: int, stop: int, base: tuple[FileEntry, ...], entries: int, checkpoint: int,
        since: int | None = None,
    ) -> NamespaceState:  # fmt: skip
        """A snapshot of ``[start, stop)`` committed by ``checkpoint``, as of the whole log or
        (a background one) up to ``since``; ignored if a range there has a later base."""
        if since is None:
            since = self.next_seq - 1
        elif any(r.since >= since for r in self._overlapping(start, stop)):
            return self
        state = self._split_at(start, stop)
        i, j = state._span(start, stop)
        new = RangeState(start, stop, base, since, entries, checkpoint)
        return replace(state, ranges=state.ranges[:i] + (new,) + state.ranges[j:])

    def truncated(self) -> NamespaceState:
        """Without the log segments no range reads any more (after a commit's snapshots)."""
        m = self.max_key_groups
        kept = tuple(
            (seq, f)
            for seq, f in self.log
            if any(r.since < seq for r in self._overlapping(*_file_range(f, m)))
        )
        return replace(self, log=kept) if len(kept) != len(self.log) else self

    def without_empty_bases(self, checkpoint: int) -> NamespaceState:
        """Ranges that hold nothing without their files, as of ``checkpoint``: as empty, and
        sharing none with a retained checkpoint, when a finished stage (an SDF's drained
        residuals) has no task left to write the snapshot a fallback asks for."""
        ranges = list(self.ranges)
        for i, r in enumerate(ranges):
            empty = r.base and r.entries == 0 and all(f.records == 0 for f in r.base)
            if empty and not self.plan(KeyGroupRange(r.start, r.stop))[0][2]:
                ranges[i] = replace(r, base=(), checkpoint=checkpoint)
        return replace(self, ranges=tuple(ranges)) if ranges != list(self.ranges) else self

    def request_snapshots(self, checkpoint: int) -> NamespaceState:
        """Ask every range to snapshot in the round after ``checkpoint``."""
        return replace(self, rebase_below=checkpoint + 1)

    @property
    def snapshots_pending(self) -> bool:
        """Ranges asked to snapshot that have not yet."""
        return any(r.checkpoint < self.rebase_below for r in self.ranges)

    # -- reading -------------------------------------------------------------------------------
    def plan(self, groups: KeyGroupRange) -> list[tuple[KeyGroupRange, RangeState, list]]:
        """Per range overlapping ``groups``: the overlap, the range, its tail segments."""
        m = self.max_key_groups
        out = []
        for r in self._overlapping(groups.start, groups.stop):
            sub = KeyGroupRange(max(r.start, groups.start), min(r.stop, groups.stop))
            tail = [f for seq, f in self.log if seq > r.since and sub.overlaps(*_file_range(f, m))]
            out.append((sub, r, tail))
        return out

    def snapshot_due(self, groups: KeyGroupRange) -> Due | None:
        """Whether, and how, a task owning ``groups`` should snapshot them after this round."""
        due = None
        for _, r, tail in self.plan(groups):
            if r.checkpoint < self.rebase_below:
                return Due.REQUESTED
            tail_bytes, base_bytes = sum(f.size for f in tail), sum(f.size for f in r.base)
            over = max(
                len(tail) / _segments_due(r.start),
                tail_bytes / max(SNAPSHOT_MIN_BYTES, base_bytes // SNAPSHOT_TAIL_SHARE + 1),
            )
            if over >= 2:
                due = Due.OVERDUE
            elif over >= 1 and due is None:
                due = Due.GROWN
        return due

    # -- encoding --------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "ranges": [r.to_json() for r in self.ranges],
            "log": [[seq, *f.to_row()] for seq, f in self.log],
            "next_seq": self.next_seq,
            "rebase_below": self.rebase_below,
        }

    @classmethod
    def from_json(cls, d: dict) -> NamespaceState:
        return cls(
            tuple(RangeState.from_json(r) for r in d["ranges"]),
            tuple((int(e[0]), FileEntry.from_row(e[1:])) for e in d["log"]),
            int(d["next_seq"]),
            int(d.get("rebase_below", -1)),
        )


@dataclass(frozen=True)
class TaskSnapshot:
    """A snapshot a task wrote of one namespace's key groups ``[start, stop)``."""

    namespace: str
    start: int
    stop: int
    files: tuple[FileEntry, ...]
    entries: int
    since: int | None = None
    """None: as of the changes of the attempt that reports it; else as of the namespace's
    log up to this sequence number (written in the background after an earlier round)."""


@dataclass(frozen=True)
class TaskState:
    """All task-owned namespaces of one pipeline's checkpoint."""

    namespaces: dict[str, NamespaceState] = field(default_factory=dict)

    def files(self) -> tuple[FileEntry, ...]:
        return self._files

    @cached_property
    def _files(self) -> tuple[FileEntry, ...]:
        seen: dict[str, FileEntry] = {}
        for ns in sorted(self.namespaces):
            for f in self.namespaces[ns].files():
                seen.setdefault(f.name, f)
        return tuple(seen.values())

    @property
    def entries(self) -> int:
        return sum(s.entries for s in self.namespaces.values())

    def map(self, change: Callable[[NamespaceState], NamespaceState]) -> TaskState:
        """Every namespace's state changed by ``change``."""
        return TaskState({ns: change(s) for ns, s in self.namespaces.items()})

    def to_json(self) -> dict:
        return {ns: s.to_json() for ns, s in sorted(self.namespaces.items())}

    @classmethod
    def from_json(cls, d: dict) -> TaskState:
        return cls({str(ns): NamespaceState.from_json(s) for ns, s in d.items()})

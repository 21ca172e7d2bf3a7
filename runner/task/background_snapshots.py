"""Snapshots of a key-group range written in the background, off the round's critical path.

When a range's tail has grown (`task_state.Due.GROWN`), the task hands the read's keys and
values (shared, not copied) and the round's changes to a thread of its Python worker and
returns. A later round's task of the range, on whichever worker of the executor, reports the
finished snapshot as of the log position it holds (``TaskSnapshot.since``); the handoff is a
JSON file of handles in the range's executor directory (`shared_reads`).

It is reported only if the files it holds are still the range's base and log (its attempt
committed; no restore abandoned them), no other segment changed the range before the last of
them, within `WITHIN_ROUNDS` rounds, and its own files are still there; else it is dropped and
its files, named for the last round that may commit them, are swept as uncommitted. One whose
thread died with its worker never comes back: the range becomes overdue and is snapshotted in
the round, as it is outside Spark or when the state is on disk.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace

from sparkbeam.checkpoint.ids import FileEntry
from sparkbeam.checkpoint.keygroups import KeyGroupRange
from sparkbeam.checkpoint.layout import background_prefix, pipeline_dir
from sparkbeam.checkpoint.staging import StagedWriter, write_range_snapshot
from sparkbeam.checkpoint.task_state import NamespaceState, TaskSnapshot
from sparkbeam.runner.task import shared_reads
from sparkbeam.runner.task.staged_state import with_changes

WITHIN_ROUNDS = 8  # a background snapshot is committed within this many rounds, or dropped
_RUNNING = "snapshot-running"
_DONE = "snapshot-done-"
_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Made:
    """A finished background snapshot and the files whose state it holds, by name (names are
    unique to the attempt that wrote them, so a restore that abandoned them never matches)."""

    snapshot: TaskSnapshot
    round_no: int  # the round whose state it holds
    bases: frozenset[str]  # the base files of the ranges that round read
    segments: frozenset[str]  # the log segments it read on top, and those its attempt staged

    def to_json(self) -> bytes:
        s = self.snapshot
        return json.dumps({
            "snapshot": [s.namespace, s.start, s.stop, [f.to_json() for f in s.files],
                         s.entries, s.since],
            "round": self.round_no, "bases": sorted(self.bases),
            "segments": sorted(self.segments),
        }).encode()  # fmt: skip

    @classmethod
    def from_json(cls, blob: bytes) -> _Made:
        d = json.loads(blob)
        namespace, start, stop, files, entries, since = d["snapshot"]
        snapshot = TaskSnapshot(
            namespace, start, stop, tuple(FileEntry.from_json(f) for f in files), entries, since
        )
        return cls(snapshot, d["round"], frozenset(d["bases"]), frozenset(d["segments"]))


def report(writer: StagedWriter, slot: tuple, chains: NamespaceState, groups) -> bool:
    """Add to ``writer`` the background snapshot of ``slot`` that finished, if it holds for
    the log of ``chains``; whether one was added or is still being written."""
    directory = shared_reads.slot_dir(slot)
    if directory is None:
        return False
    held = [_as_of_log(made, chains, groups, writer.round) for made in _take_done(directory)]
    latest = max((s for s in held if s is not None), key=lambda s: s.since or 0, default=None)
    if latest is not None and _files_kept(writer, latest):
        writer.add_snapshot(latest)
        return True
    return _running(directory, writer.round)


def _files_kept(writer: StagedWriter, snapshot: TaskSnapshot) -> bool:
    """Whether the files of ``snapshot`` are all still there: a fallback runs rounds again,
    and a sweep of the rounds it abandoned may have deleted them (a HEAD request a file)."""
    directory = pipeline_dir(writer.pipeline_id)
    return all(writer.storage.exists(f"{directory}/{f.name}") for f in snapshot.files)


def start(
    writer: StagedWriter, slot: tuple, chains: NamespaceState, groups: KeyGroupRange,
    namespace: str, before: Mapping[bytes, bytes], changes: dict[bytes, bytes | None],
    file_bytes: int,
) -> bool:  # fmt: skip
    """Snapshot ``before`` with ``changes`` applied (None: deleted) in a thread; False where it
    cannot (no executor directory, or ``before`` on disk)."""
    directory = shared_reads.slot_dir(slot)
    if directory is None or type(before) is not dict:
        return False
    try:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, _RUNNING), "w") as f:
            f.write(f"{os.getpid()} {writer.round}")
    except OSError:
        return False
    keys, values, changes = list(before), list(before.values()), dict(changes)
    last = writer.round + WITHIN_ROUNDS - 1  # the last round that may commit it
    prefix = background_prefix(writer.stage, last, writer.partition, writer.attempt)
    plan = chains.plan(groups)
    bases = frozenset(f.name for _, r, _ in plan for f in r.base)
    read = frozenset(f.name for _, _, tail in plan for f in tail)

    def write() -> None:
        try:
            snapshot = write_range_snapshot(
                writer.storage, pipeline_dir(writer.pipeline_id), prefix, writer.max_key_groups,
                namespace, groups.start, groups.stop, with_changes(zip(keys, values), changes),
                file_bytes,
            )  # fmt: skip
            message = writer.finished(timeout_s=60.0)
            if message is None:
                return  # the task failed before its commit message: nothing to report
            staged = message.files if namespace in message.namespaces else ()
            segments = read | {f.name for f in staged}
            _put_done(directory, _Made(snapshot, writer.round, bases, segments))
        except Exception:  # the range is snapshotted in a later round instead
            _LOG.debug("background snapshot of %s failed", slot, exc_info=True)
        finally:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(directory, _RUNNING))

    threading.Thread(target=write, name=f"sparkbeam-snapshot-{namespace}", daemon=True).start()
    return True


def _as_of_log(made: _Made, chains: NamespaceState, groups, round_no: int) -> TaskSnapshot | None:
    """``made`` as of the last log segment it holds, or None if it does not hold that state of
    ``chains`` (snapshotted since, its round not committed, or changed by another segment)."""
    if round_no - made.round_no >= WITHIN_ROUNDS:
        return None
    plan = chains.plan(groups)
    if frozenset(f.name for _, r, _ in plan for f in r.base) != made.bases:
        return None  # a later base, or another timeline
    tail = [f.name for _, _, segments in plan for f in segments]
    seq_of = {f.name: seq for seq, f in chains.log}
    if not made.segments <= seq_of.keys() or not made.segments:
        return None  # its round's attempt did not commit (or nothing to add to the base)
    since = max(seq_of[name] for name in made.segments)
    if any(seq_of[name] <= since and name not in made.segments for name in tail):
        return None  # a segment it does not hold changed the range before its last one
    return replace(made.snapshot, since=since)


def _running(directory: str, round_no: int) -> bool:
    try:
        with open(os.path.join(directory, _RUNNING)) as f:
            pid, made = (int(v) for v in f.read().split())
    except (OSError, ValueError):
        return False
    if round_no - made >= WITHIN_ROUNDS:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass  # alive, another user's
    return True


def _put_done(directory: str, made: _Made) -> None:
    path = os.path.join(directory, f"{_DONE}{uuid.uuid4().hex}")
    with open(f"{path}.partial", "wb") as f:
        f.write(made.to_json())
    os.replace(f"{path}.partial", path)


def _take_done(directory: str) -> list[_Made]:
    """The finished snapshots of the directory, each taken by one worker only."""
    try:
        names = [n for n in os.listdir(directory) if n.startswith(_DONE) and "." not in n]
    except OSError:
        return []
    out = []
    for name in names:
        taken = os.path.join(directory, f"{name}.taken-{os.getpid()}")
        try:
            os.rename(os.path.join(directory, name), taken)
            with open(taken, "rb") as f:
                out.append(_Made.from_json(f.read()))
        except (OSError, ValueError, KeyError, TypeError):  # torn or foreign: not taken
            continue
        finally:
            with contextlib.suppress(OSError):
                os.remove(taken)
    return out

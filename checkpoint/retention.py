"""Retention: which checkpoints a pipeline keeps, and sweeping staged files nobody will commit.

Owns the rules, as plain functions over checkpoint ids and the file names each names:

- Keep the newest ``retain`` checkpoints, plus the *fallback*: the newest older checkpoint
  sharing no file with the newest. Consecutive checkpoints share their materialization and
  changelog prefix, so without it one damaged shared file makes every retained checkpoint
  unusable; with it, any single damaged file leaves the newest or the fallback restorable.
- `needs_fallback`: a commit rewrites the state into new files (`commit.CheckpointChain`) when
  no retained checkpoint would be disjoint from it, so the guarantee does not wait for the
  materialization interval; and when the only disjoint one is older than the fallback's age
  bound (`FALLBACK_MAX_INTERVALS` materialization intervals): a range that never changes
  again (a key range without traffic) would otherwise pin the checkpoint before its last
  snapshot as the fallback for the rest of the job -- a restore to it replaying days of input
  that a Kafka topic may no longer hold, and its files kept all that time.
- Checkpoints newer than the one a restore fell back to are *abandoned*: the next commit drops
  them.
- `sweep`: staged files of rounds a stage already committed and driver changelog segments that
  neither a checkpoint nor the live chain names (losing attempts, redone rounds, segments a
  snapshot superseded) are deleted, so a long job leaves no per-round garbage; safe while the
  job runs, as only the lock holder writes the driver changelog.

Leaves to others: deleting and loading manifests and files (`store`), when to commit (`commit`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from sparkbeam.checkpoint.filesystem import Storage
from sparkbeam.checkpoint.layout import staged_round

FilesOf = Callable[[int], "frozenset[str] | None"]
"""The file names a checkpoint names, or None if its manifest is unreadable."""

FALLBACK_MAX_INTERVALS = 3
"""A fallback older than this many materialization intervals is refreshed (a restore to it
replays at most about that much input)."""


def fallback(ids: list[int], files_of: FilesOf) -> int | None:
    """The newest checkpoint before ``ids[-1]`` sharing no file with it, or None."""
    if not ids:
        return None
    newest = files_of(ids[-1])
    if newest is None:
        return None
    for cid in reversed(ids[:-1]):
        files = files_of(cid)
        if files is not None and files.isdisjoint(newest):
            return cid
    return None


def plan_retention(
    ids: list[int], files_of: FilesOf, retain: int, abandoned: Iterable[int] = ()
) -> tuple[list[int], list[int]]:
    """(keep, drop) of the sorted checkpoint ``ids``; see the module docstring."""
    gone = set(abandoned)
    candidates = [cid for cid in ids if cid not in gone]
    keep = set(candidates[-retain:])
    anchor = fallback(candidates, files_of)
    if anchor is not None:
        keep.add(anchor)
    return sorted(keep), [cid for cid in ids if cid not in keep]


def needs_fallback(
    ids: list[int], files_of: FilesOf, next_files: set[str], young: Iterable[int]
) -> bool:
    """True if checkpoints exist but none of the ``young`` ones (within the age bound) would
    share no file with the next one."""
    readable = {cid: f for cid in ids if (f := files_of(cid)) is not None}
    pool = set(readable).intersection(young)
    return bool(readable) and not any(readable[cid].isdisjoint(next_files) for cid in pool)


def sweep(
    storage: Storage, directory: str, rounds_done: Mapping[str, int], referenced: set[str]
) -> list[str]:
    """Delete, and return, the staged files of rounds up to ``rounds_done[stage]`` and the driver
    segments that no checkpoint nor the live chain names (``referenced``, in ``directory``)."""
    deleted = []
    for path in storage.list(f"{directory}/staged") + storage.list(f"{directory}/changelog"):
        name = path[len(directory) + 1 :]
        if name in referenced:
            continue
        staged = staged_round(name)
        if staged is None and not name.startswith("changelog/"):
            continue
        if staged is None or staged[1] <= rounds_done.get(staged[0], -1):
            storage.delete(path)
            deleted.append(path)
    return deleted

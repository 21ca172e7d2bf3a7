"""Key groups: the stable hash, the key -> key-group map, and key-group ranges per subtask.

Owns: `stable_hash` (the same in every process and Python version: BLAKE2b, never Python's
salted ``hash()``), `key_group`, and Flink's contiguous ``KeyGroupRangeAssignment``: of ``p``
subtasks, subtask ``i`` owns ``[ceil(i*m/p), ceil((i+1)*m/p))``, so rescaling reassigns whole
ranges and rehashes nothing. The number of key groups is fixed when a store's pipeline is
created (`default_max_key_groups`). Leaves to others: what a key is (the runner encodes keys to
bytes) and which parallelism a run uses.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

from sparkbeam.checkpoint.ids import KeyGroup

DEFAULT_MAX_KEY_GROUPS = 128
"""The fewest key groups a default gives (Flink's ``DEFAULT_LOWER_BOUND_MAX_PARALLELISM``)."""
MAX_KEY_GROUPS_LIMIT = 1 << 15
"""The most key groups a store may have (Flink's ``UPPER_BOUND_MAX_PARALLELISM``)."""


def default_max_key_groups(parallelism: int) -> int:
    """The key groups of a new store at ``parallelism``: the power of two at or above
    ``parallelism + parallelism // 2``, at least 128, at most 32768 -- Flink's
    ``KeyGroupRangeAssignment.computeDefaultMaxParallelism``, so a job can later grow to
    about 1.5x its parallelism with every subtask still owning whole key groups."""
    wanted = max(1, parallelism + parallelism // 2)
    power = 1 << (wanted - 1).bit_length()
    return min(max(power, DEFAULT_MAX_KEY_GROUPS), MAX_KEY_GROUPS_LIMIT)


def stable_hash(key: bytes) -> int:
    """A 64-bit hash of ``key`` that is the same in every process, host and Python version."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


def key_group(key: bytes, max_key_groups: int) -> KeyGroup:
    """The key group of ``key``: ``stable_hash(key) % max_key_groups``."""
    return KeyGroup(stable_hash(key) % max_key_groups)


@dataclass(frozen=True)
class KeyGroupRange:
    """The contiguous key groups ``[start, stop)`` owned by one subtask."""

    start: int
    stop: int

    def __contains__(self, kg: object) -> bool:
        return isinstance(kg, int) and self.start <= kg < self.stop

    def __iter__(self):
        return iter(range(self.start, self.stop))

    def __len__(self) -> int:
        return max(0, self.stop - self.start)

    def overlaps(self, start: int, stop: int) -> bool:
        return self.start < stop and start < self.stop


def _check(parallelism: int, max_key_groups: int) -> None:
    if not 1 <= max_key_groups <= MAX_KEY_GROUPS_LIMIT:
        raise ValueError(
            f"max_key_groups={max_key_groups!r} must be in 1..{MAX_KEY_GROUPS_LIMIT}; "
            "leave it out to derive it from the parallelism."
        )
    if not 1 <= parallelism <= max_key_groups:
        raise ValueError(
            f"parallelism={parallelism!r} must be in 1..max_key_groups ({max_key_groups}): "
            "each subtask owns whole key groups; lower the parallelism, or give a new store "
            "more key groups (--max_key_groups)."
        )


def key_group_range(subtask: int, parallelism: int, max_key_groups: int) -> KeyGroupRange:
    """The key groups of ``subtask`` (0-based) out of ``parallelism`` subtasks."""
    _check(parallelism, max_key_groups)
    if not 0 <= subtask < parallelism:
        raise ValueError(f"subtask={subtask!r} must be in 0..{parallelism - 1}.")
    start = (subtask * max_key_groups + parallelism - 1) // parallelism
    stop = ((subtask + 1) * max_key_groups + parallelism - 1) // parallelism
    return KeyGroupRange(start, stop)


def key_in_groups(
    prefix: bytes, suffixes: Iterator[bytes], groups: KeyGroupRange, max_key_groups: int
) -> bytes:
    """``prefix`` + the first of ``suffixes`` whose key is in ``groups``, the task's own key
    groups (about as many hashes as the parallelism)."""
    hashed = hashlib.blake2b(prefix, digest_size=8)
    for suffix in suffixes:
        h = hashed.copy()
        h.update(suffix)
        if int.from_bytes(h.digest(), "big") % max_key_groups in groups:
            return prefix + suffix
    raise ValueError(f"no suffix puts a key of prefix {prefix!r} in key groups {groups}")


def subtask_for_key_group(kg: int, parallelism: int, max_key_groups: int) -> int:
    """The subtask that owns key group ``kg``; inverse of `key_group_range`."""
    _check(parallelism, max_key_groups)
    if not 0 <= kg < max_key_groups:
        raise ValueError(f"key group {kg!r} must be in 0..{max_key_groups - 1}.")
    return kg * parallelism // max_key_groups

"""Which value of an int column Spark's hash partitioning sends to partition ``p``.

``DataFrame.repartition(n, col)`` places a row at ``pmod(murmur3(col, seed=42), n)``
(``HashPartitioning``). sparkbeam decides the partition of a row itself (a key group's subtask
owns its state), so the row's partition column holds a value that Spark's hash sends exactly
there: ``target_values(n)[p]``. Murmur3 of a 32-bit int is Spark's ``Murmur3_x86_32.hashInt``.
"""

from __future__ import annotations

import functools

SEED = 42
_MASK = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def hash_int(value: int, seed: int = SEED) -> int:
    """Spark's ``hash(CAST(value AS INT))``: Murmur3 x86 32-bit of one int, signed."""
    k1 = (value & _MASK) * 0xCC9E2D51 & _MASK
    k1 = _rotl(k1, 15) * 0x1B873593 & _MASK
    h1 = _rotl((seed & _MASK) ^ k1, 13)
    h1 = (h1 * 5 + 0xE6546B64) & _MASK
    h1 ^= 4  # the length in bytes
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


@functools.lru_cache(maxsize=64)
def target_values(partitions: int) -> tuple[int, ...]:
    """For each partition ``p`` of ``partitions``, the least int Spark's hash sends to ``p``."""
    found: dict[int, int] = {}
    value = 0
    while len(found) < partitions:
        found.setdefault(hash_int(value) % partitions, value)  # Python's % is Spark's pmod
        value += 1
    return tuple(found[p] for p in range(partitions))

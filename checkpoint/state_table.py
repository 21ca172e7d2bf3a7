"""The working copy of one pipeline's keyed state: the state table.

Owns: the `StateTable` interface -- ``(namespace, key) -> value`` entries, each with its key
group -- and its backends, `MemoryStateTable` (a dict) and `RocksDBStateTable` (``rocksdict``,
for state larger than memory). As in Flink, durability comes from the changelog and
materializations, not the table. Leaves to others: persistence and key hashing.
"""

from __future__ import annotations

import shutil
import struct
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

from sparkbeam.checkpoint.keygroups import KeyGroupRange, key_group

Entry = tuple[int, str, bytes, bytes]
"""(key group, namespace, key, value) as yielded by `StateTable.snapshot`."""

STATE_BACKENDS = ("memory", "rocksdb")


class StateTable(ABC):
    """A mutable map ``(namespace, key) -> value`` that knows each entry's key group."""

    def __init__(self, max_key_groups: int):
        self.max_key_groups = max_key_groups

    def key_group(self, key: bytes) -> int:
        return key_group(key, self.max_key_groups)

    @abstractmethod
    def get(self, namespace: str, key: bytes) -> bytes | None: ...

    @abstractmethod
    def put(self, namespace: str, key: bytes, value: bytes, kg: int | None = None) -> None:
        """Insert or replace; ``kg`` may be passed when the caller already hashed the key."""

    @abstractmethod
    def delete(self, namespace: str, key: bytes, kg: int | None = None) -> None:
        """Remove the entry if present."""

    @abstractmethod
    def snapshot(self, key_groups: KeyGroupRange | None = None) -> Iterator[Entry]:
        """All entries (or those in ``key_groups``) as (kg, namespace, key, value)."""

    @abstractmethod
    def clear(self) -> None: ...

    @abstractmethod
    def __len__(self) -> int: ...

    def items(
        self, namespace: str | None = None, key_groups: KeyGroupRange | None = None
    ) -> Iterator[tuple[str, bytes, bytes]]:
        """(namespace, key, value) of all entries, optionally of one namespace / key groups."""
        for _kg, ns, key, value in self.snapshot(key_groups):
            if namespace is None or ns == namespace:
                yield ns, key, value

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""


class MemoryStateTable(StateTable):
    """Per namespace a dict ``key -> (key group, value)``: one namespace's entries (the sink's
    pending files each round) are read without walking every other's (a GroupByKey's keys)."""

    def __init__(self, max_key_groups: int):
        super().__init__(max_key_groups)
        self._data: dict[str, dict[bytes, tuple[int, bytes]]] = {}
        self._count = 0

    def get(self, namespace: str, key: bytes) -> bytes | None:
        hit = self._data.get(namespace, {}).get(key)
        return None if hit is None else hit[1]

    def put(self, namespace: str, key: bytes, value: bytes, kg: int | None = None) -> None:
        entries = self._data.get(namespace)
        if entries is None:
            entries = self._data[namespace] = {}
        if key not in entries:
            self._count += 1
        entries[key] = (self.key_group(key) if kg is None else kg, value)

    def delete(self, namespace: str, key: bytes, kg: int | None = None) -> None:
        entries = self._data.get(namespace)
        if entries is not None and entries.pop(key, None) is not None:
            self._count -= 1
            if not entries:
                del self._data[namespace]

    def snapshot(self, key_groups: KeyGroupRange | None = None) -> Iterator[Entry]:
        for ns, entries in list(self._data.items()):
            for key, (kg, value) in list(entries.items()):
                if key_groups is None or kg in key_groups:
                    yield kg, ns, key, value

    def items(
        self, namespace: str | None = None, key_groups: KeyGroupRange | None = None
    ) -> Iterator[tuple[str, bytes, bytes]]:
        if namespace is None:
            yield from super().items(None, key_groups)
            return
        for key, (kg, value) in list(self._data.get(namespace, {}).items()):
            if key_groups is None or kg in key_groups:
                yield namespace, key, value

    def clear(self) -> None:
        self._data.clear()
        self._count = 0

    def __len__(self) -> int:
        return self._count


_PREFIX = struct.Struct(">HH")  # key group, namespace length


class RocksDBStateTable(StateTable):
    """A local RocksDB (``rocksdict``) in a private temp directory, removed on `close`. Keys are
    ``kg (u16 BE) | len(namespace) (u16 BE) | namespace | key``: a key-group range is one scan;
    the entry count is kept in memory (one extra read per write)."""

    def __init__(self, max_key_groups: int, directory: str | None = None):
        super().__init__(max_key_groups)
        from rocksdict import Options, Rdict

        self._Rdict = Rdict
        self._options = Options(raw_mode=True)
        self._dir = tempfile.mkdtemp(prefix="sparkbeam-state-", dir=directory)
        self._path = f"{self._dir}/db"
        self._db: Any = Rdict(self._path, self._options)
        self._count = 0

    def _key(self, kg: int, namespace: str, key: bytes) -> bytes:
        ns = namespace.encode()
        return _PREFIX.pack(kg, len(ns)) + ns + key

    def get(self, namespace: str, key: bytes) -> bytes | None:
        return self._db.get(self._key(self.key_group(key), namespace, key))

    def put(self, namespace: str, key: bytes, value: bytes, kg: int | None = None) -> None:
        k = self._key(self.key_group(key) if kg is None else kg, namespace, key)
        if self._db.get(k) is None:
            self._count += 1
        self._db[k] = value

    def delete(self, namespace: str, key: bytes, kg: int | None = None) -> None:
        k = self._key(self.key_group(key) if kg is None else kg, namespace, key)
        if self._db.get(k) is not None:
            self._count -= 1
            del self._db[k]

    def snapshot(self, key_groups: KeyGroupRange | None = None) -> Iterator[Entry]:
        start = _PREFIX.pack(key_groups.start, 0) if key_groups is not None else None
        for k, value in self._db.items(from_key=start):
            kg, ns_len = _PREFIX.unpack_from(k)
            if key_groups is not None and kg >= key_groups.stop:
                break
            ns_end = _PREFIX.size + ns_len
            yield kg, k[_PREFIX.size : ns_end].decode(), k[ns_end:], value

    def clear(self) -> None:
        self._db.close()
        self._Rdict.destroy(self._path, self._options)
        self._db = self._Rdict(self._path, self._options)
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
            shutil.rmtree(self._dir, ignore_errors=True)


def check_state_backend(backend: str) -> None:
    """Refuse a ``backend`` that is not one of `STATE_BACKENDS`."""
    if backend not in STATE_BACKENDS:
        raise ValueError(
            f"state_backend={backend!r} is not supported; use one of {', '.join(STATE_BACKENDS)}."
        )


def make_state_table(backend: str, max_key_groups: int) -> StateTable:
    """A new empty table of ``backend`` (one of `STATE_BACKENDS`)."""
    check_state_backend(backend)
    return (MemoryStateTable if backend == "memory" else RocksDBStateTable)(max_key_groups)

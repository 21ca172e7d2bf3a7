"""Where a worker holds a key-group range's state past its memory budget: the executor's disk.

A read kept for the next round (``staged_state``) is a dict up to ``--task_state_memory_mb``;
past it, a RocksDB (``rocksdict``) under the executor's Spark local directory, one per (store,
pipeline, namespace, key groups), so state larger than memory is read, changed and snapshotted
a record at a time instead of failing. Any Python worker of the executor opens it next;
RocksDB's lock keeps it to one at a time (a second worker takes the range's next directory).

What a database holds is named by its claim, inside it (a column family of its own): the
range, the manifest files its state is as of, the files an attempt staged on top, its count
and bytes. The claim is deleted before the first change and written after the last, in the
database's one sequence of writes, so whatever RocksDB recovers holds no claim or a true one.
Nothing beside the database vouches for it: a directory deleted, replaced or with files
missing holds no claim of its own, and the range is replayed from the store. A failed read or
write (RocksDB's iterator ends early, silently, on a damaged table, so iterations are counted
against the claim) removes the database and fails the task by name (`SpilledStateError`): its
retry replays the range.

A range is closed when its stage is done with it (`release`; one task may run a GroupByKey and
the SDF stage it feeds); one a failed task left open, by the worker's next task.
"""

from __future__ import annotations

import contextlib
import logging
import marshal
import os
import shutil
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple, NoReturn

from sparkbeam.runner.task import shared_reads

DIRECTORIES_PER_RANGE = 4  # workers of one executor that may hold one range at once
BATCH_RECORDS = 10_000  # records written to RocksDB in one batch while replaying
_OPEN: list[SpilledState] = []  # the ranges this worker holds open, each by one task attempt
_CLAIMS = "sparkbeam-claim"  # the column family of a database's claim
_CLAIM = b"claim"
_LOG = logging.getLogger(__name__)


class SpilledStateError(RuntimeError):
    """A database of a range held on an executor's disk failed a read or write; it is
    removed, and the task fails (its retry replays the range from the checkpoint store)."""


class SpilledState(Mapping):
    """One range's state in a RocksDB on the executor's disk, read like the dict it replaces;
    ``identity`` says what it holds (None: unknown, replay)."""

    def __init__(self, path: str, opened: _Opened, slot: tuple) -> None:
        self.path, self.slot = path, slot
        self._db, self._claims, raw, self.fresh = opened
        identity = _identity(raw, slot)
        self.identity = identity  # (materialization, changelog, staged, count, size) or None
        self.count = identity[3] if identity else 0
        self.size = identity[4] if identity else 0
        self.read_as: tuple = identity[:2] if identity else ()  # what its read is as of
        self.attempt = _attempt()  # the task attempt that opened it
        _OPEN.append(self)

    def __getitem__(self, key: bytes) -> bytes:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def get(self, key: bytes, default=None):
        with self._guarded():
            value = self._db.get(key)
        return default if value is None else value

    def __contains__(self, key: object) -> bool:
        return self.get(key) is not None  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[bytes]:
        return (key for key, _ in self.items())

    def items(self) -> Iterator[tuple[bytes, bytes]]:  # type: ignore[override]
        """(key, value) in key order, read from disk as they are iterated; all of them, or
        `SpilledStateError` (RocksDB's iterator ends early, silently, on a damaged table)."""
        n, expected = 0, self.count
        with self._guarded():
            for row in self._db.items():
                n += 1
                yield row
        if n != expected:
            self._refuse(f"{n} records where its claim counts {expected}")

    def __len__(self) -> int:
        return self.count

    def forget(self) -> None:
        """Delete the claim before the first change (a kill then leaves none)."""
        if self.identity is not None:
            with self._guarded():
                del self._claims[_CLAIM]
            self.identity = None

    def put(self, key: bytes, value: bytes, *, new: bool = False) -> None:
        """Put ``key`` (``new``: known absent, as a snapshot's rows are)."""
        self.forget()
        old = None if new else self.get(key)
        if old is None:
            self.count += 1
            self.size += len(key) + len(value)
        else:
            self.size += len(value) - len(old)
        with self._guarded():
            self._db[key] = value

    def delete(self, key: bytes) -> None:
        self.forget()
        old = self.get(key)
        if old is not None:
            self.count -= 1
            self.size -= len(key) + len(old)
            with self._guarded():
                del self._db[key]

    def put_all(self, items) -> None:
        """Put ``items`` (absent keys: a dict being spilled) in batches."""
        from rocksdict import WriteBatch

        self.forget()
        batch = WriteBatch(raw_mode=True)
        with self._guarded():
            for key, value in items:
                batch.put(key, value)
                self.count += 1
                self.size += len(key) + len(value)
                if len(batch) >= BATCH_RECORDS:
                    self._db.write(batch)
                    batch = WriteBatch(raw_mode=True)
            self._db.write(batch)

    def claim(self, materialization, changelog, staged) -> None:
        """Write the claim: the state is that of these manifest files (and staged files)."""
        identity = (tuple(materialization), tuple(changelog), staged, self.count, self.size)
        with self._guarded():
            self._claims[_CLAIM] = marshal.dumps(
                (list(self.slot), list(identity[0]), list(identity[1]),
                 None if staged is None else list(staged), self.count, self.size)
            )  # fmt: skip
        self.identity = identity
        self.read_as = identity[:2]

    @contextlib.contextmanager
    def _guarded(self) -> Iterator[None]:
        """A database failure in the block refuses it (rocksdict raises a bare Exception)."""
        try:
            yield
        except Exception as e:
            self._refuse(e)

    def _refuse(self, cause: Exception | str) -> NoReturn:
        """The database failed (a table damaged, its directory gone): remove it, so that the
        task's retry reads the range again from the store, and fail the task by name."""
        if isinstance(cause, SpilledStateError):
            raise cause
        if self._db is None:  # closed: another worker may hold the directory now
            raise RuntimeError(f"the range held at {self.path!r} is used after its close")
        shutil.rmtree(self.path, ignore_errors=True)  # before `close`: the lock is still ours
        self.close(removed=True)
        text = _line(cause) if isinstance(cause, Exception) else cause
        raise SpilledStateError(
            f"{text}: the database at {self.path!r} of a key-group range past "
            "--task_state_memory_mb failed and is removed; the task's retry reads the range "
            "again from the checkpoint store (if it recurs, check that disk of Spark's local "
            "directory)"
        )

    @property
    def is_open(self) -> bool:
        return self._db is not None

    def close(self, *, removed: bool = False) -> None:
        """Close the database; one that fails to (its directory went while it was open) is
        dropped: its claim, if any, went with it, so the next read replays the range."""
        if self._db is not None:
            error = _close(self._claims, self._db)
            if error and not removed:
                _LOG.warning("%s; dropped the range held at %s", error, self.path)
            self._db = self._claims = None
        _OPEN[:] = [s for s in _OPEN if s is not self]


def open_spilled(slot: tuple, memory_bytes: int) -> SpilledState | None:
    """The executor's database of ``slot`` that no other worker holds, with its identity
    (None if it has none); None outside a Spark task or when every directory is held."""
    base = shared_reads.slot_dir(slot, "spilled")
    if base is None:
        return None
    os.makedirs(base, exist_ok=True)
    for n in range(DIRECTORIES_PER_RANGE):
        path = os.path.join(base, str(n))
        opened = _open(path, memory_bytes)
        if opened is not None:  # else another worker holds it
            return SpilledState(path, opened, slot)
    return None


def release_earlier() -> None:
    """Close what an earlier task of this worker left open (it failed before `release`)."""
    attempt = _attempt()
    for state in [s for s in _OPEN if s.attempt != attempt]:
        state.close()


def _attempt() -> int | None:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return None if ctx is None else ctx.taskAttemptId()


def empty_spilled(slot: tuple, memory_bytes: int) -> SpilledState | None:
    """`open_spilled`, emptied (made anew unless this open made it: a database's records
    are not read to tell whether it is empty, as a damaged table reads as none)."""
    state = open_spilled(slot, memory_bytes)
    if state is None or state.fresh:
        return state
    path = state.path
    state.close()
    shutil.rmtree(path, ignore_errors=True)
    opened = _open(path, memory_bytes)
    if opened is None:  # another worker took it meanwhile
        return None
    return SpilledState(path, opened, slot)


def release(*states) -> None:
    """A stage is done with these reads: close ``states`` (those that are spilled; none given:
    every range this worker holds); the next worker of the executor to run a range opens it."""
    for state in states or list(_OPEN):
        if isinstance(state, SpilledState):
            state.close()


def _options(memory_bytes: int) -> tuple:
    """(the database's options, its column families': the claim's, one small value)."""
    from rocksdict import BlockBasedOptions, Cache, Options

    options = Options(raw_mode=True)
    options.create_if_missing(True)  # a new range, or one whose directory went: no claim
    options.create_missing_column_families(True)
    options.set_atomic_flush(True)  # the claim's tables never run ahead of the records'
    options.set_paranoid_checks(True)
    options.set_max_open_files(-1)  # every table is opened (and checked) on open
    # Its memory is a small part of the budget: two write buffers and a block cache.
    part = max(1 << 20, min(32 << 20, memory_bytes // 16))
    options.set_write_buffer_size(part)
    options.set_max_write_buffer_number(2)
    table = BlockBasedOptions()
    table.set_block_cache(Cache(part))
    options.set_block_based_table_factory(table)
    claim = Options(raw_mode=True)
    claim.set_write_buffer_size(64 << 10)
    return options, {_CLAIMS: claim}


class _Opened(NamedTuple):
    db: Any
    claims: Any  # the database's column family of its claim
    claim: bytes | None
    fresh: bool  # made by this open


def _open(path: str, memory_bytes: int) -> _Opened | None:
    """The database at ``path`` and its claim (made anew if missing or if it does not open:
    files of it gone, cut or damaged); None if another worker holds it."""
    from rocksdict import Rdict

    cause = ""
    for _ in range(2):
        fresh = not os.path.exists(os.path.join(path, "CURRENT"))
        db = claims = None
        try:
            db = Rdict(path, *_options(memory_bytes))
            claims = db.get_column_family(_CLAIMS)
            return _Opened(db, claims, claims.get(_CLAIM), fresh)
        except Exception as e:  # rocksdict raises a bare Exception
            if os.path.join(path, "LOCK") in str(e):
                return None
            cause = _line(e)
            _close(claims, db)
            _LOG.warning("%s; replaying the range held at %s from the store", cause, path)
            shutil.rmtree(path, ignore_errors=True)
    raise OSError(
        f"{cause}: cannot make {path!r}, the database of a key-group range past "
        "--task_state_memory_mb; check the disk of Spark's local directory (SPARK_LOCAL_DIRS)"
    )


def _close(*handles) -> str | None:
    """Close a database's handles (its column families' first); the first error, if any."""
    error = None
    for handle in handles:
        try:
            if handle is not None:
                handle.close()
        except Exception as e:  # rocksdict raises a bare Exception
            error = error or _line(e)
    return error


def _line(e: Exception) -> str:
    return " ".join(str(e).split())


def _identity(raw: bytes | None, slot: tuple) -> tuple | None:
    """What a claim says the database holds, if it is a claim of ``slot``."""
    try:
        saved, m, c, staged, count, size = marshal.loads(raw)  # type: ignore[arg-type]
    except (EOFError, ValueError, TypeError):
        return None  # none, or damaged
    if saved != list(slot):
        return None  # another range's directory
    return tuple(m), tuple(c), None if staged is None else tuple(staged), count, size

"""What the Python workers of one executor share of the streaming state they read.

PySpark hands a round's task to any idle Python worker, so the worker that ran a key-group
slot last round is seldom the one that runs it next. Two kinds of files in the executor's
Spark local directory (gone with the executor) let the next worker catch up: a slot's **whole
read** (``save``/``load``), written after a whole replay or a long catch-up, and a **delta**
per staged segment (``save_delta``/``load_delta``; the last ``KEEP_DELTAS`` kept), which loads
in ~0.5 ms where replaying the segment costs ~3 us a record.

Every file is replaced whole (``os.replace``), names its slot and carries a CRC-32 of its
content (a tenth of the cost of unmarshalling it): a file cut, changed or another slot's reads
as none, and the caller replays from the store. Files are read whole, then unmarshalled
(``marshal.load`` on a file is ten times slower).
"""

from __future__ import annotations

import hashlib
import marshal
import os
import struct
import zlib
from typing import Any

KEEP_DELTAS = 16
_HEADER = struct.Struct(">4sIQ")  # magic, CRC-32 and length of the marshalled content
_MAGIC = b"sbr1"

_SEEN: dict[tuple, tuple[int, int]] = {}  # slot -> (inode, mtime) of the whole read last seen


def shared_dir() -> str | None:
    """The executor's directory for them: in Spark's first local directory; None outside."""
    local = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0]
    return os.path.join(local, "sparkbeam-state-reads") if local else None


def slot_dir(slot: tuple, kind: str = "") -> str | None:
    """The executor's directory of one key-group slot (not created), in the folder ``kind``
    (a database held on disk: "spilled") if given; None outside a task."""
    root = shared_dir()
    if root is None:
        return None
    return os.path.join(root, kind, hashlib.sha256(repr(slot).encode()).hexdigest()[:32])


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def changed(slot: tuple) -> bool:
    """Whether the slot's whole read is not the one this process last wrote or loaded."""
    directory = slot_dir(slot)
    if directory is None:
        return False
    return _stamp(os.path.join(directory, "whole")) not in (None, _SEEN.get(slot))


def load(slot: tuple) -> tuple | None:
    """(materialization, changelog, state, size, staged) of the slot's whole read, or None."""
    directory = slot_dir(slot)
    if directory is None:
        return None
    st, value = _read(os.path.join(directory, "whole"))
    if st is not None:  # a damaged file is not read again until it is replaced
        _SEEN[slot] = (st.st_ino, st.st_mtime_ns)
    try:
        saved_slot, *read = value
    except (TypeError, ValueError):
        return None
    if saved_slot != list(slot) or len(read) != 5:
        return None
    materialization, changelog, state, size, staged = read
    staged = None if staged is None else tuple(staged)
    return tuple(materialization), tuple(changelog), state, size, staged


def save(slot: tuple, materialization, changelog, state: dict, size: int, staged) -> None:
    directory = slot_dir(slot)
    if directory is None:
        return
    path = os.path.join(directory, "whole")
    staged = None if staged is None else list(staged)
    value = (list(slot), list(materialization), list(changelog), state, size, staged)
    if _write(path, value):
        stamp = _stamp(path)
        if stamp is not None:
            _SEEN[slot] = stamp


def save_delta(slot: tuple, segment: str, changes: dict[bytes, bytes | None]) -> None:
    """The slot's changes staged in ``segment`` (None: deleted); drops the oldest deltas."""
    directory = slot_dir(slot)
    value = (list(slot), segment, changes)
    if directory is None or not _write(_delta_path(directory, segment), value):
        return
    try:
        deltas = [e for e in os.scandir(directory) if e.name.startswith("delta-")]
        if len(deltas) > KEEP_DELTAS:
            deltas.sort(key=lambda e: e.stat().st_mtime_ns)
            for old in deltas[: len(deltas) - KEEP_DELTAS]:
                os.remove(old.path)
    except OSError:
        pass  # another worker removed it first


def load_delta(slot: tuple, segment: str) -> dict[bytes, bytes | None] | None:
    directory = slot_dir(slot)
    if directory is None:
        return None
    try:
        saved_slot, saved, changes = _read(_delta_path(directory, segment))[1]
    except (TypeError, ValueError):
        return None
    return changes if (saved_slot, saved) == (list(slot), segment) else None


def _delta_path(directory: str, segment: str) -> str:
    return os.path.join(directory, "delta-" + hashlib.sha256(segment.encode()).hexdigest()[:32])


def _write(path: str, value) -> bool:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        partial = f"{path}.{os.getpid()}"
        blob = marshal.dumps(value)
        with open(partial, "wb") as f:
            f.write(_HEADER.pack(_MAGIC, zlib.crc32(blob), len(blob)))
            f.write(blob)
        os.replace(partial, path)  # whole or not at all, for a worker reading it now
        return True
    except OSError:
        return False  # sharing only saves a replay


def _read(path: str) -> tuple[os.stat_result | None, Any]:
    """(its stat, its value) of a file `_write` wrote; value None if missing, cut or changed
    (stat None if missing)."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            blob = f.read()
    except OSError:
        return None, None
    if len(blob) < _HEADER.size:
        return st, None
    magic, crc, length = _HEADER.unpack_from(blob)
    content = memoryview(blob)[_HEADER.size :]
    if magic != _MAGIC or length != len(content) or zlib.crc32(content) != crc:
        return st, None  # cut, changed, or of an older layout
    try:
        return st, marshal.loads(content)
    except (EOFError, ValueError, TypeError):
        return st, None

"""Materialization: a full snapshot of a state table, one Arrow IPC file per key-group range.

Owns: writing a snapshot (`write_materialization`, and a task-owned range's `write_snapshot`)
and reading back only a caller's key groups (`read_materialization`). A file holds the columns
``kg``, ``namespace``, ``key`` and ``value``; the manifest names it with its size, crc32 and
row count, so a damaged file is detected before use. Leaves to others: when to materialize.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from sparkbeam.checkpoint.errors import CheckpointCorruptError
from sparkbeam.checkpoint.filesystem import Storage, checksum, read_checked
from sparkbeam.checkpoint.ids import FileEntry
from sparkbeam.checkpoint.keygroups import KeyGroupRange, key_group_range
from sparkbeam.checkpoint.state_table import Entry, StateTable

SCHEMA = pa.schema(
    [
        ("kg", pa.uint16()),
        ("namespace", pa.string()),
        ("key", pa.binary()),
        ("value", pa.binary()),
    ]
)
DEFAULT_FILES = 8


# zstd buffers: the namespace repeated on every row, keys and encoded cells shrink to about
# 1.1x the live values (2.3x uncompressed); any pyarrow reads them (older files: uncompressed).
_COMPRESSED = pa.ipc.IpcWriteOptions(compression="zstd")


def _write(
    storage: Storage, directory: str, name: str, batch: pa.RecordBatch, start: int, stop: int
) -> FileEntry:
    """Write ``batch``, rows of key groups ``[start, stop)``, as the Arrow file ``name``."""
    sink = io.BytesIO()
    with pa.ipc.new_file(sink, SCHEMA, options=_COMPRESSED) as writer:
        writer.write_batch(batch)
    data = sink.getvalue()
    storage.write(f"{directory}/{name}", data)
    return FileEntry(name, len(data), checksum(data), batch.num_rows, start, stop)


def write_materialization(
    storage: Storage,
    directory: str,
    table: StateTable,
    files: int = DEFAULT_FILES,
) -> list[FileEntry]:
    """Write ``table`` under ``materializations/mat-<random>/``, a file per key-group range."""
    m = table.max_key_groups
    n = max(1, min(files, m))
    ranges = [key_group_range(i, n, m) for i in range(n)]
    subdir = f"materializations/mat-{uuid.uuid4().hex[:12]}"
    buckets: list[tuple[list, list, list, list]] = [([], [], [], []) for _ in ranges]
    for kg, ns, key, value in table.snapshot():
        b = buckets[kg * n // m]  # ``ranges[i]``, `key_group_range(i, n, m)`, holds kg
        b[0].append(kg)
        b[1].append(ns)
        b[2].append(key)
        b[3].append(value)
    entries = []
    for r, columns in zip(ranges, buckets):
        batch = pa.record_batch(list(columns), schema=SCHEMA)  # the schema's types
        name = f"{subdir}/kg-{r.start:05d}-{r.stop:05d}.arrow"
        entries.append(_write(storage, directory, name, batch, r.start, r.stop))
    return entries


def write_snapshot(
    storage: Storage,
    directory: str,
    prefix: str,
    namespace: str,
    start: int,
    stop: int,
    columns: tuple[list[int], list[bytes], list[bytes]],
) -> FileEntry:
    """One namespace's rows, ``columns`` of (key group, key, value), of key groups
    ``[start, stop)``, sorted by key group, as a task-owned range's snapshot file
    ``<prefix>snap-<random>-kg-<start>-<stop>.arrow`` (`task_state`)."""
    kgs, keys, values = columns
    namespaces = pa.repeat(pa.scalar(namespace, pa.string()), len(kgs))
    batch = pa.record_batch([kgs, namespaces, keys, values], schema=SCHEMA)
    if len(kgs) > 1:  # stable: equal key groups keep their order
        batch = batch.take(pc.sort_indices(batch.column("kg")))
    name = f"{prefix}snap-{uuid.uuid4().hex[:12]}-kg-{start:05d}-{stop:05d}.arrow"
    return _write(storage, directory, name, batch, start, stop)


def read_materialization(
    storage: Storage, path: str, entry: FileEntry, key_groups: KeyGroupRange | None = None
) -> Iterator[Entry]:
    """Check one file against its manifest entry and yield its rows in ``key_groups``."""
    data = read_checked(storage, path, entry)
    try:
        arrow = pa.ipc.open_file(pa.BufferReader(data)).read_all()
    except (pa.ArrowInvalid, OSError) as e:
        raise CheckpointCorruptError(path, f"unreadable Arrow IPC file ({e})") from None
    if arrow.num_rows != entry.records or arrow.schema != SCHEMA:
        raise CheckpointCorruptError(
            path, f"has {arrow.num_rows} rows, the manifest says {entry.records}"
        )
    rows = zip(*(arrow.column(name).to_pylist() for name in SCHEMA.names))
    if key_groups is None:
        yield from rows
        return
    lo, hi = key_groups.start, key_groups.stop
    for row in rows:
        if lo <= row[0] < hi:
            yield row

"""Identifiers and small value types shared by the checkpoint store modules.

Owns: the `NewType` ids and the frozen dataclasses that cross module (and process) boundaries.
Leaves to others: how those values are stored (`manifest`), computed (`keygroups`) or used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NewType

PipelineId = NewType("PipelineId", str)
"""One independent pipeline of a job: it has its own chain of checkpoints."""

CheckpointId = NewType("CheckpointId", int)
"""The number of a committed checkpoint within one pipeline, 1, 2, 3, ... (monotonic)."""

KeyGroup = NewType("KeyGroup", int)
"""A bucket of keys, ``stable_hash(key) % max_key_groups``: the unit of rescaling."""


@dataclass(frozen=True)
class FileEntry:
    """One immutable data file named by a manifest or a commit message."""

    name: str
    """Path relative to the pipeline's directory in the store."""
    size: int
    checksum: str
    """``crc32:xxxxxxxx`` of the whole file."""
    records: int = 0
    kg_start: int = 0
    """First key group covered (0 with ``kg_stop`` 0: not recorded, any may be held)."""
    kg_stop: int = 0
    """One past the last key group covered: a reader skips a file of none of its key groups."""

    def to_json(self) -> dict:
        return dict(vars(self))  # the fields, in order

    @classmethod
    def from_json(cls, d: dict) -> FileEntry:
        return cls(
            name=str(d["name"]),
            size=int(d["size"]),
            checksum=str(d["checksum"]),
            records=int(d.get("records", 0)),
            kg_start=int(d.get("kg_start", 0)),
            kg_stop=int(d.get("kg_stop", 0)),
        )

    def to_row(self) -> list:
        """The compact form of a manifest's long lists (a task-owned log): no field names."""
        return [self.name, self.size, self.checksum, self.records, self.kg_start, self.kg_stop]

    @classmethod
    def from_row(cls, v: list) -> FileEntry:
        name, size, crc, records, start, stop = v
        return cls(str(name), int(size), str(crc), int(records), int(start), int(stop))

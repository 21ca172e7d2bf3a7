"""The checkpoint manifest: the one small file that makes a checkpoint real.

Owns: the `Manifest` record, its JSON encoding with a checksum over the content, and manifest
file names. A manifest is written atomically and LAST, after every file it names is durable.
Leaves to others: writing the files it names and the commit protocol (`commit`).
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from sparkbeam.checkpoint.errors import CheckpointCorruptError
from sparkbeam.checkpoint.filesystem import checksum
from sparkbeam.checkpoint.ids import CheckpointId, FileEntry, PipelineId
from sparkbeam.checkpoint.task_state import TaskState

FORMAT = "sparkbeam-checkpoint-manifest"
VERSION = 2
READABLE_VERSIONS = (1, 2)
# 1: every namespace in ``materialization`` + ``changelog``: written by state layouts 1-5, read
#    for its metadata only (a restore refuses its layout; its ``task_state`` reads as empty).
# 2: task-owned namespaces in ``task_state`` (`task_state`); the driver's files hold the rest.
MANIFEST_DIR = "manifests"
_NAME = re.compile(r"^chk-(\d{10})\.json$")


def manifest_name(checkpoint_id: int) -> str:
    """``manifests/chk-0000000042.json`` (relative to the pipeline directory)."""
    return f"{MANIFEST_DIR}/chk-{checkpoint_id:010d}.json"


def parse_manifest_name(name: str) -> CheckpointId | None:
    """The checkpoint id of a manifest file name (basename), or None if it is not one."""
    m = _NAME.match(name.rsplit("/", 1)[-1])
    return CheckpointId(int(m.group(1))) if m else None


@dataclass(frozen=True)
class Manifest:
    """Everything needed to restore one checkpoint of one pipeline."""

    pipeline_id: PipelineId
    checkpoint_id: CheckpointId
    created: float
    fingerprint: str
    parallelism: int
    max_key_groups: int
    materialization: tuple[FileEntry, ...] = ()
    """Full snapshot files; empty when no materialization precedes the changelog."""
    changelog: tuple[FileEntry, ...] = ()
    """Segments after the materialization, in replay order."""
    completed: frozenset[str] = frozenset()
    source_positions: dict[str, bytes] = field(default_factory=dict)
    entries: int = 0
    """Number of state entries at this checkpoint."""
    metadata: dict[str, Any] = field(default_factory=dict)
    commits: tuple[tuple[str, int, int, int], ...] = ()
    """(stage, round, partition, attempt) of the task attempts this checkpoint committed."""
    task_state: TaskState = field(default_factory=TaskState)
    """Handles of the task-owned namespaces."""

    @cached_property
    def files(self) -> tuple[FileEntry, ...]:
        return self.materialization + self.changelog + self.task_state.files()

    @cached_property
    def file_names(self) -> frozenset[str]:
        return frozenset(f.name for f in self.files)

    @property
    def materialization_bytes(self) -> int:
        return sum(f.size for f in self.materialization)

    @property
    def changelog_bytes(self) -> int:
        return sum(f.size for f in self.changelog)

    def to_json(self) -> dict:
        return {
            "pipeline_id": self.pipeline_id,
            "checkpoint_id": self.checkpoint_id,
            "created": self.created,
            "fingerprint": self.fingerprint,
            "parallelism": self.parallelism,
            "max_key_groups": self.max_key_groups,
            "materialization": [f.to_json() for f in self.materialization],
            "changelog": [f.to_json() for f in self.changelog],
            "completed": sorted(self.completed),
            "source_positions": {
                k: base64.b64encode(v).decode("ascii")
                for k, v in sorted(self.source_positions.items())
            },
            "entries": self.entries,
            "metadata": self.metadata,
            "commits": [list(c) for c in self.commits],
            "task_state": self.task_state.to_json(),
        }

    @classmethod
    def from_json(cls, d: dict) -> Manifest:
        return cls(
            pipeline_id=PipelineId(str(d["pipeline_id"])),
            checkpoint_id=CheckpointId(int(d["checkpoint_id"])),
            created=float(d["created"]),
            fingerprint=str(d["fingerprint"]),
            parallelism=int(d["parallelism"]),
            max_key_groups=int(d["max_key_groups"]),
            materialization=tuple(FileEntry.from_json(f) for f in d["materialization"]),
            changelog=tuple(FileEntry.from_json(f) for f in d["changelog"]),
            completed=frozenset(str(m) for m in d["completed"]),
            source_positions={
                str(k): base64.b64decode(v) for k, v in d["source_positions"].items()
            },
            entries=int(d.get("entries", 0)),
            metadata=dict(d.get("metadata", {})),
            commits=tuple((str(s), int(r), int(p), int(a)) for s, r, p, a in d.get("commits", [])),
            task_state=TaskState.from_json(d["task_state"]) if "task_state" in d else TaskState(),
        )


def _canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def encode_manifest(manifest: Manifest) -> bytes:
    """JSON bytes with a crc32 over the canonical encoding of the content."""
    body = _canonical(manifest.to_json())  # encoded once: the checksum's bytes are the doc's
    head = json.dumps({"checksum": checksum(body), "format": FORMAT}, sort_keys=True)[:-1]
    return b'%s, "manifest": %s, "version": %d}' % (head.encode(), body, VERSION)


def decode_manifest(data: bytes, path: str) -> Manifest:
    """Parse and check a manifest; raises `CheckpointCorruptError` naming ``path``."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointCorruptError(path, f"manifest is not valid JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointCorruptError(path, "not a sparkbeam checkpoint manifest")
    if doc.get("version") not in READABLE_VERSIONS:
        raise CheckpointCorruptError(
            path,
            f"manifest version {doc.get('version')!r} is not supported (expected {VERSION})",
            "Restore it with the sparkbeam version that wrote it.",
        )
    body = doc.get("manifest")
    if not isinstance(body, dict):
        raise CheckpointCorruptError(path, "manifest body is missing")
    actual = checksum(_canonical(body))
    if actual != doc.get("checksum"):
        raise CheckpointCorruptError(
            path, f"manifest checksum {actual} does not match the stored {doc.get('checksum')}"
        )
    try:
        return Manifest.from_json(body)
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointCorruptError(path, f"manifest field is missing or invalid ({e})") from None

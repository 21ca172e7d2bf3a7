"""Startpoints: operator-set start positions for sources, stored out of band.

Owns: the `Startpoint` record -- keyed by (pipeline, source transform, optional element key),
of kind offset / timestamp / oldest / upcoming -- and set/get/list/delete in the store's
``startpoints/`` directory, one JSON file per pipeline, written atomically; never in a
checkpoint, which is for fault tolerance and not edited by people. A startpoint's `token` (its
key plus creation time) lets a run delete exactly the one it consumed, never a newer one. One a
run could not apply stays, marked ``failed``, so every later start refuses it at once. Leaves
to others: fanning them out at job start and deleting them once the next checkpoint commits
(`sparkbeam.sdf.startpoints.session`).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from sparkbeam.checkpoint.errors import CheckpointCorruptError
from sparkbeam.checkpoint.filesystem import Storage
from sparkbeam.checkpoint.ids import PipelineId
from sparkbeam.checkpoint.layout import STARTPOINTS, decode_component, encode_component


class StartpointKind(Enum):
    """Where a source starts reading."""

    OFFSET = "offset"
    """At ``position`` (a source-specific offset string)."""
    TIMESTAMP = "timestamp"
    """At the first record at or after ``position`` (epoch milliseconds as a string)."""
    OLDEST = "oldest"
    """At the oldest available record."""
    UPCOMING = "upcoming"
    """At the next record to arrive."""


@dataclass(frozen=True)
class Startpoint:
    """A start position for one source (optionally one element/split of it) of a pipeline."""

    pipeline_id: PipelineId
    source: str
    """The source transform's unique name."""
    kind: StartpointKind
    position: str | None = None
    element_key: bytes | None = None
    """The encoded element (e.g. a partition) it applies to; None: the whole source."""
    created: float = 0.0
    failed: str | None = None
    """Why a run could not apply it (the error it raised); every start refuses it until it is
    deleted or set again (a new token). Not part of the token."""

    def __post_init__(self) -> None:
        needs = self.kind in (StartpointKind.OFFSET, StartpointKind.TIMESTAMP)
        if needs != (self.position is not None):
            raise ValueError(
                f"Startpoint of kind {self.kind.value!r} for source {self.source!r} "
                + ("needs a position." if needs else "takes no position.")
            )

    @property
    def key(self) -> tuple[str, bytes | None]:
        return (self.source, self.element_key)

    @property
    def token(self) -> str:
        """Identifies this startpoint exactly: setting the same key again makes a new token."""
        raw = repr((self.source, self.element_key, self.kind.value, self.position, self.created))
        return hashlib.blake2b(raw.encode(), digest_size=8).hexdigest()

    @property
    def element_key_text(self) -> str | None:
        """The element key as text (it is the UTF-8 of the element's startpoint key)."""
        return None if self.element_key is None else self.element_key.decode("utf-8", "replace")

    def to_json(self) -> dict:
        return {
            "source": self.source,
            "kind": self.kind.value,
            "position": self.position,
            "element_key": None
            if self.element_key is None
            else base64.b64encode(self.element_key).decode(),
            "created": self.created,
            **({} if self.failed is None else {"failed": self.failed}),
        }

    @classmethod
    def from_json(cls, pipeline_id: str, d: dict) -> Startpoint:
        ek = d.get("element_key")
        return cls(
            pipeline_id=PipelineId(pipeline_id),
            source=d["source"],
            kind=StartpointKind(d["kind"]),
            position=d.get("position"),
            element_key=None if ek is None else base64.b64decode(ek),
            created=float(d.get("created", 0.0)),
            failed=d.get("failed"),
        )


class Startpoints:
    """The startpoints of all pipelines in one store."""

    def __init__(self, storage: Storage):
        self.storage = storage

    def _path(self, pipeline_id: str) -> str:
        return f"{STARTPOINTS}/{encode_component(pipeline_id)}.json"

    def _load(self, pipeline_id: str) -> list[Startpoint]:
        path = self._path(pipeline_id)
        try:
            doc = json.loads(self.storage.read(path))
            return [Startpoint.from_json(pipeline_id, d) for d in doc["startpoints"]]
        except FileNotFoundError:
            return []
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointCorruptError(
                f"{self.storage.url}/{path}",
                f"startpoints file is unreadable ({e})",
                "Delete the file and set the startpoints again.",
            ) from None

    def _save(self, pipeline_id: str, items: list[Startpoint]) -> None:
        path = self._path(pipeline_id)
        if not items:
            self.storage.delete(path)
            return
        doc = {"startpoints": [s.to_json() for s in sorted(items, key=_sort_key)]}
        self.storage.write(path, json.dumps(doc, indent=1).encode())

    def set(
        self,
        pipeline_id: str,
        source: str,
        kind: StartpointKind | str,
        position: str | None = None,
        element_key: bytes | None = None,
    ) -> Startpoint:
        """Add or replace the startpoint for (pipeline, source, element_key)."""
        sp = Startpoint(
            PipelineId(pipeline_id), source, StartpointKind(kind), position, element_key,
            time.time(),
        )  # fmt: skip
        self.update(pipeline_id, add=[sp])
        return sp

    def update(
        self,
        pipeline_id: str,
        add: Iterable[Startpoint] = (),
        remove_tokens: Iterable[str] = (),
    ) -> list[Startpoint]:
        """In one atomic write, drop ``remove_tokens``, then add or replace ``add`` (with its own
        ``created``: fan-out copies keep the operator's time); returns the ones removed."""
        tokens = set(remove_tokens)
        new = {s.key: s for s in add}
        items = self._load(pipeline_id)
        removed = [s for s in items if s.token in tokens]
        rest = [s for s in items if s.token not in tokens and s.key not in new]
        if removed or new:
            self._save(pipeline_id, [*rest, *new.values()])
        return removed

    def mark_failed(self, token: str, error: str) -> Startpoint | None:
        """Record that applying the startpoint ``token`` failed with ``error``; None if gone."""
        for pipeline_id in self._pipelines():
            items = self._load(pipeline_id)
            hit = next((s for s in items if s.token == token), None)
            if hit is not None:
                marked = dataclasses.replace(hit, failed=error)
                self._save(pipeline_id, [marked if s is hit else s for s in items])
                return marked
        return None

    def get(
        self, pipeline_id: str, source: str, element_key: bytes | None = None
    ) -> Startpoint | None:
        return next((s for s in self._load(pipeline_id) if s.key == (source, element_key)), None)

    def list(self, pipeline_id: str | None = None) -> list[Startpoint]:
        """Startpoints of one pipeline, or of all pipelines."""
        if pipeline_id is not None:
            return sorted(self._load(pipeline_id), key=_sort_key)
        return [sp for pid in self._pipelines() for sp in self.list(pid)]

    def _pipelines(self) -> tuple[str, ...]:
        """Pipelines that have a startpoints file."""
        names = (path.rsplit("/", 1)[-1] for path in self.storage.list(STARTPOINTS))
        return tuple(decode_component(n[: -len(".json")]) for n in names if n.endswith(".json"))

    def delete(self, pipeline_id: str, source: str, element_key: bytes | None = None) -> bool:
        """Remove one startpoint; False if there was none."""
        items = self._load(pipeline_id)
        rest = [s for s in items if s.key != (source, element_key)]
        if len(rest) != len(items):
            self._save(pipeline_id, rest)
        return len(rest) != len(items)


def check_position(kind: StartpointKind | str, position: str | None) -> None:
    """Refuse, at ``set`` time, an offset that is no non-negative integer or a timestamp that is
    no epoch milliseconds (a source with its own positions sets them through the API)."""
    kind = StartpointKind(kind)
    if position is None:
        return  # a missing position is the record's own check (it names the kind)
    text = position.strip()
    if kind is StartpointKind.OFFSET and not text.isdigit():
        raise ValueError(
            f"Startpoint offset {position!r} is not a non-negative integer: an offset counts "
            "records from the start of the source, e.g. --value 0 to replay everything."
        )
    if kind is StartpointKind.TIMESTAMP and not text.lstrip("-").isdigit():
        raise ValueError(
            f"--value {position!r} is not a timestamp: give epoch milliseconds, e.g. "
            f"--value {int(time.time() * 1000)}."
        )


def _sort_key(s: Startpoint) -> tuple:
    return (s.pipeline_id, s.source, s.element_key is not None, s.element_key or b"")

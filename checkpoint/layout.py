"""Where things live in a store (paths relative to the store root).

Owns: the directory layout, in one place::

    _LOCK.json                                   write lock (`lock`)
    startpoints/<pipeline>.json                  operator-set start positions (`startpoints`)
    pipelines/<pipeline>/manifests/chk-<id>.json one per committed checkpoint (`manifest`)
    pipelines/<pipeline>/changelog/*.seg         the driver's changelog segments (`changelog`)
    pipelines/<pipeline>/staged/<stage>/r<round>/p<partition>-a<attempt>-*.seg   task output
      (a snapshot a task writes in the background is named ...-late-snap-*.arrow, for the
      last round that may commit it: swept after that round as any uncommitted file)
    pipelines/<pipeline>/materializations/mat-*/kg-<start>-<stop>.arrow          snapshots

Pipeline and stage ids are percent-encoded into one path component. Leaves to others: the
contents of those files.
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

PIPELINES = "pipelines"
STARTPOINTS = "startpoints"
_STAGED = re.compile(r"^staged/([^/]+)/r(\d+)/")


def encode_component(name: str) -> str:
    """A safe single path component for an arbitrary id (never empty, never ``.``/``..``)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"id {name!r} must be a non-empty string.")
    enc = quote(name, safe="-_.")
    return enc.replace(".", "%2E") if enc in (".", "..") else enc


def decode_component(component: str) -> str:
    return unquote(component)


def pipeline_dir(pipeline_id: str) -> str:
    return f"{PIPELINES}/{encode_component(pipeline_id)}"


def staged_prefix(stage: str, round: int, partition: int, attempt: int) -> str:
    """Name prefix (relative to the pipeline dir) of one task attempt's staged segments."""
    return f"staged/{encode_component(stage)}/r{round:08d}/p{partition:05d}-a{attempt:03d}-"


def background_prefix(stage: str, last_round: int, partition: int, attempt: int) -> str:
    """Name prefix of a task attempt's background snapshot, for the last round that may commit
    it: swept after it, as any staged file no checkpoint names."""
    return staged_prefix(stage, last_round, partition, attempt) + "late-"


def staged_round(name: str) -> tuple[str, int] | None:
    """(stage, round) of a staged file name relative to the pipeline dir, else None."""
    m = _STAGED.match(name)
    return (decode_component(m.group(1)), int(m.group(2))) if m else None

"""Exceptions of startpoint application: what is wrong with a startpoint and what to do.

Owns: the two failures an operator can act on at job start or when a startpoint meets a
restriction. Leaves to others: deciding when to raise (`startpoints`, `startpoint_restrictions`).
"""

from __future__ import annotations

from collections.abc import Iterable


class StartpointError(ValueError):
    """A startpoint names something this job does not have, or has a malformed position."""


class UnknownStartpointTransformError(StartpointError):
    """A startpoint names a transform (or pipeline) that is not an SDF source of this job."""

    def __init__(
        self, pipeline_id: str, source: str, known: Iterable[str], what: str = "transform"
    ):
        self.pipeline_id = pipeline_id
        self.source = source
        names = ", ".join(repr(k) for k in sorted(known)) or "none"
        super().__init__(
            f"A startpoint names {what} {source!r} in pipeline {pipeline_id!r}, which is not a "
            f"splittable-DoFn source of this job. Known {what}s: {names}. Delete it with "
            f"`sparkbeam startpoints delete --pipeline {pipeline_id} --transform {source} ...`, "
            "or set it on one of the known names (`sparkbeam plan` prints them)."
        )


class UnsupportedStartpointError(StartpointError):
    """The source's restriction provider cannot honour this kind of startpoint."""

    def __init__(self, source: str, kind: str, reason: str, action: str):
        self.source = source
        self.kind = kind
        super().__init__(
            f"Startpoint of kind {kind!r} for transform {source!r} cannot be applied: {reason}. "
            f"{action}"
        )

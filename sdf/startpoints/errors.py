"""Exceptions of startpoint application: what is wrong with a startpoint and what to do.

Owns: the failures an operator can act on at job start or when a startpoint meets a
restriction (in a task: `StartpointApplyError`, which the driver finds in a worker's traceback,
`startpoint_failure`). Leaves to others: deciding when to raise (`session`, `restrictions`).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from typing import Any


class StartpointError(ValueError):
    """A startpoint names something this job does not have, or has a malformed position."""


class UnknownStartpointTransformError(StartpointError):
    """A startpoint names a transform that is not an SDF source of its pipeline in this job."""

    def __init__(self, pipeline_id: str, source: str, known: Iterable[str]):
        self.pipeline_id = pipeline_id
        self.source = source
        names = ", ".join(repr(k) for k in sorted(known)) or "none"
        super().__init__(
            f"A startpoint names transform {source!r} in pipeline {pipeline_id!r}, which is not a "
            f"splittable-DoFn source of this job. Known transforms: {names}. Delete it with "
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


_TOKEN_TAG = re.compile(r"\s*\[startpoint token ([0-9a-f]+)\]\s*$")
_APPLY_ERROR = re.compile(r"StartpointApplyError: (.*\[startpoint token [0-9a-f]+\])")


class StartpointApplyError(StartpointError):
    """Task side: applying one startpoint to one element raised; names it and how to delete it.

    The message is one line (the driver finds it in the worker's traceback text) ending in a
    ``[startpoint token ...]`` tag, so the driver can mark exactly that startpoint failed."""

    def __init__(self, sp: Any, store_url: str, element: str, cause: BaseException) -> None:
        self.token = sp.token
        what = f"{sp.kind.value}" + ("" if sp.position is None else f" {sp.position}")
        whose = "" if sp.element_key is None else f"element {sp.element_key_text!r} of "
        cause_text = " ".join(f"{type(cause).__name__}: {cause}".split())
        super().__init__(
            f"Startpoint {what} for {whose}transform {sp.source!r} in pipeline "
            f"{sp.pipeline_id!r} failed to apply to element {element!r}: {cause_text}. Every "
            f"start refuses it until it is deleted: `{delete_command(sp, store_url)}`; then set "
            "one the source's restriction provider can apply (or fix its "
            f"restriction_for_startpoint). [startpoint token {sp.token}]"
        )


class StartpointFailedError(StartpointError):
    """Driver side: a startpoint failed to apply; the run stops (restoring cannot help)."""

    def __init__(self, message: str, token: str | None = None, detail: str = "") -> None:
        self.token = token
        self.summary = message
        super().__init__(message + (f"\n{detail}" if detail else ""))


def delete_command(sp: Any, store_url: str) -> str:
    """The exact CLI command that deletes startpoint ``sp`` from the store at ``store_url``."""
    parts = [
        "sparkbeam startpoints delete",
        f"--checkpoint_dir {shlex.quote(store_url or '<checkpoint_dir>')}",
        f"--pipeline {shlex.quote(sp.pipeline_id)}",
        f"--transform {shlex.quote(sp.source)}",
    ]
    if sp.element_key is not None:
        parts.append(f"--key {shlex.quote(sp.element_key_text)}")
    return " ".join(parts)


def startpoint_failure(traceback_text: str) -> StartpointFailedError | None:
    """The `StartpointApplyError` in a worker's traceback text, as the driver's error."""
    match = _APPLY_ERROR.search(traceback_text)
    if match is None:
        return None
    line = match.group(1)
    token = _TOKEN_TAG.search(line)
    return StartpointFailedError(_TOKEN_TAG.sub("", line), token.group(1) if token else None)

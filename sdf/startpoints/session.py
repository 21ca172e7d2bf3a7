"""Driver side of startpoints: fan-out at start, assignments per round, delete on commit.

Lifecycle of one independent pipeline's startpoints over one run (`StartpointSession`):

1. `fan_out` at start or restore: delete what the restored checkpoint already consumed (its
   metadata names the tokens), check every startpoint names an SDF source of the plan with a kind
   its provider can honour, copy a transform-level startpoint to each element pending in the
   restored state, and report startpoints older than ``max_age_s``.
2. `assignment(stage)` before each round of an SDF process stage: per-element startpoints, plus
   the transform-level one while its fan-out is open (the stage's first round in this run).
3. `prepare_commit(outcomes)` before the round's checkpoint: write a per-element copy for each
   element that met the transform-level startpoint with no data at its position; returns the
   checkpoint metadata naming the consumed tokens.
4. `committed()` after the checkpoint commits: delete exactly the consumed tokens and close the
   fan-out.

So an element that saw no data keeps its startpoint, an element that appears after the fan-out
closed gets none, and a crash between 3 and 4 is repaired by step 1 at the next start: a
consumed startpoint is never applied twice. Leaves to others: applying (`applier`), the hooks
(`restrictions`), storage (`sparkbeam.checkpoint.startpoints`), when to call these (the runner).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from sparkbeam.checkpoint import state_layout
from sparkbeam.checkpoint.startpoints import Startpoint, Startpoints
from sparkbeam.sdf.startpoints.applier import (
    SdfSource,
    StartpointApplier,
    StartpointAssignment,
    StartpointOutcome,
    restriction_provider,
    sdf_source,
)
from sparkbeam.sdf.startpoints.errors import (
    StartpointError,
    UnknownStartpointTransformError,
    UnsupportedStartpointError,
)
from sparkbeam.sdf.startpoints.restrictions import check_supported

__all__ = [
    "CONSUMED_METADATA_KEY",
    "DEFAULT_MAX_AGE_S",
    "StartpointApplier",
    "StartpointAssignment",
    "StartpointError",
    "StartpointOutcome",
    "StartpointSession",
    "UnknownStartpointTransformError",
    "UnsupportedStartpointError",
    "check_pipelines",
    "fan_out",
    "sdf_sources",
    "stale_startpoints",
]

_LOG = logging.getLogger(__name__)

CONSUMED_METADATA_KEY = "startpoints_consumed"
"""Checkpoint-manifest metadata key: tokens of the startpoints that checkpoint reflects."""

DEFAULT_MAX_AGE_S = 7 * 24 * 3600.0


def sdf_sources(plan: Any, pipeline_id: str | None = None) -> dict[str, SdfSource]:
    """SDF sources of a plan (or of one of its pipelines), by the name ``--transform`` takes."""
    out = {}
    for stage in plan.stages:
        if stage.is_sdf_process and pipeline_id in (None, stage.pipeline):
            source = sdf_source(stage)
            if source is not None:
                out[source.source] = source
    return out


def check_pipelines(startpoints: Startpoints, plan: Any) -> None:
    """Fail if a startpoint names a pipeline this job does not have (it would never apply)."""
    known = {p.id for p in plan.pipelines}
    for sp in startpoints.list():
        if sp.pipeline_id not in known:
            names = ", ".join(repr(k) for k in sorted(known))
            raise StartpointError(
                f"A startpoint for transform {sp.source!r} names pipeline {sp.pipeline_id!r}, "
                f"which this job does not have (its pipelines: {names}). Delete it with "
                f"`sparkbeam startpoints delete --pipeline {sp.pipeline_id} --transform "
                f"{sp.source} ...`, or set it on one of these pipelines (`sparkbeam plan` "
                "prints them)."
            )


def check_sources(
    pipeline_id: str, sources: Mapping[str, SdfSource], startpoints: Iterable[Startpoint]
) -> None:
    """Every startpoint names one of the pipeline's SDF ``sources``, with a kind its restriction
    provider can honour; else `UnknownStartpointTransformError` or `UnsupportedStartpointError`."""
    providers: dict[str, Any] = {}  # a source's DoFn is unpickled once
    for sp in startpoints:
        if sp.source not in sources:
            raise UnknownStartpointTransformError(pipeline_id, sp.source, sources)
        if sp.source not in providers:
            providers[sp.source] = restriction_provider(sources[sp.source])
        check_supported(providers[sp.source], sp.source, sp)


def stale_startpoints(
    startpoints: Iterable[Startpoint], max_age_s: float, now: float | None = None
) -> list[str]:
    """One warning per startpoint older than ``max_age_s``: reported, never silently dropped."""
    now = time.time() if now is None else now
    out = []
    for sp in startpoints:
        age = now - sp.created
        if age > max_age_s:
            key = f" key {sp.element_key_text!r}" if sp.element_key is not None else ""
            out.append(
                f"Startpoint {sp.kind.value!r} for transform {sp.source!r}{key} of pipeline "
                f"{sp.pipeline_id!r} was set {age / 3600:.1f} h ago and is still pending (its "
                "element has had no data at that position). Delete it with `sparkbeam "
                "startpoints delete` if it is no longer wanted."
            )
    return out


def fan_out(
    startpoints: Startpoints,
    plan: Any,
    pipeline_id: str,
    *,
    restored_metadata: Mapping[str, Any] | None = None,
    restored_state: Any = None,
    max_age_s: float = DEFAULT_MAX_AGE_S,
    now: float | None = None,
) -> StartpointSession:
    """Step 1 of the lifecycle, for one pipeline at job start (no ``restored_*``) or restore:
    the checkpoint's metadata, and its `PipelineStore`, whose pending residuals a
    transform-level startpoint fans out to."""
    sources = sdf_sources(plan, pipeline_id)
    # Step 1. Finish a deletion a crash interrupted: the restored checkpoint consumed these.
    tokens = list((restored_metadata or {}).get(CONSUMED_METADATA_KEY, ()))
    for sp in startpoints.update(pipeline_id, remove_tokens=tokens):
        _LOG.info("Startpoint for %r already consumed by the restored checkpoint", sp.source)
    # Step 2. Every startpoint names a known SDF source, with a kind it can honour.
    current = startpoints.list(pipeline_id)
    check_sources(pipeline_id, sources, current)
    session = StartpointSession(startpoints, pipeline_id, sources, current)
    # Step 3. A transform-level startpoint becomes one entry per element pending at restore, and
    # is deleted in the same atomic write: elements that appear later get nothing.
    if restored_state is not None:
        copies, fanned = [], []
        for name, default in session.defaults.items():
            keys = _pending_keys(plan.stage(sources[name].stage), plan.components, restored_state)
            if keys:
                explicit = session.explicit[name]
                copies += [session.copy_for(default, k) for k in keys if k not in explicit]
                fanned.append(default)
        if fanned:
            startpoints.update(pipeline_id, add=copies, remove_tokens=[d.token for d in fanned])
            session.add_explicit(copies)
            for d in fanned:
                del session.defaults[d.source]
    # Step 4. Report what has waited too long.
    session.warnings = stale_startpoints(session.all(), max_age_s, now)
    for w in session.warnings:
        _LOG.warning("%s", w)
    return session


def _pending_keys(stage: Any, components: bytes, state: Any) -> list[str]:
    applier = StartpointApplier(stage, components, StartpointAssignment(stage.id, ""))
    keys = []
    for value in state.read_task_owned(state_layout.sdf_residual(stage.id)).values():
        _, element, _, _, _ = state_layout.decode_residual(value)
        keys.append(applier.element_key_of(element))
    return sorted(set(keys))


class StartpointSession:
    """One pipeline's startpoints over one run (see the module docstring for the steps)."""

    def __init__(
        self,
        startpoints: Startpoints,
        pipeline_id: str,
        sources: Mapping[str, SdfSource],
        current: list[Startpoint],
    ) -> None:
        self.startpoints = startpoints
        self.pipeline_id = pipeline_id
        self.sources = dict(sources)
        self.source_of_stage = {s.stage: name for name, s in self.sources.items()}
        self.explicit: dict[str, dict[str, Startpoint]] = {name: {} for name in self.sources}
        self.defaults = {sp.source: sp for sp in current if sp.element_key is None}
        self.warnings: list[str] = []
        self._unconfirmed: set[str] = set()  # consumed by a committed checkpoint, not deleted yet
        self._round: set[str] = set()  # consumed by the round being committed
        self._keepers: list[Startpoint] = []
        self._closing: list[str] = []
        self.add_explicit(sp for sp in current if sp.element_key is not None)

    def all(self) -> list[Startpoint]:
        return [*self.defaults.values(), *(sp for d in self.explicit.values() for sp in d.values())]

    def copy_for(self, default: Startpoint, key: str) -> Startpoint:
        """A per-element copy of a transform-level startpoint; keeps the operator's time."""
        return Startpoint(
            default.pipeline_id, default.source, default.kind, default.position,
            key.encode("utf-8"), default.created,
        )  # fmt: skip

    def add_explicit(self, items: Iterable[Startpoint]) -> None:
        for sp in items:
            self.explicit[sp.source][sp.element_key_text or ""] = sp

    def assignment(self, stage_id: str) -> StartpointAssignment | None:
        """Step 2: what the stage's tasks apply this round (None: nothing, skip the applier)."""
        source = self.source_of_stage.get(stage_id)
        if source is None:
            return None
        explicit, default = self.explicit[source], self.defaults.get(source)
        if not explicit and default is None:
            return None
        return StartpointAssignment(
            stage_id, source, tuple(sorted(explicit.items())), default,
            store_url=self.startpoints.storage.url,
        )  # fmt: skip

    def prepare_commit(self, outcomes: Iterable[StartpointOutcome]) -> dict[str, Any]:
        """Step 3: before the round's checkpoint; merge the result into its metadata. A
        transform-level fan-out closes with the first round in which elements met it."""
        took: dict[tuple[str, str], bool] = {}
        token_of: dict[tuple[str, str], str] = {}
        for o in outcomes:
            if o.source in self.sources:
                k = (o.source, o.element_key)
                took[k] = took.get(k, False) or o.applied
                token_of[k] = o.token
        self._round, self._keepers, closing = set(), [], set()
        for (source, key), applied in took.items():
            default = self.defaults.get(source)
            if default is not None and token_of[(source, key)] == default.token:
                closing.add(source)
                if not applied:  # no data at that position yet: this element keeps it
                    self._keepers.append(self.copy_for(default, key))
            if applied:
                self._round.add(token_of[(source, key)])
        self._closing = sorted(closing)
        self._round.update(self.defaults[s].token for s in self._closing)
        # Step 3a. Keepers are durable before the checkpoint that closes the fan-out.
        if self._keepers:
            self.startpoints.update(self.pipeline_id, add=self._keepers)
        tokens = self._unconfirmed | self._round
        return {CONSUMED_METADATA_KEY: sorted(tokens)} if tokens else {}

    def committed(self) -> list[Startpoint]:
        """Step 4: after the checkpoint committed; deletes and returns the consumed startpoints."""
        self._unconfirmed |= self._round
        consumed = set(self._unconfirmed)
        for source in self._closing:
            self.defaults.pop(source, None)
        for name, entries in self.explicit.items():
            self.explicit[name] = {k: sp for k, sp in entries.items() if sp.token not in consumed}
        self.add_explicit(self._keepers)
        self._round, self._keepers, self._closing = set(), [], []
        removed = self.startpoints.update(self.pipeline_id, remove_tokens=consumed)
        self._unconfirmed.clear()  # only once the store has them deleted
        return removed

    def aborted(self) -> None:
        """The round's checkpoint did not commit: nothing was consumed, the fan-out stays open."""
        self._round, self._keepers, self._closing = set(), [], []

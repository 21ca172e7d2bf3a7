"""Restore only what the running pipeline can take over; record what each checkpoint needs.

Every checkpoint's manifest metadata carries the pipeline's `PipelineShape` (key ``shape``).
On restore, compatible differences from the running plan's are logged; incompatible ones raise
`IncompatiblePipelineError` listing them. Leaves the comparison rules to
``sparkbeam.translation.compatibility`` and the restore itself to the store.

A finished job is not rerun by accident (it would publish its output again): `run_again`
fails the start unless ``--fresh``. It runs before Spark starts (`refuse_before_start`) and
again where each pipeline restores: with ``--break_lock`` another job may finish the store in
between.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, NamedTuple

from sparkbeam.checkpoint.errors import StateLayoutError
from sparkbeam.checkpoint.state_layout import FINISHED, check_restorable
from sparkbeam.runner.errors import IncompatiblePipelineError
from sparkbeam.translation.compatibility import compare, incompatible
from sparkbeam.translation.plan import ExecutionPlan
from sparkbeam.translation.shape import PipelineShape, pipeline_shapes

_LOG = logging.getLogger(__name__)
SHAPE_KEY = "shape"
SHAPE_FINGERPRINT_KEY = "shape_fingerprint"


class RestoreGuard:
    """The shapes of one plan: written into every checkpoint, checked on every restore."""

    def __init__(self, plan: ExecutionPlan) -> None:
        self.plan = plan
        self.shapes = pipeline_shapes(plan)
        self._metadata = {
            pid: {
                SHAPE_KEY: shape.to_json(),
                SHAPE_FINGERPRINT_KEY: shape.fingerprint,
            }
            for pid, shape in self.shapes.items()
        }

    def metadata(self, pipeline_id: str) -> dict[str, Any]:
        """Manifest metadata entries for a checkpoint of ``pipeline_id``."""
        return dict(self._metadata[pipeline_id])

    def restore(self, state, store):
        """``state.restore()`` the latest checkpoint, refusing one the plan cannot continue;
        a finished job's is not checked (the job runs again from scratch)."""
        try:
            info = state.restore()
            if info is None:
                return None
            manifest = store.load_manifest(state.pipeline_id, info.checkpoint_id)
            if not manifest.metadata.get(FINISHED):
                self.check(manifest, store.url)
        except (IncompatiblePipelineError, StateLayoutError):
            state.close()
            raise
        return info

    def check(self, manifest, url: str) -> None:
        """Raise `IncompatiblePipelineError` unless ``manifest`` can restore this plan."""
        pid, cid = manifest.pipeline_id, manifest.checkpoint_id
        current = self.shapes[pid]
        stored = manifest.metadata.get(SHAPE_KEY)
        if stored is None:
            raise IncompatiblePipelineError(pid, cid, url, ["it records no pipeline shape"])
        if manifest.metadata.get(SHAPE_FINGERPRINT_KEY) == current.fingerprint:
            return  # fast path: the same state-bearing shape
        try:
            old = PipelineShape.from_json(stored)
        except (KeyError, TypeError, ValueError) as e:
            reason = f"its pipeline shape record cannot be read ({e})"
            raise IncompatiblePipelineError(pid, cid, url, [reason]) from None
        differences = compare(old, current)
        refused = incompatible(differences)
        if refused:
            raise IncompatiblePipelineError(pid, cid, url, [str(d) for d in refused])
        if differences:
            _LOG.warning(
                "Pipeline %s restores checkpoint %d of a changed pipeline; compatible changes:\n%s",
                pid, cid, "\n".join(f"  - {d}" for d in differences),
            )  # fmt: skip


class FinishedJobError(RuntimeError):
    """The job's last checkpoint is finished: running it again would repeat its output."""

    def __init__(self, pipeline_id: str, checkpoint_id: int, url: str) -> None:
        self.pipeline_id, self.checkpoint_id, self.url = pipeline_id, checkpoint_id, url
        super().__init__(
            f"Pipeline {pipeline_id!r} already finished: checkpoint {checkpoint_id} in store "
            f"{url!r} is its finished last checkpoint, and running it again would write its "
            "output a second time. To run the job again from the beginning pass --fresh (with "
            "a new --output); to start with no history, use a new --checkpoint_dir."
        )


def refuse_before_start(store, pipeline_ids: Iterable[str], fresh: bool) -> None:
    """Before a job starts: `FinishedJobError` for a pipeline's finished latest checkpoint
    (unless ``fresh``), `StateLayoutError` for one of another state layout."""
    for pid in pipeline_ids:
        readable = [i for i in store.list_checkpoints(pid) if i.error is None]
        if readable:
            cid = readable[-1].checkpoint_id
            metadata = store.load_manifest(pid, cid).metadata
            run_again(store, pid, cid, metadata, fresh, quiet=True)
            where = f"Checkpoint {cid} of pipeline {pid!r} in store {store.url!r}"
            check_restorable(metadata, where)


class Latest(NamedTuple):
    """A pipeline's state as a run opens it (`restore_latest`)."""

    state: Any  # its open PipelineStore: the checkpoint restored, else empty
    info: Any  # the CheckpointInfo restored; None: no checkpoint, or a finished job runs again
    metadata: dict | None  # the latest checkpoint's manifest metadata; None: no checkpoint


def restore_latest(ctx, pipeline_id: str) -> Latest:
    """Open ``pipeline_id``'s state and restore its latest checkpoint (``ctx.guard`` refuses
    one the plan cannot continue); a finished job's (`run_again`) gives way to empty state."""
    store = ctx.store
    state = store.pipeline(pipeline_id)
    info = ctx.guard.restore(state, store)
    if info is None:
        return Latest(state, None, None)
    metadata = store.load_manifest(pipeline_id, info.checkpoint_id).metadata
    if run_again(store, pipeline_id, info.checkpoint_id, metadata, ctx.fresh):
        state.close()
        return Latest(store.pipeline(pipeline_id), None, metadata)
    return Latest(state, info, metadata)


def run_again(store, pipeline_id: str, checkpoint_id: int, metadata, fresh: bool, quiet=False):
    """The finished-job check: False if the checkpoint (its manifest ``metadata``) is not a
    finished run's (resume it); True if it is and ``fresh`` (run again from the beginning,
    logged unless ``quiet``); else raise `FinishedJobError`."""
    if not metadata.get(FINISHED):
        return False  # an unfinished run resumes, with or without --fresh
    if not fresh:
        raise FinishedJobError(pipeline_id, checkpoint_id, store.url)
    if not quiet:
        _LOG.warning(
            "Pipeline %s finished in checkpoint %d of %s; --fresh: running it again from the "
            "beginning",
            pipeline_id, checkpoint_id, store.url,
        )  # fmt: skip
    return True

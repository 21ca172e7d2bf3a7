"""Startpoints in the run loops: the glue the batch and streaming loops share.

The four call points of a startpoint session (its lifecycle: `sparkbeam.sdf.startpoints.session`):

1. `check_startpoints` before Spark starts, so a bad startpoint (or one a run failed to apply)
   fails the start in a second; `open_session` per pipeline at start or restore.
2. In an SDF process stage's task (``task_body``) a `StartpointApplier` rewrites the input rows
   and reports a `StartpointOutcome` per element met. A startpoint whose application raises
   fails the round with `StartpointFailedError`, which no restore can help: `record_failure`
   marks it failed in the store.
3. The round's ledger picks the outcomes out of the tasks' reports.
4. `commit_round` at the barrier: the consumed tokens go into the checkpoint's metadata, and the
   startpoints are deleted only once that checkpoint has committed.

Leaves to others: deciding what applies (`StartpointSession`), rewriting restrictions
(`StartpointApplier`), storing startpoints (`sparkbeam.checkpoint.startpoints`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from sparkbeam.checkpoint.startpoints import Startpoints
from sparkbeam.sdf.startpoints.errors import StartpointFailedError
from sparkbeam.sdf.startpoints.session import (
    DEFAULT_MAX_AGE_S,
    StartpointOutcome,
    StartpointSession,
    check_pipelines,
    check_sources,
    fan_out,
    sdf_sources,
)

T = TypeVar("T")
_LOG = logging.getLogger(__name__)


def check_startpoints(startpoints: Startpoints, plan: Any) -> None:
    """Step 1a, read-only: `StartpointError` for a startpoint no pipeline of this job could
    apply, `StartpointFailedError` for one a run could not apply (it must be deleted)."""
    for sp in startpoints.list():
        if sp.failed:
            raise StartpointFailedError(
                f"{sp.failed} (A previous run failed on it; this job does not start until it "
                "is deleted or set again.)",
                sp.token,
            )
    check_pipelines(startpoints, plan)
    for pipeline in plan.pipelines:
        check_sources(pipeline.id, sdf_sources(plan, pipeline.id), startpoints.list(pipeline.id))


def record_failure(startpoints: Startpoints | None, error: StartpointFailedError) -> None:
    """Mark the startpoint a round failed to apply, so every later start refuses it at once."""
    if startpoints is None or error.token is None:
        return
    if startpoints.mark_failed(error.token, error.summary) is None:
        _LOG.warning("The startpoint that failed (token %s) is no longer in the store", error.token)


def open_session(
    startpoints: Startpoints,
    plan: Any,
    pipeline_id: str,
    restored_metadata: Mapping[str, Any] | None,
    restored_state: Any,
    max_age_s: float | None = None,
) -> StartpointSession:
    """Step 1b: one pipeline's session, from its restored checkpoint (None, None: fresh)."""
    return fan_out(
        startpoints,
        plan,
        pipeline_id,
        restored_metadata=restored_metadata,
        restored_state=restored_state,
        max_age_s=DEFAULT_MAX_AGE_S if max_age_s is None else max_age_s,
    )


def commit_round(
    session: StartpointSession | None,
    round_outcomes: Iterable[StartpointOutcome],
    checkpoint: Callable[[dict[str, Any]], T],
) -> T:
    """Step 4: ``checkpoint(extra_metadata)`` commits the round; then delete what it consumed
    (if the checkpoint raises, nothing was consumed)."""
    if session is None:
        return checkpoint({})
    metadata = session.prepare_commit(round_outcomes)
    try:
        result = checkpoint(metadata)
    except BaseException:
        session.aborted()
        raise
    if not metadata:
        return result  # nothing consumed: committed() would only re-read the store
    for sp in session.committed():
        where = "every element" if sp.element_key is None else f"element {sp.element_key_text!r}"
        value = "" if sp.position is None else f" {sp.position}"
        _LOG.info(
            "Startpoint %s%s for %s of transform %r in pipeline %r consumed and deleted: the "
            "checkpoint that reflects it committed.",
            sp.kind.value, value, where, sp.source, sp.pipeline_id,
        )  # fmt: skip
    return result

"""Restore of one pipeline: the latest usable checkpoint, falling back past damaged ones.

Owns: choosing which checkpoint to load (a given one, or the newest that loads), the
fingerprint check, falling back with a logged warning naming the file and the reason, and
the error when none is left. Leaves to others: loading a manifest's files into the working
state (``pipeline.PipelineStore.load``), the chain a restored pipeline continues
(``commit.CheckpointChain.adopt``) and reading manifests (``store``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sparkbeam.checkpoint.errors import (
    CheckpointCorruptError,
    CheckpointNotFoundError,
    IncompatibleCheckpointError,
)
from sparkbeam.checkpoint.ids import CheckpointId
from sparkbeam.checkpoint.manifest import Manifest

if TYPE_CHECKING:
    from sparkbeam.checkpoint.pipeline import PipelineStore
    from sparkbeam.checkpoint.store import CheckpointInfo, CheckpointStore

log = logging.getLogger(__name__)


def restore(
    store: CheckpointStore,
    work: PipelineStore,
    checkpoint_id: int | None,
    fingerprint: str | None,
    allow_fingerprint_change: bool,
) -> CheckpointInfo | None:
    """``PipelineStore.restore``: load a committed checkpoint into ``work``; see there."""
    from sparkbeam.checkpoint.store import CheckpointInfo

    ids = store._manifest_ids(work.pipeline_id)
    if checkpoint_id is not None:
        if checkpoint_id not in ids:
            raise CheckpointNotFoundError(work.pipeline_id, checkpoint_id, store.url)
        ids = [CheckpointId(checkpoint_id)]
    if not ids:
        return None
    failures: list[CheckpointCorruptError] = []
    for cid in sorted(ids, reverse=True):
        try:
            manifest = store.load_manifest(work.pipeline_id, cid)
            _check_fingerprint(manifest, fingerprint, allow_fingerprint_change)
            work.load(manifest)
        except CheckpointCorruptError as e:
            if checkpoint_id is not None:
                raise
            failures.append(e)
            log.warning(
                "Checkpoint %d of pipeline %r is unusable, falling back to an earlier one: %s",
                cid, work.pipeline_id, e,
            )  # fmt: skip
            continue
        work.chain.abandoned = tuple(c for c in ids if c > cid)  # damaged, skipped above
        return CheckpointInfo.from_manifest(manifest)
    raise _all_damaged(store, work, failures)


def _check_fingerprint(manifest: Manifest, fingerprint: str | None, allow_change: bool) -> None:
    if fingerprint is not None and manifest.fingerprint != fingerprint and not allow_change:
        raise IncompatibleCheckpointError(
            manifest.pipeline_id, manifest.checkpoint_id, manifest.fingerprint, fingerprint
        )


def _all_damaged(
    store: CheckpointStore, work: PipelineStore, failures: list[CheckpointCorruptError]
) -> CheckpointCorruptError:
    return CheckpointCorruptError(
        f"{store.url}/{work.directory}",
        f"all {len(failures)} checkpoints of pipeline {work.pipeline_id!r} are damaged ("
        + "; ".join(f"{e.path}: {e.reason}" for e in failures)
        + ")",
        "No complete checkpoint is left; restore from a backup, or start fresh with a new "
        "--checkpoint_dir.",
    )

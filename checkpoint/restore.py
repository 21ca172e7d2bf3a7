"""Restore of one pipeline: the latest usable checkpoint, falling back past damaged ones.

Owns: choosing which checkpoint to load (a given one, or the newest that loads), the
fingerprint check, falling back with a logged warning naming the file and the reason, and
the error when none is left. Also the record that a pipeline committed before
(`COMMITTED_MARK`, next to its manifests, written after its first commit and at a restore):
a pipeline with that record and no manifest lost its manifests, and starting it fresh would
publish its output again, so it is refused (`ManifestsLostError`); data files without it are
a first commit cut short, and start fresh. Leaves to others: loading a manifest's files into
the working state (``pipeline.PipelineStore.load``), the chain a restored pipeline continues
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
from sparkbeam.checkpoint.layout import pipeline_dir
from sparkbeam.checkpoint.manifest import MANIFEST_DIR, Manifest

if TYPE_CHECKING:
    from sparkbeam.checkpoint.pipeline import PipelineStore
    from sparkbeam.checkpoint.store import CheckpointInfo, CheckpointStore

log = logging.getLogger(__name__)
COMMITTED_MARK = f"{MANIFEST_DIR}/committed"
"""Written once a pipeline has a committed checkpoint; under the manifests, which `clean` keeps."""


class ManifestsLostError(CheckpointCorruptError):
    """A pipeline committed checkpoints, but none of its manifests is left."""

    def __init__(self, pipeline_id: str, url: str, directory: str) -> None:
        self.path, self.pipeline_id = f"{url}/{directory}", pipeline_id
        self.reason = "committed checkpoints, but no manifest is left"
        ValueError.__init__(
            self,
            f"Pipeline {pipeline_id!r} committed checkpoints in store {url!r}, but its directory "
            f"{self.path!r} holds no manifest ({MANIFEST_DIR}/chk-*.json deleted or lost): "
            "starting it fresh would publish its output a second time. Either restore the "
            "manifests from a backup, or start over: delete that directory (and the output the "
            "job published) or use a new --checkpoint_dir.",
        )


def lost_manifests(store: CheckpointStore, pipeline_id: str) -> ManifestsLostError | None:
    """The error a restart of a pipeline with no manifest meets, if it committed before."""
    directory = pipeline_dir(pipeline_id)
    if store.storage.exists(f"{directory}/{COMMITTED_MARK}"):
        return ManifestsLostError(pipeline_id, store.url, directory)
    return None


def committed(work: PipelineStore, checkpoint_id: CheckpointId) -> CheckpointId:
    """After a commit (before any output of it is published): record that the pipeline has
    committed, once per working state. Returns ``checkpoint_id``."""
    if not getattr(work, "_marked_committed", False):
        _mark(work._store, work.pipeline_id)
        work._marked_committed = True
    return checkpoint_id


def _mark(store: CheckpointStore, pipeline_id: str) -> None:
    path = f"{pipeline_dir(pipeline_id)}/{COMMITTED_MARK}"
    if not store.read_only and not store.storage.exists(path):
        store.storage.write(path, b"{}")


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
        lost = lost_manifests(store, work.pipeline_id)
        if lost is not None:
            raise lost
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
        committed(work, cid)  # stores written before the record, too
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

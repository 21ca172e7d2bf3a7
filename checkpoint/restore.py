"""Restore of one pipeline: the latest usable checkpoint, falling back past damaged ones.

Owns: choosing the checkpoint to load (a given one, or the newest that loads and was not set
aside), the fingerprint and state layout checks (another layout is refused before a file of it
is read, not fallen back past), and the error when none is left. After a task found a file of
its checkpoint damaged (`fall_back`): the newest checkpoint whose files are all sound
(`sound_checkpoint`, the rule ``sparkbeam checkpoints verify`` prints) is restored and every
newer one set aside (a ``manifests/chk-<id>.json.damaged`` mark), so no restore picks it again;
the next commit deletes them. `COMMITTED_MARK`, written after a pipeline's first commit: with it
and no manifest, the manifests were lost and starting fresh would publish the output again, so
it is refused (`ManifestsLostError`); without it, data files are a first commit cut short.
Leaves to others: loading a manifest's files (``pipeline.PipelineStore.load``), the chain a
restored pipeline continues (``commit.CheckpointChain.adopt``) and reading manifests (``store``).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from sparkbeam.checkpoint import state_layout
from sparkbeam.checkpoint.errors import (
    CheckpointCorruptError,
    CheckpointNotFoundError,
    IncompatibleCheckpointError,
)
from sparkbeam.checkpoint.ids import CheckpointId
from sparkbeam.checkpoint.layout import pipeline_dir
from sparkbeam.checkpoint.manifest import MANIFEST_DIR, manifest_name, parse_manifest_name

if TYPE_CHECKING:
    from collections.abc import Callable

    from sparkbeam.checkpoint.filesystem import Storage
    from sparkbeam.checkpoint.pipeline import PipelineStore
    from sparkbeam.checkpoint.reader import VerificationResult
    from sparkbeam.checkpoint.store import CheckpointInfo, CheckpointStore

log = logging.getLogger(__name__)
COMMITTED_MARK = f"{MANIFEST_DIR}/committed"
"""Written once a pipeline has a committed checkpoint; under the manifests, which `clean` keeps."""
SET_ASIDE = ".damaged"
"""Suffix of a set-aside checkpoint's mark: its manifest's name + this (`set_aside_mark`)."""


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
        store, path = work._store, f"{work.directory}/{COMMITTED_MARK}"
        if not store.read_only and not store.storage.exists(path):
            store.storage.write(path, b"{}")
        work._marked_committed = True
    return checkpoint_id


def restore(
    store: CheckpointStore,
    work: PipelineStore,
    checkpoint_id: int | None,
    fingerprint: str | None,
    allow_fingerprint_change: bool,
) -> CheckpointInfo | None:
    """``PipelineStore.restore``: load a committed checkpoint into ``work``; see there."""
    from sparkbeam.checkpoint.store import CheckpointInfo

    listing = store._manifest_listing(work.pipeline_id)
    ids = store._manifest_ids(work.pipeline_id, listing)
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
    aside = set_aside_ids(listing) if checkpoint_id is None else set()
    if aside:
        log.warning(
            "Checkpoints %s of pipeline %r were set aside after a task found files of them "
            "damaged (%s): a restore skips them.",
            ", ".join(map(str, sorted(aside))), work.pipeline_id,
            f"{store.url}/{work.directory}/{MANIFEST_DIR}/chk-*.json{SET_ASIDE}",
        )  # fmt: skip
    for cid in sorted(ids, reverse=True):
        if cid in aside:
            continue
        try:
            manifest = store.load_manifest(work.pipeline_id, cid)
            if fingerprint not in (None, manifest.fingerprint) and not allow_fingerprint_change:
                raise IncompatibleCheckpointError(
                    work.pipeline_id, cid, manifest.fingerprint, fingerprint
                )
            where = f"Checkpoint {cid} of pipeline {work.pipeline_id!r} in store {store.url!r}"
            state_layout.check_restorable(manifest.metadata, where)  # before a file is read
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
        # Damaged or set aside, skipped above: the next commit deletes them.
        work.chain.abandoned = tuple(c for c in ids if c > cid or c in aside)
        return CheckpointInfo.from_manifest(manifest, store.url)
    if not failures and aside:
        raise _no_sound_checkpoint(store, work.pipeline_id, f"all set aside: {sorted(aside)}")
    raise CheckpointCorruptError(
        f"{store.url}/{work.directory}",
        f"all {len(failures)} checkpoints of pipeline {work.pipeline_id!r} are damaged ("
        + "; ".join(f"{e.path}: {e.reason}" for e in failures)
        + ")",
        "No complete checkpoint is left; restore from a backup, or start fresh with a new "
        "--checkpoint_dir.",
    )


def set_aside_mark(checkpoint_id: int) -> str:
    """``manifests/chk-<id>.json.damaged`` (relative to the pipeline directory)."""
    return manifest_name(checkpoint_id) + SET_ASIDE


def set_aside_ids(listing: list[str]) -> set[CheckpointId]:
    """The checkpoints a fallback set aside, from a listing of a pipeline's manifests."""
    marks = (name for name in listing if name.endswith(SET_ASIDE))
    ids = (parse_manifest_name(m[: -len(SET_ASIDE)]) for m in marks)
    return {i for i in ids if i is not None}


def set_aside_problem(storage: Storage, pipeline_id: str, checkpoint_id: int) -> str | None:
    """What `CheckpointStore.verify` reports of a set-aside checkpoint (None: not set aside)."""
    mark = f"{pipeline_dir(pipeline_id)}/{set_aside_mark(checkpoint_id)}"
    if not storage.exists(mark):
        return None
    return (
        f"{mark}: set aside after a task found a file of it damaged; no restore uses it "
        "(delete this mark once its files are restored)"
    )


def sound_checkpoint(
    store: CheckpointStore,
    pipeline_id: str,
    verify: Callable[[int], VerificationResult] | None = None,
) -> tuple[CheckpointId | None, list[VerificationResult]]:
    """The checkpoint a restart uses, the newest whose files are all sound, and the results of
    the damaged ones newer than it, newest first (``verify``: `CheckpointStore.verify`'s)."""
    check = verify or (lambda cid: store.verify(pipeline_id, cid))
    damaged: list[VerificationResult] = []
    for cid in reversed(store._manifest_ids(pipeline_id)):
        result = check(cid)
        if result.ok:
            return cid, damaged
        damaged.append(result)
    return None, damaged


def fall_back(store: CheckpointStore, pipeline_id: str, cause: str) -> CheckpointId | None:
    """After a task found a file of ``pipeline_id`` damaged (``cause``: its one-line error):
    set aside, with a warning, the checkpoints newer than the sound one, and return that one
    for the next restore. None when the newest is sound (the file was unreadable for a while).
    `CheckpointCorruptError` when none is sound, setting nothing aside (a backup of the files
    makes the store whole again)."""
    sound, damaged = sound_checkpoint(store, pipeline_id)
    if not damaged:
        return None
    problems = sorted({p for r in damaged for p in r.problems})
    if sound is None:
        raise _no_sound_checkpoint(store, pipeline_id, "; ".join(problems[:3]))
    ids = sorted(r.checkpoint_id for r in damaged)
    for cid in ids:
        store.storage.write(
            f"{pipeline_dir(pipeline_id)}/{set_aside_mark(cid)}",
            json.dumps({"cause": cause, "problems": problems}, indent=1).encode(),
        )
    others = [p for p in problems if p.split(": ", 1)[0] not in cause][:3]  # not the cause's
    log.warning(
        "%s -- checkpoints %s of pipeline %r name damaged files%s: set aside (%s, deleted by the "
        "next commit); restoring checkpoint %d, the newest sound one (as `sparkbeam checkpoints "
        "verify` says), and running the rounds after it again.",
        cause, ", ".join(map(str, ids)), pipeline_id,
        f" (also {'; '.join(others)})" if others else "", f"{MANIFEST_DIR}/chk-*.json{SET_ASIDE}",
        sound,
    )  # fmt: skip
    return sound


def _no_sound_checkpoint(store: CheckpointStore, pipeline_id: str, why: str):
    directory = f"{store.url}/{pipeline_dir(pipeline_id)}"
    return CheckpointCorruptError(
        directory,
        f"no checkpoint of pipeline {pipeline_id!r} is sound ({why})",
        "Restore the damaged files from a backup (`sparkbeam checkpoints verify` lists them), "
        "or start fresh with a new --checkpoint_dir.",
    )

"""The checkpoint store facade: `open_store` and `CheckpointStore`.

Owns: one store at a URL -- its lock, its options, the `PipelineStore` of each independent
pipeline, listing pipelines and checkpoints, loading manifests, reading one subtask's key
groups of a checkpoint (rescaling), verification, applying retention (rules: `retention`) and
cleaning unreferenced files. Leaves to others: one pipeline's state and commit protocol
(`pipeline`, `commit`, `restore`), task-side staging (`staging`), file formats and backends.

Typical use (driver)::

    store = open_store(url, job_name="wordcount")          # takes the lock
    st = store.pipeline("p0")
    st.restore(fingerprint=fp)                             # None on the first run
    st.put("stage/state", key, value)
    cid = st.checkpoint(fingerprint=fp, parallelism=4, commit_messages=msgs)
    store.close()
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

from sparkbeam.checkpoint.changelog import DEFAULT_FLUSH_BYTES
from sparkbeam.checkpoint.errors import CheckpointCorruptError, StateLayoutError, StoreClosedError
from sparkbeam.checkpoint.filesystem import TMP_PREFIX, MemoryStorage, Storage, open_storage
from sparkbeam.checkpoint.ids import CheckpointId, PipelineId
from sparkbeam.checkpoint.keygroups import DEFAULT_MAX_KEY_GROUPS, key_group_range
from sparkbeam.checkpoint.layout import (
    PIPELINES,
    decode_component,
    pipeline_dir,
    staged_round,
)
from sparkbeam.checkpoint.lock import StoreLock
from sparkbeam.checkpoint.manifest import (
    MANIFEST_DIR,
    Manifest,
    decode_manifest,
    manifest_name,
    parse_manifest_name,
)
from sparkbeam.checkpoint.materialization import DEFAULT_FILES
from sparkbeam.checkpoint.pipeline import PipelineStore
from sparkbeam.checkpoint.reader import (
    SegmentCache,
    VerificationResult,
    read_state,
    verify_files,
)
from sparkbeam.checkpoint.restore import set_aside_mark, set_aside_problem
from sparkbeam.checkpoint.retention import plan_retention, sweep
from sparkbeam.checkpoint.staging import StagedWriter
from sparkbeam.checkpoint.startpoints import Startpoints
from sparkbeam.checkpoint.state_layout import check_restorable, layout_of
from sparkbeam.checkpoint.state_table import check_state_backend

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointInfo:
    """A summary of one checkpoint (or of an unreadable manifest, with ``error`` set)."""

    pipeline_id: PipelineId
    checkpoint_id: CheckpointId
    created: float = 0.0
    fingerprint: str = ""
    parallelism: int = 0
    max_key_groups: int = 0
    entries: int = 0
    materialization_files: int = 0
    materialization_bytes: int = 0
    changelog_files: int = 0
    changelog_bytes: int = 0
    completed: int = 0
    error: str | None = None
    layout: int = 0
    """The state layout its values are in (`state_layout.LAYOUT_VERSION`: this sparkbeam's)."""
    refused: str | None = None
    """Why a restore refuses it (another state layout), else None."""

    @classmethod
    def from_manifest(cls, m: Manifest, url: str = "") -> CheckpointInfo:
        try:
            where = f"Checkpoint {m.checkpoint_id} of pipeline {m.pipeline_id!r} in store {url!r}"
            check_restorable(m.metadata, where)
            refused = None
        except StateLayoutError as e:
            refused = str(e)
        return cls(
            pipeline_id=m.pipeline_id,
            checkpoint_id=m.checkpoint_id,
            created=m.created,
            fingerprint=m.fingerprint,
            parallelism=m.parallelism,
            max_key_groups=m.max_key_groups,
            entries=m.entries,
            materialization_files=len(m.materialization),
            materialization_bytes=m.materialization_bytes,
            changelog_files=len(m.changelog),
            changelog_bytes=m.changelog_bytes,
            completed=len(m.completed),
            layout=layout_of(m.metadata),
            refused=refused,
        )


def open_working_store() -> CheckpointStore:
    """The store of a run without ``--checkpoint_dir``: state in memory, never committed nor
    restored, so no changelog (one flushed into memory nothing ever cleaned held every change)."""
    return open_store(MemoryStorage(), materialization_interval_s=None, changelog=False)


READ_ONLY_MANIFESTS = 16
"""Manifests a read-only store (a worker's) keeps loaded: a worker loads each round's and no
retention prunes them, so all of them would grow its heap, and the time of every garbage
collection, with the job's age. A writable store keeps those of its retained checkpoints."""


class CheckpointStore:
    """All pipelines' checkpoints under one root, created if needed; the write lock is taken
    unless read-only. ``changelog=False``: no driver changelog, so checkpoints are refused
    (`NoChangelogError`); for state never committed nor restored."""

    def __init__(
        self,
        url: str | Storage,
        *,
        max_key_groups: int = DEFAULT_MAX_KEY_GROUPS,
        state_backend: str = "memory",
        retain: int = 3,
        job_name: str = "sparkbeam",
        materialization_interval_s: float | None = 600.0,
        materialization_files: int = DEFAULT_FILES,
        flush_bytes: int = DEFAULT_FLUSH_BYTES,
        read_only: bool = False,
        break_lock: bool = False,
        changelog: bool = True,
    ):
        self.use_max_key_groups(max_key_groups)
        check_state_backend(state_backend)
        if retain < 1:
            raise ValueError(f"retain={retain!r} must be at least 1 (checkpoints to keep).")
        self.storage = storage = open_storage(url)
        self.url = storage.url
        self.state_backend = state_backend
        self.retain = retain
        self.materialization_interval_s = materialization_interval_s
        self.materialization_files = materialization_files
        self.flush_bytes = flush_bytes
        self.read_only = read_only
        self.changelog = changelog  # False: pipelines are never checkpointed (`open_store`)
        self._pipelines: dict[PipelineId, PipelineStore] = {}
        self._manifest_cache: dict[tuple[PipelineId, CheckpointId], Manifest] = {}
        self._segment_cache = SegmentCache()
        self._lock = None if read_only else StoreLock(storage, job_name)
        if self._lock is not None:
            self._lock.acquire(break_lock=break_lock)
        self.startpoints = Startpoints(storage)
        self._closed = False

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_writable(self) -> None:
        if self._closed:
            raise StoreClosedError(f"Checkpoint store {self.url!r}")
        if self.read_only:
            raise PermissionError(
                f"Checkpoint store {self.url!r} was opened read-only; open it with "
                "read_only=False (this takes the store's lock) to write."
            )

    # -- pipelines -----------------------------------------------------------------------------
    def pipeline(self, pipeline_id: str) -> PipelineStore:
        """The live `PipelineStore` of ``pipeline_id`` (one per pipeline per open store)."""
        self._check_writable()
        pid = PipelineId(pipeline_id)
        if pid not in self._pipelines:
            self._pipelines[pid] = PipelineStore(self, pid)
        return self._pipelines[pid]

    def use_max_key_groups(self, max_key_groups: int) -> None:
        """The key groups of pipelines this store creates from now on (a run's, once its
        parallelism is known); a pipeline already open or restored keeps its own."""
        key_group_range(0, 1, max_key_groups)  # validates max_key_groups
        self.max_key_groups = max_key_groups

    def staged_writer(
        self, pipeline_id: str, stage: str, round: int, partition: int, attempt: int
    ) -> StagedWriter:
        """A writer for one task attempt, in the pipeline's key groups (the store's if not open)."""
        live = self._pipelines.get(PipelineId(pipeline_id))
        return StagedWriter(
            self.storage,
            pipeline_id,
            stage,
            round,
            partition,
            attempt,
            max_key_groups=live.max_key_groups if live is not None else self.max_key_groups,
            flush_bytes=self.flush_bytes,
        )

    def list_pipelines(self) -> list[PipelineId]:
        names = {p.split("/", 2)[1] for p in self.storage.list(PIPELINES) if p.count("/") >= 2}
        return sorted(PipelineId(decode_component(n)) for n in names)

    # -- checkpoints ---------------------------------------------------------------------------
    def _manifest_ids(
        self, pipeline_id: str, listing: list[str] | None = None
    ) -> list[CheckpointId]:
        """The pipeline's checkpoint ids, from ``listing`` (`_manifest_listing`) if given."""
        names = self._manifest_listing(pipeline_id) if listing is None else listing
        ids = (parse_manifest_name(p) for p in names)
        return sorted(i for i in ids if i is not None)

    def _manifest_listing(self, pipeline_id: str) -> list[str]:
        """Every file beside the pipeline's manifests (one listing)."""
        return self.storage.list(f"{pipeline_dir(pipeline_id)}/{MANIFEST_DIR}")

    def _next_checkpoint_id(self, pipeline_id: str) -> int:
        ids = self._manifest_ids(pipeline_id)
        live = self._pipelines.get(PipelineId(pipeline_id))
        last = live.last_checkpoint_id if live is not None else None
        return max([0, *ids, *([last] if last else [])]) + 1

    def load_manifest(self, pipeline_id: str, checkpoint_id: int) -> Manifest:
        """The manifest of one checkpoint; `CheckpointCorruptError` if damaged."""
        key = (PipelineId(pipeline_id), CheckpointId(checkpoint_id))
        if key in self._manifest_cache:
            return self._manifest_cache[key]
        path = f"{pipeline_dir(pipeline_id)}/{manifest_name(checkpoint_id)}"
        try:
            data = self.storage.read(path)
        except FileNotFoundError:
            raise CheckpointCorruptError(f"{self.url}/{path}", "manifest is missing") from None
        manifest = decode_manifest(data, f"{self.url}/{path}")
        if manifest.checkpoint_id != checkpoint_id or manifest.pipeline_id != pipeline_id:
            raise CheckpointCorruptError(
                f"{self.url}/{path}",
                f"manifest names pipeline {manifest.pipeline_id!r} checkpoint "
                f"{manifest.checkpoint_id}, not the file's",
            )
        self._manifest_cache[key] = manifest
        if self.read_only and len(self._manifest_cache) > READ_ONLY_MANIFESTS:
            del self._manifest_cache[next(iter(self._manifest_cache))]  # the earliest loaded
        return manifest

    def list_checkpoints(self, pipeline_id: str) -> list[CheckpointInfo]:
        """All checkpoints of a pipeline, oldest first; damaged manifests have ``error`` set."""
        out = []
        for cid in self._manifest_ids(pipeline_id):
            try:
                manifest = self.load_manifest(pipeline_id, cid)
                out.append(CheckpointInfo.from_manifest(manifest, self.url))
            except CheckpointCorruptError as e:
                out.append(CheckpointInfo(PipelineId(pipeline_id), cid, error=e.reason))
        return out

    def verify(self, pipeline_id: str, checkpoint_id: int) -> VerificationResult:
        """Read every file of one checkpoint and check it; never raises for damage."""
        try:
            manifest = self.load_manifest(pipeline_id, checkpoint_id)
        except CheckpointCorruptError as e:
            return VerificationResult(
                PipelineId(pipeline_id), CheckpointId(checkpoint_id), False,
                (f"{e.path}: {e.reason}",), 1, 0,
            )  # fmt: skip
        result = verify_files(self.storage, pipeline_dir(pipeline_id), manifest)
        aside = set_aside_problem(self.storage, pipeline_id, checkpoint_id)
        if aside is None:
            return result
        return dataclasses.replace(result, ok=False, problems=(*result.problems, aside))

    def read_subtask_state(
        self, pipeline_id: str, checkpoint_id: int | None, subtask: int, parallelism: int
    ) -> Iterator[tuple[str, bytes, bytes]]:
        """(namespace, key, value) of exactly the key groups ``subtask`` owns at
        ``parallelism`` in a checkpoint (None: the latest complete one, with fallback)."""
        ids = self._manifest_ids(pipeline_id)
        candidates = sorted(ids, reverse=True) if checkpoint_id is None else [checkpoint_id]
        for cid in candidates:
            try:
                manifest = self.load_manifest(pipeline_id, cid)
                kgs = key_group_range(subtask, parallelism, manifest.max_key_groups)
                state = read_state(
                    self.storage, pipeline_dir(pipeline_id), manifest, kgs, self._segment_cache
                )
            except CheckpointCorruptError as e:
                if checkpoint_id is not None:
                    raise
                log.warning("Skipping damaged checkpoint %d of %r: %s", cid, pipeline_id, e)
                continue
            return iter([(ns, key, value) for (ns, key), value in sorted(state.items())])
        from sparkbeam.checkpoint.errors import CheckpointNotFoundError

        raise CheckpointNotFoundError(pipeline_id, checkpoint_id, self.url)

    # -- retention and cleaning ----------------------------------------------------------------
    def _files_of(self, pipeline_id: str):
        """``cid -> names of its files`` (None if its manifest is unreadable); see `retention`."""

        def files_of(cid: int) -> frozenset[str] | None:
            try:
                return self.load_manifest(pipeline_id, cid).file_names
            except CheckpointCorruptError:
                return None

        return files_of

    def _apply_retention(self, pipeline_id: str, live: set[str], abandoned=()) -> None:
        """Delete checkpoints beyond ``retain`` except the fallback (see `retention`), and the
        ``abandoned`` ones, manifest first; then the files only they named."""
        files_of = self._files_of(pipeline_id)
        keep, drop = plan_retention(
            self._manifest_ids(pipeline_id), files_of, self.retain, abandoned
        )
        if not drop:
            return
        directory = pipeline_dir(pipeline_id)
        referenced = set(live).union(*(files_of(cid) or () for cid in keep))
        candidates: set[str] = set()
        damaged = [cid for cid in drop if cid in set(abandoned)]
        for cid in drop:
            candidates.update(files_of(cid) or ())
            self.storage.delete(f"{directory}/{manifest_name(cid)}")
            self._manifest_cache.pop((PipelineId(pipeline_id), cid), None)
        for cid in damaged:
            self.storage.delete(f"{directory}/{set_aside_mark(cid)}")
        for name in sorted(candidates - referenced):
            self.storage.delete(f"{directory}/{name}")
        if damaged:
            log.warning(
                "Deleted checkpoints %s of pipeline %r, damaged or set aside (a restore fell back "
                "past them), with the files no other checkpoint names.",
                ", ".join(map(str, damaged)), pipeline_id,
            )  # fmt: skip

    def _sweep(self, pipeline_id: str, rounds_done: dict[str, int], live: set[str]) -> int:
        """`retention.sweep` against every checkpoint's files; returns how many it deleted."""
        files_of = self._files_of(pipeline_id)
        ids = self._manifest_ids(pipeline_id)
        referenced = set(live).union(*(files_of(cid) or () for cid in ids))
        directory = pipeline_dir(pipeline_id)
        return len(sweep(self.storage, directory, rounds_done, referenced))

    def clean(self, grace_s: float = 3600.0) -> list[str]:
        """Delete files no manifest names (failed or duplicate attempts, files of crashed runs,
        temp files); returns their paths. One younger than ``grace_s`` is kept while it may
        still be committed: newer than the newest manifest, or staged for a round after its
        stage's last committed one."""
        self._check_writable()
        deleted = []
        now = time.time()
        for pid in self.list_pipelines():
            directory = pipeline_dir(pid)
            ids = self._manifest_ids(pid)
            referenced: set[str] = set()
            rounds: dict[str, int] = {}
            for cid in ids:
                try:
                    m = self.load_manifest(pid, cid)
                except CheckpointCorruptError:
                    continue
                referenced.update(f.name for f in m.files)
                for stage, rnd, _p, _a in m.commits:
                    rounds[stage] = max(rounds.get(stage, -1), rnd)
            if pid in self._pipelines:
                referenced |= self._pipelines[pid].live_files()
            newest = max(
                (self.storage.mtime(f"{directory}/{manifest_name(c)}") for c in ids[-1:]),
                default=float("-inf"),
            )
            for path in self.storage.list(directory):
                name = path[len(directory) + 1 :]
                base = name.rsplit("/", 1)[-1]
                if name.startswith(f"{MANIFEST_DIR}/") and not base.startswith(TMP_PREFIX):
                    continue
                if name in referenced:
                    continue
                mtime = self.storage.mtime(path)
                old = now - mtime >= grace_s
                staged = staged_round(name)
                if staged is not None:
                    garbage = old or (mtime < newest and staged[1] <= rounds.get(staged[0], -1))
                elif base.startswith(TMP_PREFIX):
                    garbage = old
                else:
                    garbage = old or mtime < newest
                if garbage:
                    self.storage.delete(path)
                    deleted.append(path)
        return deleted

    def close(self) -> None:
        """Drop live pipelines' uncommitted changes and release the lock."""
        if self._closed:
            return
        for st in list(self._pipelines.values()):
            st.close()
        if self._lock is not None:
            self._lock.release()
        self._closed = True


open_store = CheckpointStore
"""Open (creating if needed) the store at a URL or `Storage`; see `CheckpointStore`."""

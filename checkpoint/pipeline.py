"""One pipeline's live state and its checkpoint chain: `PipelineStore`.

Owns: the working state table of one independent pipeline, its changelog writer, its
completed-work markers and source positions, the commit protocol of `PipelineStore.checkpoint`
(numbered steps, `CommitStatus`), materialization, applying retention, and restore with
fallback past damaged checkpoints. Leaves to others: the store-wide concerns -- lock, listing,
cleaning, per-subtask reads (`store`) --, the retention rules (`retention`) and file formats
(`changelog`, `materialization`, `manifest`).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from sparkbeam.checkpoint.changelog import ChangelogWriter, Op, iter_records, read_segment
from sparkbeam.checkpoint.errors import (
    CheckpointConflictError,
    CheckpointCorruptError,
    CheckpointNotFoundError,
    IncompatibleCheckpointError,
    StoreClosedError,
)
from sparkbeam.checkpoint.ids import CheckpointId, FileEntry, PipelineId
from sparkbeam.checkpoint.keygroups import key_group
from sparkbeam.checkpoint.layout import pipeline_dir
from sparkbeam.checkpoint.manifest import Manifest, encode_manifest, manifest_name
from sparkbeam.checkpoint.materialization import write_materialization
from sparkbeam.checkpoint.reader import replay
from sparkbeam.checkpoint.staging import CommitMessage, CommitStatus, check_key
from sparkbeam.checkpoint.state_table import make_state_table

if TYPE_CHECKING:
    from sparkbeam.checkpoint.store import CheckpointInfo, CheckpointStore

log = logging.getLogger(__name__)
SWEEP_EVERY = 16
"""Commits between two sweeps of files nobody will commit (one listing each)."""
COMPACT_MAX_ENTRIES = 50_000
"""Up to this many entries, the snapshot that gives a checkpoint its fallback is one segment."""


class PipelineStore:
    """Keyed state + checkpoints of one pipeline; get it from ``CheckpointStore.pipeline``.

    Lives on the driver and is not thread-safe. Restore before opening staged writers for the
    pipeline: a restored pipeline keeps the ``max_key_groups`` of its checkpoints.
    """

    def __init__(self, store: CheckpointStore, pipeline_id: str):
        self._store = store
        self.pipeline_id = PipelineId(pipeline_id)
        self.directory = pipeline_dir(pipeline_id)
        self.max_key_groups = store.max_key_groups
        self._table = make_state_table(store.state_backend, self.max_key_groups)
        self._log = ChangelogWriter(
            store.storage, self.directory, "driver", store.flush_bytes, name_prefix="changelog/"
        )
        self._materialization: tuple[FileEntry, ...] = ()
        self._chain: list[FileEntry] = []
        self._completed: set[str] = set()
        self._positions: dict[str, bytes] = {}
        self._committed_tasks: dict[tuple[str, int, int], int] = {}
        self._committed_files: set[str] = set()
        """Files named by the last committed manifest."""
        self._rounds_done: dict[str, int] = {}
        """Per stage, the latest round committed: its other staged files are garbage."""
        self._abandoned: tuple[CheckpointId, ...] = ()
        """Damaged checkpoints newer than the restored one; the next commit drops them."""
        self._commits_since_sweep = 0
        self._last_materialized = time.monotonic()
        self.last_checkpoint_id: CheckpointId | None = None
        self.status: CommitStatus | None = None
        """Status of the latest `checkpoint` call (None before the first)."""
        self._closed = False

    # -- state ---------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"Pipeline {self.pipeline_id!r} of {self._store.url!r}")

    def get(self, namespace: str, key: bytes) -> bytes | None:
        return self._table.get(namespace, key)

    def put(self, namespace: str, key: bytes, value: bytes) -> None:
        self._check_open()
        check_key(namespace, key, value)
        kg = key_group(key, self.max_key_groups)
        self._table.put(namespace, key, value, kg)
        self._append(Op.PUT, kg, namespace, key, value)

    def delete(self, namespace: str, key: bytes) -> None:
        self._check_open()
        check_key(namespace, key)
        kg = key_group(key, self.max_key_groups)
        self._table.delete(namespace, key, kg)
        self._append(Op.DELETE, kg, namespace, key, b"")

    def _append(self, op: Op, kg: int, namespace: str, key: bytes, value: bytes) -> None:
        entry = self._log.append(op, kg, namespace, key, value)
        if entry is not None:
            self._chain.append(entry)

    def items(self, namespace: str | None = None) -> Iterator[tuple[str, bytes, bytes]]:
        """(namespace, key, value) of the working state, optionally of one namespace."""
        return self._table.items(namespace)

    def __len__(self) -> int:
        return len(self._table)

    def mark_completed(self, marker: str) -> None:
        """Record finished work (a root input, a bounded restriction) in the next checkpoint."""
        self._check_open()
        self._completed.add(str(marker))

    def completed(self) -> frozenset[str]:
        return frozenset(self._completed)

    def set_source_position(self, name: str, value: bytes) -> None:
        self._check_open()
        self._positions[str(name)] = bytes(value)

    def source_positions(self) -> dict[str, bytes]:
        return dict(self._positions)

    # -- checkpoint ----------------------------------------------------------------------------
    def checkpoint(
        self,
        *,
        fingerprint: str = "",
        parallelism: int = 1,
        metadata: dict[str, Any] | None = None,
        commit_messages: Iterable[CommitMessage] = (),
    ) -> CheckpointId:
        """Commit the current state as the next checkpoint of this pipeline.

        Step 1. STARTED: check the commit messages (one attempt per (stage, round, partition))
                and read + verify all their staged files before anything is applied.
        Step 2. Flush the driver's changelog buffer: its changes precede the staged ones.
        Step 3. Apply the staged changes to the working table and append their files to the
                chain, in (stage, round, partition) order.
        Step 4. Materialize if ``materialization_interval_s`` has passed; else, if no
                retained checkpoint would share no file with this one, compact the state into
                new files so that the previous checkpoint is its fallback (`retention`).
        Step 5. PREPARED: build the manifest naming the materialization and the chain.
        Step 6. Write the manifest atomically -- the commit point. COMMITTED.
        Step 7. Retention: drop checkpoints beyond ``retain`` but the fallback, and abandoned
                ones, then files only they named; every `SWEEP_EVERY` commits, delete files
                nobody will commit (`retention.sweep`).
        A failure before step 6 leaves the status ABORTED and no new checkpoint visible; the
        changes stay in the working state and go into the next checkpoint.
        """
        self._check_open()
        self.status = CommitStatus.STARTED
        try:
            # Step 1.
            staged = self._read_commit_messages(list(commit_messages))
            # Step 2.
            entry = self._log.flush()
            if entry is not None:
                self._chain.append(entry)
            # Step 3.
            self._apply_staged(staged)
            # Step 4.
            if self._materialization_due():
                self.materialize()
            elif self._needs_fallback():
                self._compact()
            # Step 5.
            cid = CheckpointId(self._store._next_checkpoint_id(self.pipeline_id))
            manifest = self._manifest(cid, fingerprint, parallelism, metadata, staged)
            self.status = CommitStatus.PREPARED
            if os.environ.get("SPARKBEAM_CRASH_AT") == f"prepared:{cid}":  # recovery tests
                os.kill(os.getpid(), signal.SIGKILL)
            # Step 6.
            self._write_manifest(cid, encode_manifest(manifest))
            self._store._manifest_cache[(self.pipeline_id, cid)] = manifest
            self._committed_files = {f.name for f in manifest.files}
            self.status = CommitStatus.COMMITTED
        except BaseException:
            self.status = CommitStatus.ABORTED
            raise
        self.last_checkpoint_id = cid
        self._retain()  # Step 7.
        return cid

    def _apply_staged(self, staged: list) -> None:
        """Step 3: the staged changes into the working table, their files into the chain."""
        for msg, records in staged:
            for op, kg, ns, key, value in records:
                if op is Op.PUT:
                    self._table.put(ns, key, value, kg)
                else:
                    self._table.delete(ns, key, kg)
            self._chain.extend(msg.files)
            self._completed.update(msg.completed)
            self._positions.update(msg.source_positions)
            self._committed_tasks[msg.task] = msg.attempt
            self._rounds_done[msg.stage] = max(msg.round, self._rounds_done.get(msg.stage, -1))

    def _manifest(
        self, cid: CheckpointId, fingerprint: str, parallelism: int, metadata, staged: list
    ) -> Manifest:
        """Step 5: the manifest naming the materialization and the chain."""
        return Manifest(
            pipeline_id=self.pipeline_id,
            checkpoint_id=cid,
            created=time.time(),
            fingerprint=fingerprint,
            parallelism=parallelism,
            max_key_groups=self.max_key_groups,
            materialization=self._materialization,
            changelog=tuple(self._chain),
            completed=frozenset(self._completed),
            source_positions=dict(self._positions),
            entries=len(self._table),
            metadata=dict(metadata or {}),
            commits=tuple((*m.task, m.attempt) for m, _ in staged),
        )

    def _retain(self) -> None:
        """Step 7: retention after a commit, and a sweep every `SWEEP_EVERY` commits."""
        self._store._apply_retention(self.pipeline_id, self.live_files(), self._abandoned)
        self._abandoned = ()
        self._commits_since_sweep += 1
        if self._commits_since_sweep >= SWEEP_EVERY:
            self._commits_since_sweep = 0
            self._store._sweep(self.pipeline_id, self._rounds_done, self.live_files())

    def _write_manifest(self, cid: CheckpointId, data: bytes) -> None:
        """Write-once: a checkpoint id is never reused, even by a job that lost the lock."""
        path = f"{self.directory}/{manifest_name(cid)}"
        try:
            self._store.storage.write_new(path, data)
        except FileExistsError:
            raise CheckpointConflictError(self._store.url, self.pipeline_id, cid) from None

    def _materialization_due(self) -> bool:
        interval = self._store.materialization_interval_s
        return interval is not None and time.monotonic() - self._last_materialized >= interval

    def _needs_fallback(self) -> bool:
        """Checkpoints exist, but none would share no file with the next (`retention`)."""
        return self._store.materialization_interval_s is not None and self._store._needs_fallback(
            self.pipeline_id, self.live_files(), self._abandoned
        )

    def _compact(self) -> None:
        """Give the next checkpoint a fallback: rewrite the state into files no earlier
        checkpoint names. Small state (a new pipeline's second checkpoint) becomes one
        changelog segment, about the cost of the segment the commit writes anyway; large
        state (after restoring a fallback) a materialization."""
        if len(self._table) > COMPACT_MAX_ENTRIES:
            self.materialize()
            return
        base = ChangelogWriter(
            self._store.storage, self.directory, "base", 1 << 62, name_prefix="changelog/"
        )
        for kg, ns, key, value in self._table.snapshot():
            base.append(Op.PUT, kg, ns, key, value)
        entry = base.flush()
        self._drop_uncommitted_chain()
        self._log.discard()  # buffered changes are in the table, hence in the base segment
        self._chain = [entry] if entry is not None else []
        self._materialization = ()

    def _read_commit_messages(self, messages: list[CommitMessage]) -> list[tuple]:
        seen: dict[tuple[str, int, int], CommitMessage] = {}
        for msg in messages:
            if msg.pipeline_id != self.pipeline_id:
                raise ValueError(
                    f"Commit message of pipeline {msg.pipeline_id!r} passed to pipeline "
                    f"{self.pipeline_id!r}; commit each pipeline's messages on its own store."
                )
            if msg.max_key_groups != self.max_key_groups:
                raise ValueError(
                    f"Commit message of stage {msg.stage!r} partition {msg.partition} used "
                    f"max_key_groups={msg.max_key_groups}, the pipeline uses "
                    f"{self.max_key_groups}; open staged writers with the store's value."
                )
            other = seen.get(msg.task) or None
            done = self._committed_tasks.get(msg.task)
            if other is not None or (done is not None and done != msg.attempt):
                attempts = sorted({msg.attempt, other.attempt if other else done})
                raise ValueError(
                    f"Two attempts {attempts} of stage {msg.stage!r} round {msg.round} partition "
                    f"{msg.partition} of pipeline {self.pipeline_id!r} were passed to commit; "
                    "pass exactly one commit message per (stage, round, partition)."
                )
            if done is None:
                seen[msg.task] = msg
        staged = []
        for task in sorted(seen):
            msg = seen[task]
            records = []
            for f in msg.files:
                path = f"{self.directory}/{f.name}"
                data = read_segment(self._store.storage, path, f)
                records.extend(iter_records(data, path))
            staged.append((msg, records))
        return staged

    def materialize(self) -> None:
        """Write a full snapshot now; later checkpoints name it instead of the older changelog."""
        self._check_open()
        subdir, entries = write_materialization(
            self._store.storage,
            f"{self.directory}/materializations",
            self._table,
            self._store.materialization_files,
        )
        self._materialization = tuple(
            FileEntry(
                name=f"materializations/{e.name}",
                size=e.size,
                checksum=e.checksum,
                records=e.records,
                kg_start=e.kg_start,
                kg_stop=e.kg_stop,
            )
            for e in entries
        )
        self._drop_uncommitted_chain()
        self._chain = []
        self._log.discard()  # buffered changes are in the snapshot
        self._last_materialized = time.monotonic()

    def _drop_uncommitted_chain(self) -> None:
        """Segments flushed since the last commit are covered by a new snapshot and named by
        no manifest: delete them now rather than leave them to `clean`."""
        for f in self._chain:
            if f.name not in self._committed_files:
                self._store.storage.delete(f"{self.directory}/{f.name}")

    def live_files(self) -> set[str]:
        """Names (relative to the pipeline dir) the next checkpoint will need."""
        return {f.name for f in self._materialization} | {f.name for f in self._chain}

    # -- restore -------------------------------------------------------------------------------
    def restore(
        self,
        checkpoint_id: int | None = None,
        *,
        fingerprint: str | None = None,
        allow_fingerprint_change: bool = False,
    ) -> CheckpointInfo | None:
        """Replace the working state with a committed checkpoint's.

        Without ``checkpoint_id``: the latest complete one, falling back past damaged ones with
        a logged warning naming the file and the reason; None if the pipeline has none. With
        it: exactly that one, or `CheckpointNotFoundError` / `CheckpointCorruptError`. A
        fingerprint differing from ``fingerprint`` raises `IncompatibleCheckpointError` unless
        ``allow_fingerprint_change``. The pipeline adopts the checkpoint's ``max_key_groups``.
        """
        self._check_open()
        store = self._store
        ids = store._manifest_ids(self.pipeline_id)
        if checkpoint_id is not None:
            if checkpoint_id not in ids:
                raise CheckpointNotFoundError(self.pipeline_id, checkpoint_id, store.url)
            ids = [CheckpointId(checkpoint_id)]
        if not ids:
            return None
        failures = []
        for cid in sorted(ids, reverse=True):
            try:
                manifest = store.load_manifest(self.pipeline_id, cid)
                if (
                    fingerprint is not None
                    and manifest.fingerprint != fingerprint
                    and not allow_fingerprint_change
                ):
                    raise IncompatibleCheckpointError(
                        self.pipeline_id, cid, manifest.fingerprint, fingerprint
                    )
                self._load(manifest)
            except CheckpointCorruptError as e:
                if checkpoint_id is not None:
                    raise
                failures.append(e)
                log.warning(
                    "Checkpoint %d of pipeline %r is unusable, falling back to an earlier one: %s",
                    cid,
                    self.pipeline_id,
                    e,
                )
                continue
            from sparkbeam.checkpoint.store import CheckpointInfo

            self._abandoned = tuple(c for c in ids if c > cid)  # damaged, skipped above
            return CheckpointInfo.from_manifest(manifest)
        raise CheckpointCorruptError(
            f"{store.url}/{self.directory}",
            f"all {len(failures)} checkpoints of pipeline {self.pipeline_id!r} are damaged ("
            + "; ".join(f"{e.path}: {e.reason}" for e in failures)
            + ")",
            "No complete checkpoint is left; restore from a backup, or start fresh with a new "
            "--checkpoint_dir.",
        )

    def _load(self, manifest: Manifest) -> None:
        if manifest.max_key_groups != self.max_key_groups:
            self._table.close()
            self.max_key_groups = manifest.max_key_groups
            self._table = make_state_table(self._store.state_backend, self.max_key_groups)
        self._table.clear()
        try:
            replay(
                self._store.storage,
                self.directory,
                manifest,
                self._table.put,
                self._table.delete,
            )
        except BaseException:
            self._table.clear()
            raise
        self._log.discard()
        self._materialization = manifest.materialization
        self._chain = list(manifest.changelog)
        self._completed = set(manifest.completed)
        self._positions = dict(manifest.source_positions)
        self._committed_tasks = {(s, r, p): a for s, r, p, a in manifest.commits}
        self._rounds_done = {}
        for stage, rnd, _p, _a in manifest.commits:
            self._rounds_done[stage] = max(rnd, self._rounds_done.get(stage, -1))
        self._committed_files = {f.name for f in manifest.files}
        self._last_materialized = time.monotonic()
        self.last_checkpoint_id = manifest.checkpoint_id

    def close(self) -> None:
        """Drop the working state without checkpointing (uncommitted changes are lost)."""
        if not self._closed:
            self._closed = True
            self._table.close()
            self._store._pipelines.pop(self.pipeline_id, None)

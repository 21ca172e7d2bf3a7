"""The commit protocol of one pipeline: `CheckpointChain`, the files its next checkpoint names.

Owns: the numbered steps of a commit (`CheckpointChain.commit`): checking the tasks' commit
messages, reading those of driver-owned namespaces and taking the handles of task-owned ones
(`task_state`: their bytes are never read here), materialization and compaction (so a
checkpoint has a fallback), the manifest (the commit point), then retention and sweeps. Leaves
to others: the driver's state (``pipeline.PipelineStore``), restore, the retention rules, the
store-wide listing and deleting (``store``) and the file formats.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sparkbeam.checkpoint.changelog import ChangelogWriter, Op, read_segment
from sparkbeam.checkpoint.errors import CheckpointConflictError, CheckpointCorruptError
from sparkbeam.checkpoint.ids import CheckpointId, FileEntry
from sparkbeam.checkpoint.manifest import Manifest, encode_manifest, manifest_name
from sparkbeam.checkpoint.materialization import write_materialization
from sparkbeam.checkpoint.retention import FALLBACK_MAX_INTERVALS, needs_fallback
from sparkbeam.checkpoint.staging import CommitMessage, CommitStatus
from sparkbeam.checkpoint.state_layout import LAYOUT_KEY, LAYOUT_VERSION
from sparkbeam.checkpoint.task_state import NamespaceState, TaskState

if TYPE_CHECKING:
    from sparkbeam.checkpoint.pipeline import PipelineStore
    from sparkbeam.checkpoint.store import CheckpointStore

SWEEP_EVERY = 16
"""Commits between two sweeps of files nobody will commit (one listing each)."""
COMPACT_MAX_ENTRIES = 50_000
"""Up to this many entries, the snapshot that gives a checkpoint its fallback is one segment."""

Staged = list[tuple[CommitMessage, list[tuple[str, bytes]]]]
"""The commit messages of one checkpoint, each with its staged files (path, verified bytes;
none for a task-owned message)."""


class CheckpointChain:
    """The materialization and changelog files the next checkpoint of a pipeline names, and
    what the last commit or restore left: committed tasks, rounds, files, status."""

    def __init__(self, store: CheckpointStore, work: PipelineStore) -> None:
        self.store, self.work = store, work
        self.materialization: tuple[FileEntry, ...] = ()
        self.files: list[FileEntry] = []
        """Changelog segments after the materialization, in order."""
        self.task_state = TaskState()
        """Handles of the task-owned namespaces."""
        self.committed_files: set[str] = set()
        """Files named by the last committed manifest."""
        self.committed_tasks: dict[tuple[str, int, int], int] = {}
        self.rounds_done: dict[str, int] = {}
        """Per stage, the latest round committed: its other staged files are garbage."""
        self.abandoned: tuple[CheckpointId, ...] = ()
        """Damaged checkpoints newer than the restored one; the next commit drops them."""
        self.commits_since_sweep = 0
        self.last_materialized = time.monotonic()
        self.last_checkpoint_id: CheckpointId | None = None
        self.status: CommitStatus | None = None

    def add(self, entry: FileEntry | None) -> None:
        """Append a segment the driver's changelog flushed (None: nothing was flushed)."""
        if entry is not None:
            self.files.append(entry)

    def drop(self, namespace: str) -> None:
        """The next checkpoint without task-owned ``namespace`` (``drop_task_owned``)."""
        spaces = self.task_state.namespaces
        if namespace in spaces:
            self.task_state = TaskState({ns: s for ns, s in spaces.items() if ns != namespace})

    def live_files(self) -> set[str]:
        """Names (relative to the pipeline dir) the next checkpoint will need."""
        files = (*self.materialization, *self.files, *self.task_state.files())
        return {f.name for f in files}

    # -- commit --------------------------------------------------------------------------------
    def commit(
        self,
        fingerprint: str,
        parallelism: int,
        metadata: dict[str, Any] | None,
        commit_messages: Iterable[CommitMessage],
    ) -> CheckpointId:
        """Commit the working state as the next checkpoint (``PipelineStore.checkpoint``).

        Step 1. STARTED: check the commit messages (one attempt per (stage, round, partition))
                and read + verify the staged files of driver-owned namespaces before anything
                is applied. Files of task-owned namespaces are not read: their tasks wrote
                their sizes and checksums, and the tasks that read them check those.
        Step 2. Flush the driver's changelog buffer: its changes precede the staged ones.
        Step 3. Apply the staged changes to the driver's state (``PipelineStore.apply``) and
                append their files to the chain; append a task-owned message's files to its
                namespaces' logs and take its snapshots and counts (`task_state`); in
                (stage, round, partition) order.
        Step 4. Materialize the driver's state if ``materialization_interval_s`` has passed;
                else, if no retained checkpoint would share no file with this one, give it a
                fallback (`retention`): ask the tasks to snapshot their ranges in the next
                round while the task-owned files are shared, then compact the driver's state
                into new files.
        Step 5. PREPARED: build the manifest naming the materialization and the chain.
        Step 6. Write the manifest atomically -- the commit point. COMMITTED.
        Step 7. Retention: drop checkpoints beyond ``retain`` but the fallback, and abandoned
                ones, then files only they named; every `SWEEP_EVERY` commits, delete files
                nobody will commit (`retention.sweep`).
        A failure before step 6 leaves the status ABORTED and no new checkpoint visible; the
        changes stay in the working state and go into the next checkpoint.
        """
        self.status = CommitStatus.STARTED
        try:
            staged = self._read_commit_messages(list(commit_messages))  # Step 1.
            self.add(self.work.log.flush())  # Step 2.
            cid = CheckpointId(self.store._next_checkpoint_id(self.work.pipeline_id))
            self._apply_staged(staged, cid)  # Step 3.
            self.task_state = self.task_state.map(NamespaceState.truncated)
            if self._materialization_due():  # Step 4.
                self.materialize()
            elif self._needs_fallback(self.live_files()):
                self._give_fallback(cid)
            # Step 5.
            manifest = self._manifest(cid, fingerprint, parallelism, metadata, staged)
            self.status = CommitStatus.PREPARED
            if os.environ.get("SPARKBEAM_CRASH_AT") == f"prepared:{cid}":  # recovery tests
                os.kill(os.getpid(), signal.SIGKILL)
            self._write_manifest(manifest)  # Step 6.
            self.status = CommitStatus.COMMITTED
        except BaseException:
            self.status = CommitStatus.ABORTED
            raise
        self.last_checkpoint_id = cid
        self._retain()  # Step 7.
        return cid

    def _read_commit_messages(self, messages: list[CommitMessage]) -> Staged:
        """Step 1: one message per task not committed before, with its verified records."""
        seen: dict[tuple[str, int, int], CommitMessage] = {}
        for msg in messages:
            self._check_message(msg, seen.get(msg.task))
            if msg.task not in self.committed_tasks:
                seen[msg.task] = msg
        staged = []
        for task in sorted(seen):
            msg, segments = seen[task], []
            for f in () if msg.task_owned else msg.files:
                path = f"{self.work.directory}/{f.name}"
                segments.append((path, read_segment(self.store.storage, path, f)))
            staged.append((msg, segments))
        return staged

    def _check_message(self, msg: CommitMessage, other: CommitMessage | None) -> None:
        pid, max_key_groups = self.work.pipeline_id, self.work.max_key_groups
        if msg.pipeline_id != pid:
            raise ValueError(
                f"Commit message of pipeline {msg.pipeline_id!r} passed to pipeline {pid!r}; "
                "commit each pipeline's messages on its own store."
            )
        if msg.max_key_groups != max_key_groups:
            raise ValueError(
                f"Commit message of stage {msg.stage!r} partition {msg.partition} used "
                f"max_key_groups={msg.max_key_groups}, the pipeline uses {max_key_groups}; "
                "open staged writers with the store's value."
            )
        done = self.committed_tasks.get(msg.task)
        if other is not None or (done is not None and done != msg.attempt):
            attempts = sorted({msg.attempt, other.attempt if other else done})
            raise ValueError(
                f"Two attempts {attempts} of stage {msg.stage!r} round {msg.round} partition "
                f"{msg.partition} of pipeline {pid!r} were passed to commit; pass exactly one "
                "commit message per (stage, round, partition)."
            )

    def _apply_staged(self, staged: Staged, cid: int) -> None:
        """Step 3: the staged changes into the driver's state and their files into the chain,
        or a task-owned message's handles into `task_state`."""
        for msg, segments in staged:
            if msg.task_owned:
                self._take_handles(msg, cid)
                self.work.mark_positions(msg)
            else:
                self.work.apply(msg, segments)
                self.files.extend(msg.files)
            self.committed_tasks[msg.task] = msg.attempt
            self.rounds_done[msg.stage] = max(msg.round, self.rounds_done.get(msg.stage, -1))
        # Only each stage's newest round, as a restore knows (`adopt`): a job commits forever.
        done = self.rounds_done
        self.committed_tasks = {
            task: attempt for task, attempt in self.committed_tasks.items()
            if task[1] >= done.get(task[0], -1)
        }  # fmt: skip

    def _take_handles(self, msg: CommitMessage, cid: int) -> None:
        """A task-owned message: its files appended to its namespaces' logs, then its
        snapshots (as of its own changes, or of an earlier round's) and counts."""
        spaces = dict(self.task_state.namespaces)

        def of(ns: str) -> NamespaceState:
            return spaces.get(ns) or NamespaceState.empty(self.work.max_key_groups)

        for ns in sorted(msg.namespaces):
            spaces[ns] = of(ns).append(msg.files)
        for snap in msg.snapshots:
            spaces[snap.namespace] = of(snap.namespace).rebase(
                snap.start, snap.stop, snap.files, snap.entries, cid, snap.since
            )
        for ns, start, stop, entries in msg.counts:
            spaces[ns] = of(ns).count(start, stop, entries)
        self.task_state = TaskState(spaces)

    def _give_fallback(self, cid: int) -> None:
        """Step 4: make the next checkpoint share no file with a retained one: first the tasks
        snapshot their ranges (the driver holds no task state), then the driver compacts."""
        self.task_state = self.task_state.map(lambda s: s.without_empty_bases(cid))
        task_files = {f.name for f in self.task_state.files()}
        if task_files and self._needs_fallback(task_files):
            self.task_state = self.task_state.map(
                lambda s: s if s.snapshots_pending else s.request_snapshots(cid)
            )
            return
        self._compact()

    def _manifest(
        self, cid: CheckpointId, fingerprint: str, parallelism: int, metadata, staged: Staged
    ) -> Manifest:
        """Step 5: the manifest naming the materialization and the chain, and the state layout
        its values are in (a restore refuses any other, `state_layout.check_restorable`)."""
        work = self.work
        return Manifest(
            pipeline_id=work.pipeline_id,
            checkpoint_id=cid,
            created=time.time(),
            fingerprint=fingerprint,
            parallelism=parallelism,
            max_key_groups=work.max_key_groups,
            materialization=self.materialization,
            changelog=tuple(self.files),
            completed=work.completed(),
            source_positions=work.source_positions(),
            entries=len(work),
            metadata={**(metadata or {}), LAYOUT_KEY: LAYOUT_VERSION},
            commits=tuple((*m.task, m.attempt) for m, _ in staged),
            task_state=self.task_state,
        )

    def _write_manifest(self, manifest: Manifest) -> None:
        """Step 6, write-once: a checkpoint id is never reused, even by a job that lost the lock."""
        pid, cid = self.work.pipeline_id, manifest.checkpoint_id
        path = f"{self.work.directory}/{manifest_name(cid)}"
        try:
            self.store.storage.write_new(path, encode_manifest(manifest))
        except FileExistsError:
            raise CheckpointConflictError(self.store.url, pid, cid) from None
        self.store._manifest_cache[(pid, cid)] = manifest
        self.committed_files = {f.name for f in manifest.files}

    def _retain(self) -> None:
        """Step 7: retention after a commit, and a sweep every `SWEEP_EVERY` commits."""
        pid = self.work.pipeline_id
        self.store._apply_retention(pid, self.live_files(), self.abandoned)
        self.abandoned = ()
        self.commits_since_sweep += 1
        if self.commits_since_sweep >= SWEEP_EVERY:
            self.commits_since_sweep = 0
            self.store._sweep(pid, self.rounds_done, self.live_files())

    # -- materialization and compaction ---------------------------------------------------------
    def _materialization_due(self) -> bool:
        interval = self.store.materialization_interval_s
        return interval is not None and time.monotonic() - self.last_materialized >= interval

    def _needs_fallback(self, next_files: set[str]) -> bool:
        """Checkpoints exist, but none young enough (`retention.FALLBACK_MAX_INTERVALS`) would
        share no file with one naming ``next_files``."""
        interval = self.store.materialization_interval_s
        if interval is None:
            return False
        pid = self.work.pipeline_id
        ids = [c for c in self.store._manifest_ids(pid) if c not in self.abandoned]
        oldest = time.time() - FALLBACK_MAX_INTERVALS * interval
        young = [c for c in ids if self._created(c) >= oldest]
        return needs_fallback(ids, self.store._files_of(pid), next_files, young)

    def _created(self, cid: int) -> float:
        """When checkpoint ``cid`` was committed (0: its manifest is unreadable)."""
        try:
            return self.store.load_manifest(self.work.pipeline_id, cid).created
        except CheckpointCorruptError:
            return 0.0

    def _compact(self) -> None:
        """Give the next checkpoint a fallback: rewrite the state into files no earlier one
        names. Small state becomes one segment, about the cost of the one the commit writes
        anyway; large state (after restoring a fallback) a materialization."""
        if len(self.work.table) > COMPACT_MAX_ENTRIES:
            self.materialize()
            return
        base = ChangelogWriter(
            self.store.storage, self.work.directory, "base", 1 << 62, name_prefix="changelog/"
        )
        for kg, ns, key, value in self.work.table.snapshot():
            base.append(Op.PUT, kg, ns, key, value)
        entry = base.flush()
        self._restart_at((), [entry] if entry is not None else [])

    def materialize(self) -> None:
        """A full snapshot of the driver's state now; later checkpoints name it, not the log."""
        materialization = write_materialization(
            self.store.storage,
            self.work.directory,
            self.work.table,
            self.store.materialization_files,
        )
        self._restart_at(tuple(materialization), [])
        self.last_materialized = time.monotonic()

    def _restart_at(self, materialization: tuple[FileEntry, ...], files: list[FileEntry]) -> None:
        """The chain starts over at new files holding the whole driver's state. Segments
        flushed since the last commit, which they cover and no manifest names, are deleted now
        rather than left to `clean`; the buffered changes are in the table, so in the files."""
        for f in self.files:
            if f.name not in self.committed_files:
                self.store.storage.delete(f"{self.work.directory}/{f.name}")
        self.work.log.discard()
        self.materialization, self.files = materialization, files

    # -- restore ---------------------------------------------------------------------------------
    def adopt(self, manifest: Manifest) -> None:
        """After a restore of ``manifest``: the chain is the one it names."""
        self.materialization = manifest.materialization
        self.files = list(manifest.changelog)
        self.task_state = manifest.task_state
        self.committed_tasks = {(s, r, p): a for s, r, p, a in manifest.commits}
        self.rounds_done = {}
        for stage, rnd, _p, _a in manifest.commits:
            self.rounds_done[stage] = max(rnd, self.rounds_done.get(stage, -1))
        self.committed_files = {f.name for f in manifest.files}
        self.last_materialized = time.monotonic()
        self.last_checkpoint_id = manifest.checkpoint_id

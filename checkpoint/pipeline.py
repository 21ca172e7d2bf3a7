"""One pipeline's driver-owned state: `PipelineStore`.

Owns: the state table of the namespaces the driver writes (sink files and staging
directories), the driver's changelog of its changes, completed-work markers and source
positions, applying a task's staged changes to those namespaces, and loading a checkpoint's
driver files. Task-owned namespaces (`state_layout.is_task_owned`) are not here: the chain
keeps only their handles (`task_state`) and tasks read them. Leaves to others: the commit
protocol (`commit`), restore (`restore`), store-wide concerns (`store`) and file formats.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from sparkbeam.checkpoint import restore as restore_protocol
from sparkbeam.checkpoint import state_layout
from sparkbeam.checkpoint.changelog import (
    ChangelogWriter,
    NoChangelog,
    Op,
    apply_records,
    iter_records,
)
from sparkbeam.checkpoint.commit import CheckpointChain
from sparkbeam.checkpoint.errors import StoreClosedError
from sparkbeam.checkpoint.ids import CheckpointId, PipelineId
from sparkbeam.checkpoint.keygroups import KeyGroupRange, key_group
from sparkbeam.checkpoint.layout import pipeline_dir
from sparkbeam.checkpoint.manifest import Manifest
from sparkbeam.checkpoint.reader import namespace_records, replay
from sparkbeam.checkpoint.staging import CommitMessage, CommitStatus, check_key
from sparkbeam.checkpoint.state_table import make_state_table
from sparkbeam.checkpoint.task_state import NamespaceState

if TYPE_CHECKING:
    from sparkbeam.checkpoint.store import CheckpointInfo, CheckpointStore


class PipelineStore:
    """Keyed state + checkpoints of one pipeline (``CheckpointStore.pipeline``), on the driver,
    not thread-safe. Restore before opening staged writers: a restored pipeline keeps the
    ``max_key_groups`` of its checkpoints."""

    def __init__(self, store: CheckpointStore, pipeline_id: str):
        self._store = store
        self.pipeline_id = PipelineId(pipeline_id)
        self.directory = pipeline_dir(pipeline_id)
        self.max_key_groups = store.max_key_groups
        self.table = make_state_table(store.state_backend, self.max_key_groups)
        """The driver-owned state (the commit protocol applies, snapshots and materializes it)."""
        self.log = (
            ChangelogWriter(
                store.storage, self.directory, "driver", store.flush_bytes, name_prefix="changelog/"
            )
            if store.changelog
            else NoChangelog(f"Pipeline {pipeline_id!r} of {store.url!r}")
        )
        """The driver's changes since the last commit, flushed into the chain's segments."""
        self.chain = CheckpointChain(store, self)
        self._completed: set[str] = set()
        self._positions: dict[str, bytes] = {}
        self._closed = False

    # -- state ---------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"Pipeline {self.pipeline_id!r} of {self._store.url!r}")

    def get(self, namespace: str, key: bytes) -> bytes | None:
        return self.table.get(namespace, key)

    def put(self, namespace: str, key: bytes, value: bytes) -> None:
        self._change(Op.PUT, namespace, key, value)

    def delete(self, namespace: str, key: bytes) -> None:
        self._change(Op.DELETE, namespace, key, b"")

    def _change(self, op: Op, namespace: str, key: bytes, value: bytes) -> None:
        """One put or delete of a driver-owned key: into the table and the driver's changelog."""
        self._check_open()
        check_key(namespace, key, value)
        if state_layout.is_task_owned(namespace):
            raise ValueError(
                f"Namespace {namespace!r} is task-owned: only the tasks that own its key groups "
                "write it (through a staged writer); the driver holds its handles only."
            )
        kg = key_group(key, self.max_key_groups)
        apply_records([(op, kg, namespace, key, value)], self.table.put, self.table.delete)
        self.chain.add(self.log.append(op, kg, namespace, key, value))

    def items(self, namespace: str | None = None) -> Iterator[tuple[str, bytes, bytes]]:
        """(namespace, key, value) of the driver-owned state, optionally of one namespace."""
        return self.table.items(namespace)

    def namespaces(self) -> set[str]:
        """Every namespace with state: the driver's and the task-owned ones."""
        return {ns for ns, _, _ in self.table.items()} | set(self.chain.task_state.namespaces)

    def __len__(self) -> int:
        """Entries: the driver's, counted, and the task-owned ones as tasks last reported."""
        return len(self.table) + self.chain.task_state.entries

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

    def apply(self, msg: CommitMessage, segments: list[tuple[str, bytes]]) -> None:
        """A task attempt's verified segments of driver-owned namespaces, markers and positions."""
        for path, data in segments:
            apply_records(iter_records(data, path), self.table.put, self.table.delete)
        self.mark_positions(msg)

    def mark_positions(self, msg: CommitMessage) -> None:
        """A task attempt's completed-work markers and source positions."""
        self._completed.update(msg.completed)
        self._positions.update(msg.source_positions)

    def load(self, manifest: Manifest) -> None:
        """Replace the working state with ``manifest``'s (the last step of a restore)."""
        if manifest.max_key_groups != self.max_key_groups:
            self.table.close()
            self.max_key_groups = manifest.max_key_groups
            self.table = make_state_table(self._store.state_backend, self.max_key_groups)
        self.table.clear()
        try:
            replay(
                self._store.storage, self.directory, manifest, self.table.put, self.table.delete,
                driver_only=True,
            )  # fmt: skip
        except BaseException:
            self.table.clear()
            raise
        self.log.discard()
        self._completed = set(manifest.completed)
        self._positions = dict(manifest.source_positions)
        self.chain.adopt(manifest)

    def task_owned(self) -> set[str]:
        """The task-owned namespaces the next checkpoint names."""
        return set(self.chain.task_state.namespaces)

    def task_owned_state(self, namespace: str) -> NamespaceState | None:
        """The handles of a task-owned namespace as the last commit left them (None: none)."""
        return self.chain.task_state.namespaces.get(namespace)

    def drop_task_owned(self, namespace: str) -> None:
        """Forget a task-owned namespace whose rows a round took whole (pushed-back input fed
        back): the next checkpoint names none of its files. A restore brings it back."""
        self._check_open()
        self.chain.drop(namespace)

    def read_task_owned(self, namespace: str) -> dict[bytes, bytes]:
        """{key: value} of a task-owned namespace, every key group, read from the store: only
        for one-off work, never in a round (a checkpoint's residual summary that recorded none
        of a stage, a transform-level startpoint's fan-out at restore)."""
        chains = self.chain.task_state.namespaces.get(namespace)
        out: dict[bytes, bytes] = {}
        if chains is not None:
            every = KeyGroupRange(0, chains.max_key_groups)
            storage = self._store.storage
            for op, _, key, value, _ in namespace_records(
                storage, self.directory, namespace, chains, every
            ):
                if op is Op.PUT:
                    out[key] = value
                else:
                    out.pop(key, None)
        return out

    # -- checkpoint and restore (`commit`, `restore`) ----------------------------------------
    @property
    def status(self) -> CommitStatus | None:
        """Status of the latest `checkpoint` call (None before the first)."""
        return self.chain.status

    @property
    def last_checkpoint_id(self) -> CheckpointId | None:
        return self.chain.last_checkpoint_id

    def checkpoint(
        self,
        *,
        fingerprint: str = "",
        parallelism: int = 1,
        metadata: dict[str, Any] | None = None,
        commit_messages: Iterable[CommitMessage] = (),
    ) -> CheckpointId:
        """Commit the current state as the next checkpoint (steps: `CheckpointChain.commit`)."""
        self._check_open()
        return restore_protocol.committed(
            self, self.chain.commit(fingerprint, parallelism, metadata, commit_messages)
        )

    def materialize(self) -> None:
        """Write a full snapshot now; later checkpoints name it instead of the older changelog."""
        self._check_open()
        self.chain.materialize()

    def live_files(self) -> set[str]:
        """Names (relative to the pipeline dir) the next checkpoint will need."""
        return self.chain.live_files()

    def restore(
        self,
        checkpoint_id: int | None = None,
        *,
        fingerprint: str | None = None,
        allow_fingerprint_change: bool = False,
    ) -> CheckpointInfo | None:
        """Replace the working state with a committed checkpoint's: ``checkpoint_id``, else the
        latest usable one (falling back past damaged ones with a warning; None if there is
        none). Another ``fingerprint`` raises `IncompatibleCheckpointError` unless
        ``allow_fingerprint_change``. The pipeline adopts the checkpoint's ``max_key_groups``."""
        self._check_open()
        return restore_protocol.restore(
            self._store, self, checkpoint_id, fingerprint, allow_fingerprint_change
        )

    def close(self) -> None:
        """Drop the working state without checkpointing (uncommitted changes are lost)."""
        if not self._closed:
            self._closed = True
            self.table.close()
            self._store._pipelines.pop(self.pipeline_id, None)

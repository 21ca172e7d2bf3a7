"""One pipeline's working state: `PipelineStore`.

Owns: the working state table of one independent pipeline, the driver's changelog writer
that records its changes, its completed-work markers and source positions, applying a task's
staged changes to them, and loading a checkpoint's files into them. Leaves to others: the
commit protocol -- numbered steps, materialization, retention (`commit.CheckpointChain`) --,
restore with fallback (`restore`), the store-wide concerns -- lock, listing, cleaning,
per-subtask reads (`store`) -- and the file formats (`changelog`, `manifest`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkbeam.checkpoint import restore as restore_protocol
from sparkbeam.checkpoint.changelog import ChangelogWriter, NoChangelog, Op, iter_records
from sparkbeam.checkpoint.commit import CheckpointChain
from sparkbeam.checkpoint.errors import StoreClosedError
from sparkbeam.checkpoint.ids import CheckpointId, PipelineId
from sparkbeam.checkpoint.keygroups import key_group
from sparkbeam.checkpoint.layout import pipeline_dir
from sparkbeam.checkpoint.manifest import Manifest
from sparkbeam.checkpoint.reader import replay
from sparkbeam.checkpoint.staging import CommitMessage, CommitStatus, check_key
from sparkbeam.checkpoint.state_table import make_state_table

if TYPE_CHECKING:
    from sparkbeam.checkpoint.store import CheckpointInfo, CheckpointStore

DEFERRED_BYTES = 64 << 20
"""Staged bytes a driver keeps unapplied at most (``PipelineStore.apply``)."""


@dataclass(eq=False)
class _Deferred:
    """One task attempt's committed changes to one namespace, not yet in the table."""

    namespace: str
    segments: list[tuple[str, bytes]]
    entries_delta: int

    @property
    def size(self) -> int:
        return sum(len(data) for _, data in self.segments)


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
        self.table = make_state_table(store.state_backend, self.max_key_groups)
        """The working state (the commit protocol applies, snapshots and materializes it)."""
        self.log = (
            ChangelogWriter(
                store.storage, self.directory, "driver", store.flush_bytes, name_prefix="changelog/"
            )
            if store.changelog
            else NoChangelog(f"Pipeline {pipeline_id!r} of {store.url!r}")
        )
        """The driver's changes since the last commit, flushed into the chain's segments."""
        self.chain = CheckpointChain(store, self)
        self._deferred: list[_Deferred] = []
        """Committed staged changes not yet in ``table``, in commit order (``apply``)."""
        self._deferred_ns: set[str] = set()
        self._completed: set[str] = set()
        self._positions: dict[str, bytes] = {}
        self._closed = False

    # -- state ---------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"Pipeline {self.pipeline_id!r} of {self._store.url!r}")

    def get(self, namespace: str, key: bytes) -> bytes | None:
        self.settle(namespace)
        return self.table.get(namespace, key)

    def put(self, namespace: str, key: bytes, value: bytes) -> None:
        self._check_open()
        check_key(namespace, key, value)
        self.settle(namespace)
        kg = key_group(key, self.max_key_groups)
        self.table.put(namespace, key, value, kg)
        self.chain.add(self.log.append(Op.PUT, kg, namespace, key, value))

    def delete(self, namespace: str, key: bytes) -> None:
        self._check_open()
        check_key(namespace, key)
        self.settle(namespace)
        kg = key_group(key, self.max_key_groups)
        self.table.delete(namespace, key, kg)
        self.chain.add(self.log.append(Op.DELETE, kg, namespace, key, b""))

    def items(self, namespace: str | None = None) -> Iterator[tuple[str, bytes, bytes]]:
        """(namespace, key, value) of the working state, optionally of one namespace."""
        self.settle(namespace)
        return self.table.items(namespace)

    def __len__(self) -> int:
        return len(self.table) + sum(d.entries_delta for d in self._deferred)

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
        """A task attempt's staged changes (its verified segments), markers and positions
        (commit step 3). Changes to one namespace whose entry count the task reported wait
        until the driver reads that namespace, snapshots or counts the state (``settle``):
        the driver seldom reads a GroupByKey's state, and parsing it costs ~1.3 us a record
        on the commit's path."""
        if msg.entries_delta is not None and len(msg.namespaces) == 1:
            (namespace,) = msg.namespaces
            self._deferred.append(_Deferred(namespace, segments, msg.entries_delta))
            self._deferred_ns.add(namespace)
            if sum(d.size for d in self._deferred) > DEFERRED_BYTES:
                self.settle()
        else:
            self._apply_segments(segments)
        self._completed.update(msg.completed)
        self._positions.update(msg.source_positions)

    def settle(self, namespace: str | None = None) -> None:
        """Apply the deferred changes of ``namespace`` (None: all), in commit order."""
        if not self._deferred or (namespace is not None and namespace not in self._deferred_ns):
            return
        for d in [d for d in self._deferred if namespace is None or d.namespace == namespace]:
            self._apply_segments(d.segments)
            self._deferred.remove(d)  # only once applied (applying again gives the same state)
        self._deferred_ns = {d.namespace for d in self._deferred}

    def _apply_segments(self, segments: list[tuple[str, bytes]]) -> None:
        put, delete = self.table.put, self.table.delete
        for path, data in segments:
            for op, kg, ns, key, value in iter_records(data, path):
                if op is Op.PUT:
                    put(ns, key, value, kg)
                else:
                    delete(ns, key, kg)

    def load(self, manifest: Manifest) -> None:
        """Replace the working state with ``manifest``'s (the last step of a restore)."""
        if manifest.max_key_groups != self.max_key_groups:
            self.table.close()
            self.max_key_groups = manifest.max_key_groups
            self.table = make_state_table(self._store.state_backend, self.max_key_groups)
        self._deferred, self._deferred_ns = [], set()
        self.table.clear()
        try:
            storage = self._store.storage
            replay(storage, self.directory, manifest, self.table.put, self.table.delete)
        except BaseException:
            self.table.clear()
            raise
        self.log.discard()
        self._completed = set(manifest.completed)
        self._positions = dict(manifest.source_positions)
        self.chain.adopt(manifest)

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
        """Commit the current state as the next checkpoint of this pipeline.

        The numbered steps are `CheckpointChain.commit`'s. A failure before the manifest is
        written leaves `status` ABORTED and no new checkpoint visible; the changes stay in
        the working state and go into the next checkpoint.
        """
        self._check_open()
        return self.chain.commit(fingerprint, parallelism, metadata, commit_messages)

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
        """Replace the working state with a committed checkpoint's.

        Without ``checkpoint_id``: the latest complete one, falling back past damaged ones with
        a logged warning naming the file and the reason; None if the pipeline has none. With
        it: exactly that one, or `CheckpointNotFoundError` / `CheckpointCorruptError`. A
        fingerprint differing from ``fingerprint`` raises `IncompatibleCheckpointError` unless
        ``allow_fingerprint_change``. The pipeline adopts the checkpoint's ``max_key_groups``.
        """
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

"""sparkbeam.checkpoint: the durable pipeline checkpoint store.

Keyed state in key groups, a changelog plus periodic materialization, atomic manifests with
two-phase commit across Spark tasks, restore at another parallelism, completed-work markers,
source positions, startpoints, retention, verification, and the state layout. Imports nothing
of Beam or Spark (Beam's ``FileSystems`` lazily, for non-local URLs). One pipeline's state is
``pipeline`` (the working state), ``commit`` and ``restore``; ``store`` is store-wide.
"""

from sparkbeam.checkpoint.errors import (
    CheckpointConflictError,
    CheckpointCorruptError,
    CheckpointNotFoundError,
    IncompatibleCheckpointError,
    StoreClosedError,
    StoreLockedError,
)
from sparkbeam.checkpoint.filesystem import (
    FileSystemsStorage,
    LocalStorage,
    MemoryStorage,
    Storage,
    open_storage,
)
from sparkbeam.checkpoint.ids import CheckpointId, FileEntry, KeyGroup, PipelineId
from sparkbeam.checkpoint.keygroups import (
    KeyGroupRange,
    key_group,
    key_group_range,
    stable_hash,
    subtask_for_key_group,
)
from sparkbeam.checkpoint.manifest import Manifest
from sparkbeam.checkpoint.pipeline import PipelineStore
from sparkbeam.checkpoint.reader import VerificationResult
from sparkbeam.checkpoint.staging import (
    CommitMessage,
    CommitStatus,
    StagedWriter,
    open_staged_writer,
)
from sparkbeam.checkpoint.startpoints import Startpoint, StartpointKind, Startpoints
from sparkbeam.checkpoint.state_table import (
    MemoryStateTable,
    RocksDBStateTable,
    StateTable,
    make_state_table,
)
from sparkbeam.checkpoint.store import (
    CheckpointInfo,
    CheckpointStore,
    open_store,
    open_working_store,
)

__all__ = [
    "CheckpointCorruptError",
    "CheckpointId",
    "CheckpointInfo",
    "CheckpointNotFoundError",
    "CheckpointStore",
    "CommitMessage",
    "CommitStatus",
    "FileEntry",
    "FileSystemsStorage",
    "IncompatibleCheckpointError",
    "KeyGroup",
    "KeyGroupRange",
    "LocalStorage",
    "Manifest",
    "MemoryStateTable",
    "MemoryStorage",
    "PipelineId",
    "PipelineStore",
    "RocksDBStateTable",
    "StagedWriter",
    "Startpoint",
    "StartpointKind",
    "Startpoints",
    "StateTable",
    "Storage",
    "StoreClosedError",
    "StoreLockedError",
    "CheckpointConflictError",
    "VerificationResult",
    "key_group",
    "key_group_range",
    "make_state_table",
    "open_staged_writer",
    "open_store",
    "open_working_store",
    "open_storage",
    "stable_hash",
    "subtask_for_key_group",
]

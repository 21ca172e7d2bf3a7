"""One task's key-group range of one task-owned namespace in one round: read, change, stage.

Every keyed task (a GroupByKey's buffers, a stateful DoFn's cells and timers, an SDF stage's
residuals, a triggered side input's view) does the same with its range: read it as of the
round's checkpoint (``staged_state.read_task_state``: kept by the worker between rounds, a
dict or, past the memory budget, a RocksDB on the executor's disk), change some keys, stage
the changes and the range's count or snapshot in the attempt's writer
(``range_staging.stage_range``), and after the writer finished keep the read with the changes
applied as the next round's read (``keep_staged``) and release it. `TaskRange` is that
sequence; a task says only what is special to it. Several ranges (namespaces) may stage into
one writer (a stateful stage's cells and timers): `finish` finishes it and keeps each.

Leaves to others: how a read is kept and caught up (``staged_state``), when a range snapshots
(``range_staging``, ``background_snapshots``), what the values mean (``state_layout``).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator, Mapping

from sparkbeam.checkpoint import key_group_range
from sparkbeam.checkpoint.keygroups import key_in_groups
from sparkbeam.checkpoint.staging import CommitMessage
from sparkbeam.runner.task.range_staging import stage_range
from sparkbeam.runner.task.staged_state import StateRound, keep_staged, read_task_state, release


class TaskRange:
    """The key groups ``subtask`` owns of ``namespace``, as of the round's checkpoint, and the
    round's changes to them (``changes``: key -> new value, None: deleted)."""

    def __init__(
        self, spec: StateRound, subtask: int, namespace: str,
        stored: Mapping[bytes, bytes] | None = None,
    ) -> None:  # fmt: skip
        """Read the range (``stored``: already read, or a test's state; not kept then)."""
        self.spec, self.subtask, self.namespace = spec, subtask, namespace
        self.groups = key_group_range(subtask, spec.parallelism, spec.max_key_groups)
        self._read = stored is None and spec.checkpoint_id is not None
        if stored is None:
            stored = read_task_state(spec, subtask, namespace) if self._read else {}
        self.stored: Mapping[bytes, bytes] = stored  # read-only: the worker keeps it
        self.changes: dict[bytes, bytes | None] = {}
        self._ids: Iterator[bytes] | None = None

    def get(self, key: bytes) -> bytes | None:
        if key in self.changes:
            return self.changes[key]
        return self.stored.get(key)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """The range as of its changes (streamed: ``stored`` may be on disk)."""
        changes = self.changes
        for key, value in self.stored.items():
            if key not in changes:
                yield key, value
        for key, change in changes.items():
            if change is not None:
                yield key, change

    def put(self, key: bytes, value: bytes) -> None:
        self.changes[key] = value

    def delete(self, key: bytes) -> None:
        if key in self.stored:
            self.changes[key] = None
        else:
            self.changes.pop(key, None)  # put and deleted in this round: nothing to stage

    def new_key(self, prefix: bytes) -> bytes:
        """``prefix`` + 0x00 + an id unique to this attempt whose key group is in the range
        (an append-only row, an SDF residual: it stays with this subtask, and follows its key
        group when a restore changes the parallelism)."""
        if self._ids is None:
            tag = uuid.uuid4().bytes[:12]
            self._ids = (tag + i.to_bytes(4, "big") for i in itertools.count())
        return key_in_groups(prefix + b"\x00", self._ids, self.groups, self.spec.max_key_groups)

    def held(self) -> int:
        """Keys the range holds after the changes: counted from them, not listed."""
        stored = self.stored
        added = sum(1 for k, v in self.changes.items() if v is not None and k not in stored)
        return len(stored) + added - sum(1 for v in self.changes.values() if v is None)

    def stage(self, writer, keys: int | None = None) -> None:
        """Write the changes to ``writer``, with the range's count (``keys``, or `held`) or its
        snapshot when one is due."""
        writer.write_all(self.namespace, self.changes)
        held = self.held() if keys is None else keys
        stage_range(writer, self.spec, self.subtask, self.namespace, self.stored, self.changes,
                    held)  # fmt: skip

    def keep(self, staged: CommitMessage) -> None:
        """After the writer finished as ``staged``: keep the read with the changes applied as
        the next round's read (valid once a checkpoint commits the files ``staged`` appends to
        this namespace), and release it. The range is not to be used after."""
        if self._read:
            files = staged.files if self.namespace in staged.namespaces else ()
            keep_staged(self.spec, self.subtask, self.namespace, self.stored, self.changes, files)
        self.release()

    def release(self) -> None:
        """Done with the read without keeping it (a task that failed or staged nothing)."""
        release(self.stored)


def finish(writer, *ranges: TaskRange) -> CommitMessage:
    """Finish ``writer``, into which ``ranges`` staged, and keep each range's read."""
    staged = writer.finish()
    for task_range in ranges:
        task_range.keep(staged)
    return staged

"""A streaming pipeline's side inputs across rounds: what each round's tasks load, and where
it is kept.

A side input fills over rounds. Without a trigger it is every chunk its writers emitted so
far: the first round that reads it in a round has one task per subtask keep the new chunks in
the store (``task.side_input_files``); the driver holds the files' handles and passes them to
the reading tasks, which read the files. A triggered side input is, per window, its latest
firing (``rounds.side_input_view``): one chunk per window, folded on the driver and kept in
its table (``side-input/<buffer>``).

Stores of layout 7 and older kept an untriggered side input's chunks in the driver's table
(``side-input/<buffer>``, round keys). A restore holds them aside; the next round that reads
the side input has its tasks keep them with that round's chunks, and deletes them from the
driver's table in the same checkpoint.
"""

from __future__ import annotations

import functools
from collections import defaultdict

from sparkbeam.checkpoint import state_layout
from sparkbeam.runner.errors import run_guarded
from sparkbeam.runner.rounds import side_input_view
from sparkbeam.runner.rounds.side_inputs import read_together
from sparkbeam.runner.task.records import CommitRecord
from sparkbeam.runner.task.side_input_files import (
    COMMIT_PREFIX,
    SideInputFiles,
    files_of,
    keeping_side_input,
)

SIDE_INPUT_PREFIX = state_layout.SIDE_INPUT_PREFIX


class StreamingSideInputs:
    """The side inputs of one pipeline's stages; ``values`` is what a round's tasks load
    (buffer -> a triggered view's chunks, or `SideInputFiles`)."""

    def __init__(self, ctx, pipeline_id: str, stages) -> None:
        self.ctx, self.pipeline_id, self.stages = ctx, pipeline_id, stages
        self.views = side_input_view.views(ctx.plan, stages)  # triggered buffer -> its view
        self.kept = {si.buffer for s in stages for si in s.side_inputs} - set(self.views)
        self.values: dict = {}
        self.state = None
        self.records: list[CommitRecord] = []  # the running round's keeping tasks' messages
        self._older: dict[str, list[tuple[bytes, bytes]]] = {}  # layout <= 7: (key, chunk)
        self._staged: dict[str, list] = defaultdict(list)  # buffer -> the round's new files
        self._rows: dict[str, int] = defaultdict(int)  # buffer -> chunks the round added

    def restore(self, state) -> None:
        """As of the restored checkpoint (``state``, the pipeline's store)."""
        self.state, self.records = state, []
        self._staged.clear()
        self._rows.clear()
        stored: dict[str, list[tuple[bytes, bytes]]] = defaultdict(list)
        for ns, key, value in state.items():
            if ns.startswith(SIDE_INPUT_PREFIX):
                chunk = state_layout.decode_side_input(value, ns)
                stored[ns[len(SIDE_INPUT_PREFIX) :]].append((key, chunk))
        self.views = side_input_view.views(self.ctx.plan, self.stages)  # fresh: no fold yet
        self.values = {}
        for buffer, view in self.views.items():
            side_input_view.restore(state, buffer, view, stored.pop(buffer, []))
            self.values[buffer] = view.chunks()
        self._older = {b: sorted(entries) for b, entries in stored.items() if b in self.kept}
        for buffer in self.kept:
            self.values[buffer] = self._files(buffer)

    def begin_round(self) -> None:
        self.records = []
        self._staged.clear()
        self._rows.clear()

    def committed(self) -> None:
        """The round's files are now the checkpoint's: handles as the commit left them."""
        self.begin_round()
        for buffer in self.kept:
            self.values[buffer] = self._files(buffer)

    def for_stage(self, stage, builder) -> dict:
        """What ``stage``'s tasks load this round; the first stage to read a side input in a
        round reads what its writers emitted (one Spark job for all it reads)."""
        unread = [
            si.buffer for si in stage.side_inputs if si.buffer not in builder.side_inputs_read
        ]
        unread = list(dict.fromkeys(unread))
        triggered = {b: builder.read(b, None) for b in unread if b in self.views}
        fresh = read_together(self.ctx.plane, triggered, lambda d: run_guarded(stage.id, d.collect))
        for buffer, new in fresh.items():
            view = self.views[buffer]
            side_input_view.store(self.state, buffer, view.fold(new))
            self.values[buffer] = view.chunks()
        self._keep(stage, builder, [b for b in unread if b in self.kept])
        builder.side_inputs_read.update(unread)
        return {si.buffer: self.values.get(si.buffer, []) for si in stage.side_inputs}

    def _keep(self, stage, builder, buffers: list[str]) -> None:
        """One Spark job: per buffer, one task per subtask keeps the round's new chunks."""
        plane, spec = self.ctx.plane, builder.state_round()
        jobs = []
        for buffer in buffers:
            parts = [d for d in (builder.source(buffer, None),) if d is not None]
            older = self._older.get(buffer)
            if older:
                parts.append(plane.parallelize([chunk for _, chunk in older], 1))
            if not parts:
                continue  # nothing new: no job
            keep = functools.partial(keeping_side_input, spec, buffer)
            subtasks = plane.as_subtasks(plane.union(parts), spec.parallelism)
            jobs.append(subtasks.mapPartitionsWithIndex(keep))
        if not jobs:
            return
        records = run_guarded(stage.id, plane.union(jobs).collect)
        for rec in records:
            buffer = rec.stage[len(COMMIT_PREFIX) :]
            self._staged[buffer].extend(rec.message.files)
            self._rows[buffer] += sum(f.records for f in rec.message.files)
        self.records.extend(records)
        for buffer in buffers:
            older = self._older.pop(buffer, None)
            for key, _ in older or ():  # kept by this round's tasks now
                self.state.delete(state_layout.side_input(buffer), key)
            self.values[buffer] = self._files(buffer)

    def _files(self, buffer: str) -> SideInputFiles:
        ns = state_layout.side_rows(buffer)
        committed = self.state.task_owned_state(ns)
        rows = (committed.entries if committed is not None else 0) + self._rows.get(buffer, 0)
        rows += len(self._older.get(buffer, ()))
        parts = files_of(committed, self._staged.get(buffer, ()), self.state.max_key_groups)
        return SideInputFiles(self.ctx.url, self.pipeline_id, ns, parts, rows)

"""A streaming pipeline's side inputs across rounds: kept by tasks, passed to readers as files.

The first stage of a round that reads a side input runs one Spark job in which tasks keep what
its writers emitted this round in their key groups (``task.side_input_files``): every chunk
without a trigger, a triggered one's latest firing per window, shuffled to the window's subtask
(``task.side_input_view``). The driver collects only commit messages (handles), and passes
each reading stage the checkpoint's files and the round's.

Readers and keeping tasks leave out the windows that ended by the expiry horizon passed with
the files (``horizons``); a side input once given data stays ready all the same
(``state_layout.side_data_marker``). Keeping tasks report the latest end they keep
(``SideInputHeld``); a round that brings a side input nothing runs its keeping tasks without
data (``task.side_input_expiry``) only once the horizon passed that end, or once after a
restore (the ends are not in the checkpoint).
"""

from __future__ import annotations

import dataclasses
import functools
from collections import defaultdict
from typing import Any

from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2

from sparkbeam.checkpoint import state_layout
from sparkbeam.runner.errors import run_guarded
from sparkbeam.runner.streaming import watermarks
from sparkbeam.runner.task.side_input_expiry import dropping_expired, keeping_view_reporting
from sparkbeam.runner.task.side_input_files import (
    COMMIT_PREFIX,
    Keeping,
    SideInputFiles,
    SideInputHeld,
    files_of,
    keeping_side_input,
    later,
)
from sparkbeam.runner.task.side_input_view import window_keyed


class StreamingSideInputs:
    """The side inputs of one pipeline's stages; ``values`` is what a round's tasks load
    (buffer -> `SideInputFiles`; `streaming.pushback.ready` asks it whether one has data)."""

    def __init__(self, ctx, pipeline_id: str, stages) -> None:
        self.ctx, self.pipeline_id = ctx, pipeline_id
        self.coders = {si.buffer: si.coder for s in stages for si in s.side_inputs}
        self.triggered = {si.buffer for s in stages for si in s.side_inputs if si.triggered}
        self.readers: dict[str, set[str]] = defaultdict(set)  # buffer -> stages that read it
        for stage in stages:
            for si in stage.side_inputs:
                self.readers[si.buffer].add(stage.id)
        self.retention = _retention(ctx.plan, stages)
        self._horizons: dict[str, int] = {}  # buffer -> the latest horizon (never goes back)
        self._round: dict[str, int | None] | None = None  # the running round's horizons
        self.values: dict[str, SideInputFiles] = {}
        self.state: Any = None  # the pipeline's PipelineStore, set by restore()
        self.records: list = []  # the running round's keeping tasks' commit records
        self._staged: dict[str, list] = defaultdict(list)  # buffer -> the round's new files
        self._rows: dict[str, int] = defaultdict(int)  # buffer -> records the round staged
        # buffer -> the latest end of what its store keeps unexpired (None: nothing; absent:
        # not known, as after a restore), as of the last commit; the running round's reports
        self._latest: dict[str, int | None] = {}
        self._reported: dict[str, tuple[bool, int | None]] = {}  # buffer -> (complete, latest)

    def restore(self, state) -> None:
        """As of the restored checkpoint (``state``, the pipeline's store)."""
        self.state = state
        self._horizons = {}
        self.begin_round()
        self.committed()
        # What the checkpoint keeps of a side input expires by ends it does not record.
        self._latest = {buffer: None for buffer, files in self.values.items() if not files.rows}

    def begin_round(self) -> None:
        self.records = []
        self._round = None
        self._staged.clear()
        self._rows.clear()
        self._reported.clear()

    def committed(self) -> None:
        """The round's files are now the checkpoint's: handles as the commit left them."""
        for buffer, (complete, latest) in self._reported.items():
            if complete:
                self._latest[buffer] = latest
            elif buffer in self._latest:  # what it kept, and the round's new data
                self._latest[buffer] = later(self._latest[buffer], latest)
        self.begin_round()
        self.values = {buffer: self._files(buffer) for buffer in self.coders}

    def for_stage(self, stage, builder) -> dict:
        """What ``stage``'s tasks load this round; the first stage to read a side input in a
        round has the tasks keep what its writers emitted (one Spark job for all it reads)."""
        buffers = dict.fromkeys(si.buffer for si in stage.side_inputs)
        unread = [b for b in buffers if b not in builder.side_inputs_read]
        if self._round is None:
            self._round = self.horizons(builder.marks)
        self._keep(stage, builder, unread)
        builder.side_inputs_read.update(unread)
        return {si.buffer: self._with_horizon(si.buffer) for si in stage.side_inputs}

    def horizons(self, marks: watermarks.RoundWatermarks) -> dict[str, int | None]:
        """Per side input, the end (micros) by which its windows expired (None: nothing yet):
        its readers' lowest input watermark minus its retention; it never goes back, nor moves
        at +inf (a drain, or the end: nothing is gained)."""
        out: dict[str, int | None] = {}
        for buffer, readers in self.readers.items():
            low = min(marks.stage_input.get(s, watermarks.MIN) for s in readers)
            if watermarks.MIN < low < watermarks.MAX:
                now = low - self.retention[buffer]
                self._horizons[buffer] = max(self._horizons.get(buffer, now), now)
            out[buffer] = self._horizons.get(buffer)
        return out

    def _with_horizon(self, buffer: str) -> SideInputFiles:
        horizon = self._round.get(buffer) if self._round is not None else None
        return dataclasses.replace(self.values[buffer], horizon=horizon)

    def _keep(self, stage, builder, buffers: list[str]) -> None:
        jobs = [job for b in buffers if (job := self._keeping(builder, b)) is not None]
        if not jobs:
            return
        records = run_guarded(stage.id, self.ctx.plane.union(jobs).collect)
        held = [r for r in records if isinstance(r, SideInputHeld)]
        records = [r for r in records if not isinstance(r, SideInputHeld)]
        for report in held:
            complete, latest = self._reported.get(report.buffer, (report.complete, None))
            self._reported[report.buffer] = (complete, later(latest, report.latest))
        for rec in records:
            buffer = rec.stage[len(COMMIT_PREFIX) :]
            self._staged[buffer].extend(rec.message.files)
            self._rows[buffer] += sum(f.records for f in rec.message.files)
        self.records.extend(records)
        for buffer in buffers:
            seen = state_layout.side_data_marker(buffer)
            if (self._rows[buffer] or self.values[buffer]) and seen not in self.state.completed():
                self.state.mark_completed(seen)  # ready from now on, whatever expires
            self.values[buffer] = self._files(buffer)

    def _keeping(self, builder, buffer: str):
        """The dataset of the tasks that keep ``buffer``'s new data; with none, of the tasks
        that drop what expired, if something it holds may have (None: neither)."""
        plane, spec = self.ctx.plane, builder.state_round()
        new = builder.source(buffer, None)
        keeping = Keeping(
            buffer, self._with_horizon(buffer), self.ctx.plan_key, self.ctx.components,
            self.coders[buffer],
        )  # fmt: skip
        if new is None:
            if not self._expired(buffer):
                return None
            drop = functools.partial(dropping_expired, spec, keeping)
            return plane.as_subtasks(None, spec.parallelism).mapPartitionsWithIndex(drop)
        if buffer not in self.triggered:
            keep = functools.partial(keeping_side_input, spec, keeping, report=True)
            return plane.as_subtasks(new, spec.parallelism).mapPartitionsWithIndex(keep)
        key = functools.partial(window_keyed, keeping.plan_key, keeping.components, keeping.coder)
        keep = functools.partial(keeping_view_reporting, spec, keeping)
        shuffled = new.mapPartitions(key).partitionBy(spec.parallelism, builder.partitioner)
        return shuffled.mapPartitionsWithIndex(keep)

    def _expired(self, buffer: str) -> bool:
        """The store holds some of ``buffer`` that may have expired by the round's horizon:
        the latest end it keeps is by it, or not known (after a restore)."""
        horizon = self._round.get(buffer) if self._round is not None else None
        if horizon is None or not self.values[buffer].rows:
            return False
        latest = self._latest.get(buffer)  # absent: not known
        return latest is None or latest <= horizon

    def _files(self, buffer: str) -> SideInputFiles:
        view = buffer in self.triggered
        ns = state_layout.side_view(buffer) if view else state_layout.side_rows(buffer)
        committed = self.state.task_owned_state(ns)
        rows = (committed.entries if committed is not None else 0) + self._rows.get(buffer, 0)
        parts = files_of(committed, self._staged.get(buffer, ()), self.state.max_key_groups)
        seen = state_layout.side_data_marker(buffer) in self.state.completed()
        return SideInputFiles(self.ctx.url, self.pipeline_id, ns, parts, rows, view, seen=seen)


def _retention(plan, stages) -> dict[str, int]:
    """buffer -> how long (micros) past a window's end its data may still be read: the largest
    allowed lateness of the side input and of its readers' main inputs (a late main element
    reads its window's side input, as on Beam's own runners)."""
    out: dict[str, int] = {}
    if not any(stage.side_inputs for stage in stages):
        return out
    components = beam_runner_api_pb2.Components.FromString(plan.components)
    for stage in stages:
        if not stage.side_inputs:
            continue
        descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(stage.descriptor)
        for si in stage.side_inputs:
            own = _lateness(components, plan.edge(si.buffer).pcollection)
            transform = descriptor.transforms[si.transform]  # its main inputs' lateness too
            side_tags: set[str] = set()
            if transform.spec.urn == common_urns.primitives.PAR_DO.urn:
                payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
                side_tags = set(payload.side_inputs)
            mains = [pc for tag, pc in transform.inputs.items() if tag not in side_tags]
            out[si.buffer] = max(
                out.get(si.buffer, 0), own, *(_lateness(descriptor, pc) for pc in mains)
            )
    return out


def _lateness(components, pcollection_id: str) -> int:
    """The allowed lateness (micros) of a PCollection's windowing strategy."""
    pcollection = components.pcollections[pcollection_id]
    strategy = components.windowing_strategies[pcollection.windowing_strategy_id]
    return max(0, strategy.allowed_lateness) * 1000

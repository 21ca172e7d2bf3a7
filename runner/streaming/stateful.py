"""Streaming stateful DoFns: user state and timers survive rounds in the checkpoint store.

A stateful stage's input is partitioned by the key group of each element's encoded key, so
task ``p`` sees exactly subtask ``p``'s keys. It restores their state cells (through the state
servicer) and timers from the previous checkpoint, fires the event-time timers the watermark
passed and the processing-time timers the clock passed, stages what changed, and reports its
earliest timer hold and next processing-time timer, so the driver knows when a round is due.
Per user key (its encoded bytes, so the entry's key group is the input's) ``user-state/<stage>``
holds its Fn API state cells and ``user-timers/<stage>`` its timers, in ``state_layout``'s
formats.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2
from apache_beam.runners import pipeline_context
from apache_beam.utils import timestamp

from sparkbeam.checkpoint import state_layout
from sparkbeam.runner.rounds.carry import carrying_pairs
from sparkbeam.runner.rounds.task_body import TaskBody
from sparkbeam.runner.task import clock
from sparkbeam.runner.task.grouping import partition_for_key, split_elements
from sparkbeam.runner.task.records import CommitRecord, KeyedStateReport, ReportKey
from sparkbeam.runner.task.staged_state import StateRound
from sparkbeam.runner.task.task_range import TaskRange, finish, staged_writer_for_task
from sparkbeam.runner.task.user_state import user_key
from sparkbeam.runner.task.worker_context import register_plan

_PROCESSING = beam_runner_api_pb2.TimeDomain.PROCESSING_TIME
_NO_TIME = state_layout.NO_TIME
_MAX_HOLD = timestamp.MAX_TIMESTAMP.micros


@dataclass(frozen=True, kw_only=True)
class StatefulRound(StateRound):
    """What the driver ships to every task of one stateful stage in one round."""

    input_watermark: int  # micros
    clock_micros: int | None = None  # a TestStream's virtual processing time; None: wall clock


class KeyedState:
    """One task's user state and timers: loaded as its keys are touched, staged after.

    A round costs what its keys touch, not what the stage stores: a key's cells are restored
    when the SDK first asks for them, its timers decoded when one is due (by its stored
    summary) or the stage sets or clears one; only those keys are staged. The others'
    summaries give the task's timer count, hold and next processing-time timer."""

    def __init__(
        self,
        spec: StatefulRound,
        stage_id: str,
        key_impl,
        subtask: int,
        state_in: Mapping[bytes, bytes] | None = None,
        timers_in: Mapping[bytes, bytes] | None = None,
    ) -> None:
        """Read ``subtask``'s state and timers (or take ``state_in`` and ``timers_in``, read)."""
        self.spec = spec
        self.stage_id = stage_id
        self.key_impl = key_impl  # timers carry the decoded key: encoded as state requests do
        self.subtask = subtask
        self.state_range = TaskRange(spec, subtask, state_layout.user_state(stage_id), state_in)
        self.timer_range = TaskRange(spec, subtask, state_layout.user_timers(stage_id), timers_in)
        self.state_ns, self.timer_ns = self.state_range.namespace, self.timer_range.namespace
        self.state_in, self.timers_in = self.state_range.stored, self.timer_range.stored
        self.watermark = timestamp.Timestamp(micros=spec.input_watermark)
        self.now = timestamp.Timestamp.of(clock.now_seconds(spec.clock_micros))
        self.waiting: dict[bytes, state_layout.TimerSummary] = {}  # stored, not decoded
        self.timers_loaded: set[bytes] = set()

    def load(self, servicer, timers) -> None:
        """Hand the stored cells to the state servicer (restored as asked for); put the timers
        of the keys with a due timer into the task's, the rest when their key sets one."""
        state_ns = self.state_ns
        servicer.restore_lazily(
            self.state_in, lambda blob: state_layout.decode_user_state(blob, state_ns)
        )
        event_due, processing_due = self.watermark.micros, self.now.micros
        summary_of = state_layout.user_timers_summary
        for key, blob in self.timers_in.items():
            summary = summary_of(blob, self.timer_ns)
            if summary.event_fire <= event_due or summary.processing_fire <= processing_due:
                self._load_timers(key, timers)
            else:
                self.waiting[key] = summary

        def before_change(user_key) -> None:
            key = self.key_impl.encode_nested(user_key)
            if key in self.waiting:
                del self.waiting[key]
                self._load_timers(key, timers)

        timers.before_change = before_change

    def _load_timers(self, key: bytes, timers) -> None:
        self.timers_loaded.add(key)
        for transform, family, data in state_layout.decode_user_timers(
            self.timers_in[key], self.timer_ns
        ):
            timers.add((transform, family), [data])

    def pop_due(self, timers) -> dict | None:
        """The timers due at the earliest due firing time, encoded; None when none is due."""
        due = {
            k: t
            for k, t in timers.pending.items()
            if t.fire_timestamp
            <= (self.now if timers.domains[k[0]] == _PROCESSING else self.watermark)
        }
        return timers.pop_earliest(due) if due else None

    def finish(self, servicer, timers) -> Iterator:
        """Stage what changed of the keys this task touched; yield the commit and the report."""
        touched: dict[bytes, dict] = {key: {} for key in servicer.restored}
        for cell in servicer.touched:  # every cell restored or written is noted there
            data = servicer.read_cell(cell)
            cells = touched.setdefault(user_key(cell), {})
            if data:
                cells[cell] = data
        state_out = {k: state_layout.encode_user_state(c) for k, c in touched.items() if c}
        timers_out, (count, hold, next_micros) = self._pending_timers(timers)
        spec = self.spec
        writer = staged_writer_for_task(spec, self.stage_id)
        self._change(self.state_range, state_out, touched.keys())
        self._change(self.timer_range, timers_out, self.timers_loaded | timers_out.keys())
        with_state = self.state_range.held()
        keys = self._keys_held(with_state)  # before `finish` applies the changes to the reads
        self.state_range.stage(writer, with_state)  # both in one writer: one commit message
        self.timer_range.stage(writer)
        yield CommitRecord(self.stage_id, finish(writer, self.state_range, self.timer_range))
        next_ms = None if next_micros == _NO_TIME else next_micros / 1000.0
        yield KeyedStateReport(self.stage_id, self.subtask, keys, count, hold, next_ms)

    def _change(self, task_range: TaskRange, after: dict[bytes, bytes], changed) -> None:
        """Put or delete each ``changed`` key whose value differs from the one stored."""
        for key in changed:
            if (blob := after.get(key)) is not None:
                self._check_owned(key)
            task_range.update(key, task_range.stored.get(key), blob)

    def _keys_held(self, with_state: int) -> int:
        """Keys with state or timers after the round: those with state (counted) and those
        with timers only. Reads the timer keys, not the range's state (it may be on disk)."""
        state_changes, timer_changes = self.state_range.changes, self.timer_range.changes

        def has_state(key: bytes) -> bool:
            if key in state_changes:
                return state_changes[key] is not None
            return key in self.state_in

        timer_keys = itertools.chain(
            (k for k in self.timers_in if timer_changes.get(k, b"") is not None),
            (k for k, v in timer_changes.items() if v is not None and k not in self.timers_in),
        )
        return with_state + sum(1 for key in timer_keys if not has_state(key))

    def _pending_timers(self, timers) -> tuple[dict[bytes, bytes], tuple[int, int, int]]:
        """The loaded keys' timers as stored values; (count, hold, next processing-time
        firing) over all the task's timers, the waiting ones by their summaries."""
        by_key: dict[bytes, list] = {}
        for (family_key, *_), timer in timers.pending.items():
            key = self.key_impl.encode_nested(timer.user_key)
            by_key.setdefault(key, []).append((family_key, timer))
        out = {}
        count = sum(s.timers for s in self.waiting.values())
        hold = min((s.hold for s in self.waiting.values()), default=_MAX_HOLD)
        next_fire = min((s.processing_fire for s in self.waiting.values()), default=_NO_TIME)
        for key, pending in by_key.items():
            event_fire = key_hold = processing_fire = _NO_TIME
            encoded = []
            for family_key, timer in pending:
                encoded.append((*family_key, timers.coders[family_key].encode(timer)))
                if timers.domains[family_key] == _PROCESSING:
                    processing_fire = min(processing_fire, timer.fire_timestamp.micros)
                else:
                    event_fire = min(event_fire, timer.fire_timestamp.micros)
                    key_hold = min(key_hold, timer.hold_timestamp.micros)
            summary = state_layout.TimerSummary(len(pending), event_fire, key_hold, processing_fire)
            out[key] = state_layout.encode_user_timers(encoded, summary)
            count += len(pending)
            hold = min(hold, key_hold)
            next_fire = min(next_fire, processing_fire)
        return out, (count, min(hold, _MAX_HOLD), next_fire)

    def _check_owned(self, key: bytes) -> None:
        owner = partition_for_key(key, self.spec.parallelism, self.spec.max_key_groups)
        if owner != self.subtask:
            raise RuntimeError(
                f"State of key {key!r} of stage {self.stage_id} belongs to subtask {owner}, but "
                f"subtask {self.subtask} wrote it: the key's encoding for partitioning and for "
                "state differ. This is a sparkbeam bug; please report it with the key's coder."
            )


_KEY_ENCODERS: dict = {}


def run_stateful(body: TaskBody, spec: StatefulRound, index: int, pairs):
    """A stateful stage's task: its user state and timers as of the round's checkpoint."""
    stage = body.task.stage
    key_impl = _encoders(body.task.plan_key, stage, stage.inputs[0][0])[1]
    return body((row for _, row in pairs), keyed_state=KeyedState(spec, stage.id, key_impl, index))


def keyed_rows(components, plan_key: str, stage, transform: str, index: int, items):
    """(key bytes as the SDK encodes them for state and timers, (transform, element)) per
    element; carried reports pass as pairs. The key goes through the stage's own descriptor
    coders: a runner wire coder may stand in for a key coder the runner does not know."""
    register_plan(plan_key, components.value)

    def keyed(blobs):
        wire, key_impl = _encoders(plan_key, stage, transform)
        for blob in blobs:
            for windowed, encoded in split_elements(blob, wire):
                yield key_impl.encode_nested(windowed.value[0]), (transform, encoded)

    return carrying_pairs(items, ReportKey(index), keyed)


def _encoders(plan_key: str, stage, transform: str):
    """(wire coder impl of ``transform``'s input, the stateful ParDo's key coder impl)."""
    cache_key = (plan_key, stage.id, transform)
    if cache_key in _KEY_ENCODERS:
        return _KEY_ENCODERS[cache_key]
    descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(stage.descriptor)
    context = pipeline_context.PipelineContext(
        beam_runner_api_pb2.Components(
            coders=descriptor.coders,
            windowing_strategies=descriptor.windowing_strategies,
            environments=descriptor.environments,
        )
    )
    port = beam_fn_api_pb2.RemoteGrpcPort.FromString(descriptor.transforms[transform].spec.payload)
    wire = context.coders[port.coder_id].get_impl()
    for proto in descriptor.transforms.values():
        if proto.spec.urn != common_urns.primitives.PAR_DO.urn:
            continue
        payload = beam_runner_api_pb2.ParDoPayload.FromString(proto.spec.payload)
        if payload.state_specs or payload.timer_family_specs:
            main = next(pc for tag, pc in proto.inputs.items() if tag not in payload.side_inputs)
            kv = context.coders[descriptor.pcollections[main].coder_id]
            _KEY_ENCODERS[cache_key] = wire, kv.key_coder().get_impl()
            return _KEY_ENCODERS[cache_key]
    raise RuntimeError(f"Stage {stage.id} has no stateful ParDo (data input {transform!r})")

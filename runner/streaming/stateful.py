"""Streaming stateful DoFns: user state and timers survive rounds in the checkpoint store.

A stateful stage's input is partitioned by the key group of each element's
encoded key, so task ``p`` of a round sees exactly the keys of subtask ``p``.
Before its input it loads their user state (bag, multimap and ordered-list
state cells of the Fn API, put back through the state servicer's append requests) and their
pending timers from the previous round's checkpoint; it fires the event-time
timers the round's watermark passed and the processing-time timers the clock
passed; after, it stages what changed for the round's checkpoint and reports
its earliest timer hold (the stage's output watermark hold) and next
processing-time timer, so the driver knows when a round is due.

Store layout, one entry per user key (its encoded bytes, so the key group of
the entry is the key group the input was partitioned by): namespace
``user-state/<stage>`` holds the key's state cells (Fn API state keys and their raw
bytes), ``user-timers/<stage>`` its timers encoded with their family's timer coder,
both in the explicit formats of ``sparkbeam.checkpoint.state_layout``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from apache_beam.coders.coder_impl import create_OutputStream
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2
from apache_beam.utils import timestamp

from sparkbeam.checkpoint import state_layout
from sparkbeam.runner.task import clock
from sparkbeam.runner.task.grouping import partition_for_key
from sparkbeam.runner.task.records import CommitRecord, KeyedStateReport
from sparkbeam.runner.task.staged_state import read_task_state, staged_writer_for_task
from sparkbeam.runner.task.user_state import user_key

_PROCESSING = beam_runner_api_pb2.TimeDomain.PROCESSING_TIME


@dataclass(frozen=True)
class StatefulRound:
    """What the driver ships to every task of one stateful stage in one round."""

    pipeline: str
    url: str
    checkpoint_id: int | None
    round_no: int
    parallelism: int
    max_key_groups: int
    input_watermark: int  # micros
    clock_micros: int | None = None  # a TestStream's virtual processing time; None: wall clock


class KeyedState:
    """One task's user state and timers: loaded before its input, staged after."""

    def __init__(self, spec: StatefulRound, plan_key: str, stage, subtask: int) -> None:
        self.spec = spec
        stage_id = self.stage_id = stage.id
        # Timers carry the decoded key: encode it as the SDK's state requests do.
        self.key_impl = _encoders(plan_key, stage, stage.inputs[0][0])[1]
        self.subtask = subtask
        self.state_ns = state_layout.user_state(stage_id)
        self.timer_ns = state_layout.user_timers(stage_id)
        self.state_in: dict[bytes, bytes] = {}
        self.timers_in: dict[bytes, bytes] = {}
        if spec.checkpoint_id is not None:
            args = (spec.url, spec.pipeline, spec.checkpoint_id, subtask, spec.parallelism)
            self.state_in = read_task_state(*args, self.state_ns)
            self.timers_in = read_task_state(*args, self.timer_ns)
        self.watermark = timestamp.Timestamp(micros=spec.input_watermark)
        self.now = timestamp.Timestamp.of(clock.now_seconds(spec.clock_micros))

    def load(self, servicer, timers) -> None:
        """Put the stored cells into the state servicer and the timers into the task's."""
        for blob in self.state_in.values():
            servicer.restore_cells(state_layout.decode_user_state(blob, self.state_ns))
        for blob in self.timers_in.values():
            for transform, family, data in state_layout.decode_user_timers(blob, self.timer_ns):
                timers.add((transform, family), [data])

    def pop_due(self, timers) -> dict | None:
        """The timers due at the earliest due firing time, encoded; None when none is due."""
        due = {
            k: t
            for k, t in timers.pending.items()
            if t.fire_timestamp
            <= (self.now if timers.domains[k[0]] == _PROCESSING else self.watermark)
        }
        if not due:
            return None
        earliest = min(t.fire_timestamp for t in due.values())
        fired: dict = {}
        for key in [k for k, t in due.items() if t.fire_timestamp == earliest]:
            timer = timers.pending.pop(key)
            fired.setdefault(key[0], create_OutputStream())
            timers.coders[key[0]].encode_to_stream(timer, fired[key[0]], True)
        return {k: [out.get()] for k, out in fired.items()}

    def finish(self, servicer, timers) -> Iterator:
        """Stage the changed entries; yield the commit message and the report."""
        cells: dict[bytes, dict] = {}
        for cell in servicer.touched:  # every cell restored or written is noted there
            data = servicer.read_cell(cell)
            if data:
                cells.setdefault(user_key(cell), {})[cell] = data
        pending: dict[bytes, list] = {}
        hold, next_ms, count = timestamp.MAX_TIMESTAMP.micros, None, 0
        for (family_key, *_), timer in timers.pending.items():
            coder = timers.coders[family_key]
            key = self.key_impl.encode_nested(timer.user_key)
            pending.setdefault(key, []).append((*family_key, coder.encode(timer)))
            count += 1
            if timers.domains[family_key] == _PROCESSING:
                ms = timer.fire_timestamp.micros / 1000.0
                next_ms = ms if next_ms is None else min(next_ms, ms)
            else:
                hold = min(hold, timer.hold_timestamp.micros)
        spec = self.spec
        writer = staged_writer_for_task(
            spec.url, spec.pipeline, self.stage_id, spec.round_no, spec.max_key_groups
        )
        state_out = {k: state_layout.encode_user_state(c) for k, c in cells.items()}
        timers_out = {k: state_layout.encode_user_timers(v) for k, v in pending.items()}
        for ns, before, after in (
            (self.state_ns, self.state_in, state_out),
            (self.timer_ns, self.timers_in, timers_out),
        ):
            for key, blob in after.items():
                self._check_owned(key)
                if before.get(key) != blob:
                    writer.put(ns, key, blob)
            for key in before.keys() - after.keys():
                writer.delete(ns, key)
        yield CommitRecord(self.stage_id, writer.finish())
        keys = len({*state_out, *timers_out})
        yield KeyedStateReport(self.stage_id, self.subtask, keys, count, hold, next_ms)

    def _check_owned(self, key: bytes) -> None:
        owner = partition_for_key(key, self.spec.parallelism, self.spec.max_key_groups)
        if owner != self.subtask:
            raise RuntimeError(
                f"State of key {key!r} of stage {self.stage_id} belongs to subtask {owner}, but "
                f"subtask {self.subtask} wrote it: the key's encoding for partitioning and for "
                "state differ. This is a sparkbeam bug; please report it with the key's coder."
            )


_KEY_ENCODERS: dict = {}


def sdk_keyed(plan_key: str, stage, transform: str, blobs) -> Iterator[tuple[bytes, bytes]]:
    """(key bytes exactly as the SDK encodes them for state and timers, element) per element.

    The runner's wire coders may stand in for a key coder the runner does not know (a
    length-prefixed pickled key arrives as bytes), so the key is taken through the stage's
    own descriptor coders: the data input's coder decodes the element as the SDK does, and
    the stateful ParDo's key coder encodes the key as its state requests will.
    """
    from sparkbeam.runner.task.grouping import split_elements

    wire, key_impl = _encoders(plan_key, stage, transform)
    for blob in blobs:
        for windowed, encoded in split_elements(blob, wire):
            yield key_impl.encode_nested(windowed.value[0]), encoded


def _encoders(plan_key: str, stage, transform: str):
    """(wire coder impl of ``transform``'s input, the stateful ParDo's key coder impl)."""
    cache_key = (plan_key, stage.id, transform)
    if cache_key not in _KEY_ENCODERS:
        _KEY_ENCODERS[cache_key] = _key_encoder(stage, transform)
    return _KEY_ENCODERS[cache_key]


def _key_encoder(stage, transform: str):
    from apache_beam.portability import common_urns
    from apache_beam.portability.api import beam_runner_api_pb2 as runner_api
    from apache_beam.runners import pipeline_context

    descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(stage.descriptor)
    context = pipeline_context.PipelineContext(
        runner_api.Components(
            coders=descriptor.coders,
            windowing_strategies=descriptor.windowing_strategies,
            environments=descriptor.environments,
        )
    )
    port = beam_fn_api_pb2.RemoteGrpcPort.FromString(descriptor.transforms[transform].spec.payload)
    wire = context.coders[port.coder_id].get_impl()
    pardo = common_urns.primitives.PAR_DO.urn
    for proto in descriptor.transforms.values():
        if proto.spec.urn != pardo:
            continue
        payload = runner_api.ParDoPayload.FromString(proto.spec.payload)
        if payload.state_specs or payload.timer_family_specs:
            main = next(pc for tag, pc in proto.inputs.items() if tag not in payload.side_inputs)
            kv = context.coders[descriptor.pcollections[main].coder_id]
            return wire, kv.key_coder().get_impl()
    raise RuntimeError(f"Stage {stage.id} has no stateful ParDo (data input {transform!r})")

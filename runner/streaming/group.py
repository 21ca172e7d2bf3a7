"""Streaming GroupByKey: Beam's trigger driver over state kept in the checkpoint store.

A streaming GroupByKey sees its input a round at a time, so per key the trigger driver's state
(encoded elements, trigger and pane bookkeeping, holds, timers) is one entry of namespace
``gbk/<buffer>``, keyed by the encoded key, in ``state_layout``'s format (never pickled). Each
round task ``p`` reads its key groups' entries as of the previous checkpoint, runs the new
elements (input watermark: the previous round's), fires the timers the watermark or the clock
passed, drops windows past their allowed lateness, and stages what changed. Key groups, not
partitions, own state, so another ``--parallelism`` on restore only assigns them differently.
The default trigger's common case is ``on_time_panes``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from apache_beam.coders.coder_impl import create_OutputStream
from apache_beam.runners.direct.clock import RealClock
from apache_beam.transforms import trigger
from apache_beam.utils import timestamp, windowed_value
from apache_beam.utils.windowed_value import WindowedValue

from sparkbeam.checkpoint import state_layout
from sparkbeam.runner.streaming.on_time_panes import OnTimePanes
from sparkbeam.runner.streaming.trigger_codec import trigger_state_codec
from sparkbeam.runner.task import clock
from sparkbeam.runner.task.records import CommitRecord, GroupReport, OutputRecord, is_report_key
from sparkbeam.runner.task.staged_state import StateRound
from sparkbeam.runner.task.task_range import TaskRange, finish, staged_writer_for_task
from sparkbeam.runner.task.worker_context import plan_context, register_plan
from sparkbeam.translation.plan import Edge

MAX_MICROS = timestamp.MAX_TIMESTAMP.micros


def commit_stage(buffer: str) -> str:
    """The name a GroupByKey's tasks commit under (the store's (stage, round, partition))."""
    return "gbk:" + buffer


@dataclass(frozen=True, kw_only=True)
class GroupRound(StateRound):
    """What the driver ships to every task of one streaming GroupByKey in one round."""

    plan_key: str
    edge: Edge
    input_watermark: int  # micros: fire event-time timers up to here
    previous_watermark: int  # micros: the watermark new elements are judged late against
    clock_micros: int | None = None  # a TestStream's virtual processing time; None: wall clock


def group_round(
    task: GroupRound, components: bytes, partition: int, pairs: Iterable[tuple[bytes, bytes]]
) -> Iterator[Any]:
    """The body of one GroupByKey task in one round; yields output chunks and reports."""
    register_plan(task.plan_key, components)
    incoming: dict[bytes, list] = {}
    carried: list = []  # reports of upstream tasks, travelling with the data (streaming_round)
    for key, element in pairs:
        if is_report_key(key):
            carried.append(element)
        else:
            incoming.setdefault(key, []).append(element)
    group = _KeysOfOneTask(task, partition)
    stored = group.range.stored
    due = group.keep_idle(stored, incoming)
    for key in sorted(incoming.keys() | due):
        group.step(key, stored.get(key), incoming.get(key, ()))
    yield from group.finish()
    yield from carried


class _KeysOfOneTask:
    """One task's keys of one GroupByKey in one round: read, step each key, stage, report."""

    def __init__(self, task: GroupRound, partition: int) -> None:
        context = plan_context(task.plan_key)
        edge = self.edge = task.edge
        self.task, self.partition = task, partition
        windowing = context.windowing_strategies[edge.windowing_strategy]
        write = context.coders[edge.write_coder]
        kv = write.wrapped_value_coder
        self.key_impl, self.value_impl = kv.key_coder().get_impl(), kv.value_coder().get_impl()
        self.write_impl = write.get_impl()
        self.read_impl = context.coders[edge.read_coder].get_impl()
        self.panes = (
            OnTimePanes(windowing)
            if OnTimePanes.applies(windowing)
            else TriggerPanes(windowing, clock.trigger_clock(task.clock_micros))
        )
        self.writer = staged_writer_for_task(task, commit_stage(edge.id))
        self.watermark = timestamp.Timestamp(micros=task.input_watermark)
        self.previous = timestamp.Timestamp(micros=task.previous_watermark)
        self.now = clock.now_seconds(task.clock_micros)
        self.watermark_micros, self.now_ms = task.input_watermark, self.now * 1000.0
        self.out = create_OutputStream()
        # As of the previous round's checkpoint:
        self.range = TaskRange(task, partition, state_layout.gbk(edge.id))
        self.hold, self.keys = MAX_MICROS, 0
        self.next_ms: float | None = None  # the earliest processing-time timer, ms

    def keep_idle(self, stored: Mapping[bytes, bytes], incoming: dict) -> set[bytes]:
        """Keys without new elements: those nothing is due for are kept as they are (their
        state is not even decoded: only its header is read); the others are returned."""
        due: set[bytes] = set()
        watermark, now_ms = self.watermark_micros, self.now_ms
        unpack = state_layout.GROUP_HEADER.unpack_from  # values were checked as they were read
        kept, hold, earliest = 0, MAX_MICROS, math.inf
        for key, blob in stored.items():
            if key in incoming:
                continue
            _, _, wake, real_ms, key_hold = unpack(blob)
            if wake > watermark and real_ms > now_ms:
                kept += 1
                if key_hold < hold:
                    hold = key_hold
                if real_ms < earliest:
                    earliest = real_ms
            else:
                due.add(key)
        self._keep(kept, hold, earliest)
        return due

    def step(self, key: bytes, blob: bytes | None, chunks: Iterable[bytes]) -> None:
        """Run one key's trigger driver over its new elements and due timers; stage its state."""
        encode_value, write = self.value_impl.encode, self.write_impl
        elements = [
            wv.with_value(encode_value(wv.value[1]))
            for chunk in chunks
            for wv in write.decode_all(chunk)
        ]
        fired, new = self.panes.step(blob, elements, self.previous, self.watermark, self.now)
        if fired:
            user_key = self.key_impl.decode(key)
            for wv in fired:
                values = [self.value_impl.decode(v) for v in wv.value]
                self.read_impl.encode_to_stream(
                    WindowedValue((user_key, values), wv.timestamp, wv.windows, wv.pane_info),
                    self.out,
                    True,
                )
        self.range.update(key, blob, new)
        if new is None:
            return
        _, real_ms, key_hold = state_layout.read_group_header(new)
        self._keep(1, key_hold, real_ms)

    def _keep(self, keys: int, hold: int, real_ms: float) -> None:
        """Keys that keep state: count them, and their hold and processing-time timer."""
        self.keys += keys
        self.hold = min(self.hold, hold)
        if real_ms != math.inf:
            self.next_ms = real_ms if self.next_ms is None else min(self.next_ms, real_ms)

    def finish(self) -> Iterator[Any]:
        """The round's output chunk, the staged state's commit message, the group's report."""
        edge_id = self.edge.id
        data = self.out.get()
        if data:
            yield OutputRecord(edge_id, data)
        self.range.stage(self.writer, self.keys)
        staged = finish(self.writer, self.range)  # what it staged is the next round's read
        yield CommitRecord(commit_stage(edge_id), staged)
        yield GroupReport(edge_id, self.partition, self.keys, self.hold, self.next_ms)


class TriggerPanes:
    """Any windowing: Beam's ``GeneralTriggerDriver`` over the key's stored trigger state."""

    def __init__(self, windowing, trigger_clock=None) -> None:
        self.codec = trigger_state_codec(windowing)
        self.driver = trigger.GeneralTriggerDriver(windowing, trigger_clock or RealClock())
        self.lateness = windowing.allowed_lateness
        self.accumulating = windowing.accumulation_mode == trigger.AccumulationMode.ACCUMULATING

    def step(self, blob, elements, previous, watermark, now: float):
        """(fired panes, the key's new state bytes or None) after one round."""
        state = load_state(blob, self.codec)
        fired: list = []
        if elements:
            fired.extend(self.driver.process_elements(state, elements, previous, previous))
        fired.extend(_fire_timers(self.driver, state, watermark, now))
        fired.extend(_close_expired(state, watermark, self.lateness, self.accumulating))
        return fired, dump_state(state, self.lateness, self.codec)


def _fire_timers(driver, state, watermark, now: float) -> list:
    """Fire every timer the watermark or the clock passed, including ones set while firing."""
    fired: list = []
    while True:
        expired, _ = state.get_timers(clear=True, watermark=watermark, processing_time=now)
        if not expired:
            return fired
        for window, (name, domain, ts, _tag) in expired:
            fired.extend(driver.process_timer(window, name, domain, ts, state, watermark))


def _close_expired(state, watermark, allowed_lateness, accumulating: bool) -> list:
    """Forget the windows the watermark passed by more than the allowed lateness; a last pane
    for each that still holds elements no pane has carried, which Beam's Python driver forgets
    (e.g. ``Repeatedly(AfterProcessingTime(...))`` when the input ends) and the Beam model fires.
    Accumulating windows that already fired keep what earlier panes carried: no pane."""
    tag = trigger.MergeableStateAdapter.WINDOW_IDS.tag
    window_ids = state.global_state.get(tag)
    if not window_ids:
        return []
    adapter = trigger.MergeableStateAdapter(state)
    driver = trigger.GeneralTriggerDriver
    panes = []
    for window in list(window_ids):
        if watermark <= window.max_timestamp() + allowed_lateness:
            continue
        values = adapter.get_state(window, driver.ELEMENTS)
        index = adapter.get_state(window, driver.INDEX)
        closing = values and not (accumulating and index)
        if closing and not adapter.get_state(window, driver.TOMBSTONE):
            nonspeculative = adapter.get_state(window, driver.NONSPECULATIVE_INDEX)
            timing = (
                windowed_value.PaneInfoTiming.ON_TIME
                if nonspeculative == 0
                else windowed_value.PaneInfoTiming.LATE
            )
            pane = windowed_value.PaneInfo(index == 0, True, timing, index, nonspeculative)
            panes.append(WindowedValue(values, window.max_timestamp(), (window,), pane))
        for wid in window_ids.pop(window):
            state.state.pop(wid, None)
            state.timers.pop(wid, None)
    if not window_ids:
        state.global_state.pop(tag, None)
    return panes


def dump_state(state, allowed_lateness, codec=None) -> bytes | None:
    """The bytes of one key's trigger state, or None when nothing is left to keep. Its header
    says when the key next needs a round (an event-time timer, a window to forget, a
    processing-time timer) and its watermark hold, so idle keys are skipped undecoded."""
    windows = state.global_state.get(trigger.MergeableStateAdapter.WINDOW_IDS.tag) or {}
    if not state.state and not state.timers and not windows:
        return None
    plain = (
        {w: dict(tags) for w, tags in state.state.items()},
        {w: dict(t) for w, t in state.timers.items()},
        dict(state.global_state),
    )
    wakes = [(w.max_timestamp() + allowed_lateness).micros + 1 for w in windows]
    real_ms: list[float] = []
    for timers in state.timers.values():
        for (_, domain, _), ts in timers.items():
            if domain == trigger.TimeDomain.REAL_TIME:
                real_ms.append(float(ts) * 1000.0)
            else:
                wakes.append(ts.micros)
    return state_layout.encode_group(
        state_layout.GROUP_TRIGGER,
        min(wakes, default=MAX_MICROS),
        min(real_ms, default=math.inf),
        state.get_earliest_hold().micros,
        (codec or trigger_state_codec(None)).encode(plain),
    )


def load_state(blob: bytes | None, codec=None):
    state = trigger.InMemoryUnmergedState()
    if blob is None:
        return state
    tags, timers, global_state = (codec or trigger_state_codec(None)).decode(
        state_layout.decode_group(blob)[1]
    )
    for window, values in tags.items():
        state.state[window].update(values)
    for window, values in timers.items():
        state.timers[window].update(values)
    state.global_state.update(global_state)
    return state

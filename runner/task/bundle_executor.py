"""Runs one executable stage inside a Spark task: the per-task loop over bundles.

Cuts the partition into bundles (an ordinary stage's pulls rows until it has flushed output
or read ``STREAMED_BUNDLE_BYTES``; an SDF stage's are cut at ``BUNDLE_BYTES``, whole for its
splitter), feeds side inputs, collects outputs and metrics, fires timers (batch: after all
input, in timestamp order) and re-feeds residuals due within the task's budget. What splits
(``bundle_splits``) leave are zero-delay residuals, kept with the others: in the task's own
state with a store (``residual_state``), on the driver without one. The stage's SDK worker
is ``stage_worker``'s.
"""

from __future__ import annotations

import itertools
import logging
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from apache_beam.coders.coder_impl import create_InputStream, create_OutputStream
from apache_beam.metrics import monitoring_infos
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.utils import timestamp

from sparkbeam.runner.task import clock
from sparkbeam.runner.task.bundle_splits import (
    BundleSplitter,
    SplitCounts,
    SplitPolicy,
)
from sparkbeam.runner.task.records import MetricsRecord, OutputRecord, WarningRecord
from sparkbeam.runner.task.side_input_state import load_side_inputs
from sparkbeam.runner.task.stage_worker import StageWorker, UserCodeError, worker_for
from sparkbeam.runner.task.worker_context import plan_context, register_plan
from sparkbeam.sdf.residuals import ResidualRecord
from sparkbeam.translation.plan import StagePlan

BUNDLE_BYTES = 8 << 20  # an SDF stage's bundles (its splitter reads their input whole)
STREAMED_BUNDLE_BYTES = 64 << 20  # an ordinary stage's, unless it flushes output first


@dataclass(frozen=True)
class StageTask:
    """What the driver ships to every task of one stage."""

    plan_key: str
    stage: StagePlan
    bundle_bytes: int = BUNDLE_BYTES
    # A residual due within this many seconds of the task's start is re-fed by the task
    # (sleeping); later ones leave as durable state under a timer. 0: none re-fed here.
    residual_budget_s: float = 30.0
    splits: SplitPolicy = SplitPolicy()  # SDF stages only
    # A TestStream's virtual processing time (residuals are produced "now"); None: wall clock.
    clock_micros: int | None = None


# Beam logs a user exception at ERROR where it is raised (`DoFnRunner._reraise_augmented`), then
# raises it: the driver prints it once, summarized (`runner/errors.py`). Left on, another task's
# copy of it lands on the driver's stderr after that summary, at random.
_BEAM_USER_ERROR_LOG = logging.getLogger("apache_beam.runners.common")


def run_stage_partition(
    task: StageTask,
    components: bytes,
    side_inputs: dict,
    rows: Iterable[tuple[str, bytes]],
    keyed_state=None,
) -> Iterator[tuple]:
    """The body of one Spark task: yields OutputRecords, then one MetricsRecord.
    ``keyed_state`` (``runner.streaming.stateful``) loads the task's user state and timers
    before the input and takes them back after."""
    _BEAM_USER_ERROR_LOG.setLevel(logging.CRITICAL)
    try:
        register_plan(task.plan_key, components)
        worker = worker_for(task.plan_key, task.stage)
        worker.reset_state()
        load_side_inputs(worker.state, plan_context(task.plan_key), task.stage, side_inputs)
        loop = _TaskLoop(worker, task)
        if keyed_state is not None:
            keyed_state.load(worker.state, loop.timers)
            loop.fire_due = keyed_state.pop_due
        yield from loop.run(rows)
        if keyed_state is not None:
            yield from keyed_state.finish(worker.state, loop.timers)
    except Exception as e:  # noqa: BLE001 - re-raised with the stage named
        detail = (
            str(e)
            if isinstance(e, UserCodeError)
            else f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        )
        raise UserCodeError(f"[{task.stage.id}] {detail}") from e


class _TaskLoop:
    """Bundles over the partition, then timers; residuals and metrics leave the task as records."""

    def __init__(self, worker: StageWorker, task: StageTask) -> None:
        self.worker = worker
        self.task = task
        self.metrics: list = []
        self.timers = PendingTimers.of_task(task)
        self.outputs = dict(task.stage.outputs)
        self.local: list[ResidualRecord] = []
        self.deadline_ms = time.time() * 1000.0 + task.residual_budget_s * 1000.0
        context = plan_context(task.plan_key)
        self.input_coders = {t: context.coders[c].get_impl() for t, c in task.stage.input_coders}
        self.fire_due = None  # streaming: pops the timers due this round, else None
        self.split_counts = SplitCounts()
        self.splitter = None
        if task.stage.is_sdf_process and task.splits.enabled:
            fractions = itertools.cycle(task.splits.fractions)
            self.splitter = lambda bundle_id, inputs: (
                BundleSplitter(
                    worker.worker, bundle_id, inputs, self.input_coders, task.splits, fractions
                )
                if task.splits.applies(self.input_coders, inputs)
                else None
            )

    def run(self, rows: Iterable[tuple[str, bytes]]) -> Iterator[tuple]:
        if self.splitter is not None:  # the splitter reads an SDF bundle's inputs as a whole
            for inputs in _bundles(rows, self.task.bundle_bytes):
                yield from self._bundle(inputs, {})
        else:
            rows = iter(rows)
            for first in rows:
                yield from self._bundle(self._until_output(first, rows), {})
        # Batch: all input is in, the input watermark is +inf; fire timers in order.
        # Streaming: fire only what the round's watermark and the clock passed.
        while self.timers:
            fired = self.fire_due(self.timers) if self.fire_due else self.timers.pop_next()
            if not fired:
                break
            yield from self._bundle({}, fired)
        # Residuals due within the task's budget are re-fed here, after their delay.
        while self.local:
            fire_at = min(r.produced_ms + r.delay_ms for r in self.local)
            wait = fire_at / 1000.0 - time.time()
            if wait > 0:
                time.sleep(wait)
            now_ms = time.time() * 1000.0
            due = [r for r in self.local if r.produced_ms + r.delay_ms <= now_ms]
            self.local = [r for r in self.local if r.produced_ms + r.delay_ms > now_ms]
            refeed: dict[str, list[bytes]] = {}
            for record in due:
                refeed.setdefault(record.transform, []).append(record.element)
            yield from self._bundle(refeed, {})
        infos = list(monitoring_infos.consolidate(self.metrics))
        infos += self.split_counts.monitoring_infos(self.worker.descriptor)
        yield MetricsRecord(self.task.stage.id, tuple(mi.SerializeToString() for mi in infos))

    def _until_output(self, first: tuple[str, bytes], rows: Iterator) -> Iterator[tuple]:
        """A bundle's input: rows until the bundle has flushed output (Beam flushes an output
        stream at 10 MB) or read ``STREAMED_BUNDLE_BYTES``, so a pre-combine sees a large share
        of the task's input while the output held, and what a DoFn buffers, stay bounded."""
        before = self.worker.flushed_outputs()
        size = len(first[1])
        yield first
        while self.worker.flushed_outputs() == before and size < STREAMED_BUNDLE_BYTES:
            row = next(rows, None)
            if row is None:
                return
            size += len(row[1])
            yield row

    def _bundle(self, inputs, fired) -> Iterator[tuple]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            result = self.worker.process_bundle(inputs, fired, self.splitter)
        for w in caught:
            category = f"{w.category.__module__}:{w.category.__qualname__}"
            yield WarningRecord(self.task.stage.id, category, str(w.message))
        self.metrics.extend(result.response.monitoring_infos)
        for transform, chunks in result.data.items():
            buffer = self.outputs.get(transform)
            if buffer is None:
                raise UserCodeError(f"Stage wrote to unknown output {transform!r}")
            for data in chunks:
                yield OutputRecord(buffer, data)
        for key, chunks in result.timers.items():
            self.timers.add(key, chunks)
        # A residual due within the task's budget is re-fed here; the others leave as
        # records for the StateAndTimerBundleCheckpointHandler: the task's own with a store
        # (residual_state), the driver's in memory without one.
        now_ms = clock.now_seconds(self.task.clock_micros) * 1000.0
        for residual in result.response.residual_roots:
            record = self._residual_record(residual, now_ms)
            if now_ms + record.delay_ms <= self.deadline_ms:
                self.local.append(record)
            else:
                yield record
        # What runner-initiated splits moved out is never re-fed here: it waits for the
        # next round (kept by this subtask with a store; spread over all tasks without one).
        self.split_counts.add(result.split)
        for residual in result.split.residual_roots:
            yield self._residual_record(residual, now_ms)
        for read, elements in result.split.unread.items():
            for element in elements:
                yield self._record(read, element, now_ms, 0.0, [])

    def _residual_record(self, residual, now_ms: float) -> ResidualRecord:
        app = residual.application
        read = self.worker.input_for(app.transform_id, app.input_id)
        delay = residual.requested_time_delay
        delay_ms = delay.seconds * 1000.0 + delay.nanos / 1e6
        holds = [timestamp.Timestamp.from_proto(ts).micros for ts in app.output_watermarks.values()]
        return self._record(read, app.element, now_ms, delay_ms, holds)

    def _record(self, read: str, element: bytes, now_ms, delay_ms, holds) -> ResidualRecord:
        """Hold: the min of the output watermarks, else the element's own timestamp."""
        if holds:
            hold = min(holds)
        else:
            coder = self.input_coders[read]
            hold = coder.decode_from_stream(create_InputStream(element), True).timestamp.micros
        return ResidualRecord(self.task.stage.id, read, element, now_ms, delay_ms, hold)


def _bundles(rows: Iterable[tuple[str, bytes]], limit: int) -> Iterator[dict[str, list[bytes]]]:
    inputs: dict[str, list[bytes]] = {}
    size = 0
    for transform, data in rows:
        inputs.setdefault(transform, []).append(data)
        size += len(data)
        if size >= limit:
            yield inputs
            inputs, size = {}, 0
    if inputs:
        yield inputs


class PendingTimers:
    """Timers set by the stage, deduplicated per (key, tag, window), fired in order.

    Batch: after all input the watermark is +infinity, so event-time timers fire earliest
    first (one set or cleared while firing replaces the pending one); processing-time timers
    fire when the wall clock reaches them."""

    def __init__(self, coders: dict[tuple[str, str], Any], domains: dict[tuple[str, str], int]):
        self.coders = coders  # (transform, family) -> the family's timer coder impl
        self.domains = domains  # (transform, family) -> its TimeDomain
        self.pending: dict[tuple, Any] = {}
        # Called with a timer's user key before the timer is set or cleared (streaming: loads
        # the key's stored timers first, so a new timer replaces or clears a stored one).
        self.before_change: Callable[[Any], None] | None = None

    @classmethod
    def of_task(cls, task: StageTask) -> PendingTimers:
        context = plan_context(task.plan_key)
        timers = task.stage.timers
        return cls(
            {(t.transform, t.family): context.coders[t.coder].get_impl() for t in timers},
            {(t.transform, t.family): t.time_domain for t in timers},
        )

    def __bool__(self) -> bool:
        return bool(self.pending)

    def add(self, family_key: tuple[str, str], chunks: list[bytes]) -> None:
        coder = self.coders[family_key]
        before_change = self.before_change
        for chunk in chunks:
            for timer in coder.decode_all(chunk):
                if before_change is not None:
                    before_change(timer.user_key)
                key = (family_key, timer.user_key, timer.dynamic_timer_tag, timer.windows[0])
                if timer.clear_bit:
                    self.pending.pop(key, None)
                else:
                    self.pending[key] = timer

    def pop_next(self) -> dict[tuple[str, str], list[bytes]]:
        """Remove and encode the timers due at the earliest firing time."""
        processing = beam_runner_api_pb2.TimeDomain.PROCESSING_TIME
        event = {k: t for k, t in self.pending.items() if self.domains[k[0]] != processing}
        if not event:  # processing-time timers only: wait for the wall clock to reach one
            earliest = min(t.fire_timestamp for t in self.pending.values())
            wait = earliest.micros / 1e6 - time.time()
            if wait > 0 and earliest < timestamp.MAX_TIMESTAMP:
                time.sleep(wait)
        return self.pop_earliest(event or self.pending)

    def pop_earliest(self, candidates: dict) -> dict[tuple[str, str], list[bytes]]:
        """Remove and encode those of ``candidates`` (pending timers) at their earliest firing
        time (batch: the next to fire; streaming: of those due by the watermark or clock)."""
        earliest = min(t.fire_timestamp for t in candidates.values())
        fired: dict[tuple[str, str], Any] = {}
        for key in [k for k, t in candidates.items() if t.fire_timestamp == earliest]:
            timer = self.pending.pop(key)
            fired.setdefault(key[0], create_OutputStream())
            self.coders[key[0]].encode_to_stream(timer, fired[key[0]], True)
        return {k: [out.get()] for k, out in fired.items()}

"""The operation behind ``WINDOW_INTO_URN``: Beam's standard WindowFns without a DoFn per element.

The same windows as the SDK's ``WindowInto`` DoFn (``bundle_processor.create_assign_windows``),
computed from integer microseconds, each window object made once per task (a round's elements
fall in few windows); an element's timestamp stays in micros (Beam 2.77 builds a ``Timestamp``
in Python each time one is read, and reads its micros back in Python: with them this operation
and those after it took 43% of the workers' busy time in a streaming window count, 32% without).
Registered with Beam's ``BeamTransformFactory`` on import (by ``stage_worker``), so the SDK
builds it like its own operations, counters included.
"""

from __future__ import annotations

from collections.abc import Callable

from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.worker import bundle_processor, operations
from apache_beam.runners.worker.bundle_processor import BeamTransformFactory
from apache_beam.transforms import window
from apache_beam.transforms.core import Windowing
from apache_beam.utils import windowed_value
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from sparkbeam.translation.window_into import WINDOW_INTO_URN

_CACHED_STARTS = 4096  # distinct window starts kept per operation


class _Spec:
    """What ``Operation.setup`` reads from a spec: the output coders."""

    def __init__(self, output_coder) -> None:
        self.output_coders = [output_coder]


class WindowIntoOperation(operations.Operation):
    def __init__(self, name_context, output_coder, counter_factory, state_sampler, assign) -> None:
        super().__init__(name_context, _Spec(output_coder), counter_factory, state_sampler)
        self.assign = assign

    def process(self, o: WindowedValue) -> None:
        with self.scoped_process_state:
            t = o.timestamp_micros
            windows = self.assign(t)
            for _ in o.windows:  # like the SDK's DoFn: one output per input window
                self.output(_create(o.value, t, windows))


_create = windowed_value.create  # a WindowedValue from micros, no Timestamp made


def assigner(windowfn) -> Callable[[int], tuple] | None:
    """timestamp micros -> windows for a standard WindowFn (the SDK's arithmetic); None for
    others."""
    kind = type(windowfn)
    if kind is window.GlobalWindows:
        only = (window.GlobalWindow(),)
        return lambda t: only
    if kind is window.Sessions:
        gap = windowfn.gap_size.micros
        return lambda t: (_interval(t, t + gap),)
    if kind is window.FixedWindows:
        size, offset = windowfn.size.micros, windowfn.offset.micros
        fixed = _ByStart(lambda start: (_interval(start, start + size),))
        return lambda t: fixed[t - (t - offset) % size]
    if kind is window.SlidingWindows:
        size, offset, period = windowfn.size.micros, windowfn.offset.micros, windowfn.period.micros
        one = _ByStart(lambda start: _interval(start, start + size))

        def assign_sliding(t: int) -> tuple:
            start = t - (t - offset) % period
            return tuple(one[s] for s in range(start, t - size, -period))

        return assign_sliding
    return None


class _ByStart(dict):
    """Window objects by start micros, each made once (a bounded number kept)."""

    def __init__(self, make: Callable[[int], object]) -> None:
        super().__init__()
        self.make = make

    def __missing__(self, start: int):
        if len(self) >= _CACHED_STARTS:
            self.clear()
        made = self[start] = self.make(start)
        return made


def _interval(start: int, end: int) -> window.IntervalWindow:
    return window.IntervalWindow(Timestamp(micros=start), Timestamp(micros=end))


@BeamTransformFactory.register_urn(WINDOW_INTO_URN, beam_runner_api_pb2.WindowingStrategy)
def create_window_into(factory, transform_id, transform_proto, parameter, consumers):
    windowing = Windowing.from_runner_api(parameter, factory.context)
    assign = assigner(windowing.windowfn)
    if assign is None:  # translation marks only standard WindowFns; keep Beam's for others
        return bundle_processor.create_assign_windows(
            factory, transform_id, transform_proto, parameter, consumers
        )
    op = WindowIntoOperation(
        bundle_processor.common.NameContext(transform_proto.unique_name, transform_id),
        factory.get_only_output_coder(transform_proto),
        factory.counter_factory,
        factory.state_sampler,
        assign,
    )
    return factory.augment_oldstyle_op(op, transform_proto.unique_name, consumers)

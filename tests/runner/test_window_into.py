"""sparkbeam's WindowInto operation: the SDK's windows, marked only for standard WindowFns."""

from __future__ import annotations

import random

import apache_beam as beam
import pytest
from apache_beam.coders.coders import IntervalWindowCoder
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.transforms import window
from apache_beam.utils.timestamp import Timestamp

from sparkbeam.runner.task.window_into import assigner
from sparkbeam.translation import translate
from sparkbeam.translation.window_into import WINDOW_INTO_URN

STANDARD = [
    window.GlobalWindows(),
    window.FixedWindows(5),
    window.FixedWindows(7, offset=3),
    window.SlidingWindows(10, 3),
    window.SlidingWindows(10, 5, offset=2),
    window.SlidingWindows(2, 4),  # period longer than size: some timestamps in no window
    window.Sessions(4),
]


class _Context:
    def __init__(self, timestamp):
        self.timestamp, self.element, self.window = timestamp, None, None


@pytest.mark.parametrize("windowfn", STANDARD, ids=lambda fn: repr(fn)[:40])
def test_the_windows_are_the_sdks(windowfn):
    assign, rng = assigner(windowfn), random.Random(7)
    for _ in range(5000):
        ts = Timestamp(micros=rng.randint(-(10**9), 10**9))
        assert list(assign(ts.micros)) == list(windowfn.assign(_Context(ts))), ts


class _EveryTwo(window.NonMergingWindowFn):
    def assign(self, context):
        start = context.timestamp - context.timestamp % 2
        return [window.IntervalWindow(start, start + 2)]

    def get_window_coder(self):
        return IntervalWindowCoder()


def _window_into_urns(windowfn) -> list[str]:
    p = beam.Pipeline()
    _ = p | beam.Create([1]) | beam.WindowInto(windowfn) | beam.Map(print)
    urns = []
    for stage in translate(p.to_runner_api()).stages:
        descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(stage.descriptor)
        transforms = descriptor.transforms.values()
        urns += [t.spec.urn for t in transforms if "WindowInto" in t.unique_name]
    return urns


def test_standard_window_fns_get_sparkbeams_operation_and_others_keep_beams():
    assert _window_into_urns(window.FixedWindows(5)) == [WINDOW_INTO_URN]
    assert _window_into_urns(window.Sessions(5)) == [WINDOW_INTO_URN]
    assert _window_into_urns(_EveryTwo()) == ["beam:transform:window_into:v1"]
    assert assigner(_EveryTwo()) is None

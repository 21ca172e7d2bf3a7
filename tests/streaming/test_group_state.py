"""A streaming GroupByKey's per-key state bytes (pure; no Spark): header and round trip."""

from __future__ import annotations

import math
import random

import pytest
from apache_beam.runners.direct.clock import RealClock
from apache_beam.transforms import trigger, window
from apache_beam.transforms.core import Windowing
from apache_beam.utils.timestamp import Duration, Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from sparkbeam.checkpoint.state_layout import read_group_header
from sparkbeam.runner.streaming.group import (
    TriggerPanes,
    dump_state,
    load_state,
)
from sparkbeam.runner.streaming.on_time_panes import OnTimePanes


def _driver(lateness=0):
    return trigger.GeneralTriggerDriver(
        Windowing(window.FixedWindows(10), allowed_lateness=Duration(seconds=lateness)),
        RealClock(),
    )


def _element(ts):
    return WindowedValue(b"v", Timestamp(ts), [window.IntervalWindow(0, 10)])


def test_header_names_the_window_end_timer_and_the_hold():
    state = trigger.InMemoryUnmergedState()
    list(_driver().process_elements(state, [_element(3)], Timestamp(0), Timestamp(0)))
    blob = dump_state(state, Duration(0))
    wake, real_ms, hold = read_group_header(blob)
    assert wake == Timestamp(10).micros  # the default trigger's timer at the window end
    assert real_ms == math.inf
    assert hold <= Timestamp(10).micros
    again = load_state(blob)
    assert dict(again.timers) == dict(state.timers)
    assert {w: dict(t) for w, t in again.state.items()} == {
        w: dict(t) for w, t in state.state.items()
    }


def test_fired_and_expired_window_leaves_no_state():
    from sparkbeam.runner.streaming.group import _close_expired, _fire_timers

    state = trigger.InMemoryUnmergedState()
    driver = _driver()
    list(driver.process_elements(state, [_element(3)], Timestamp(0), Timestamp(0)))
    fired = _fire_timers(driver, state, Timestamp(20), 0.0)
    assert [wv.value for wv in fired] == [[b"v"]]
    _close_expired(state, Timestamp(20), Duration(0), accumulating=False)
    assert dump_state(state, Duration(0)) is None


@pytest.mark.parametrize(
    "window_fn", [window.FixedWindows(5), window.SlidingWindows(10, 5)], ids=["fixed", "sliding"]
)
def test_on_time_fast_path_fires_the_same_panes_as_beams_trigger_driver(window_fn):
    """Random rounds with data behind, at and ahead of the watermark: identical panes."""
    windowing = Windowing(window_fn)
    assert OnTimePanes.applies(windowing)
    results = []
    for panes in (OnTimePanes(), TriggerPanes(windowing)):
        rng = random.Random(7)
        blob, out, previous = None, [], Timestamp(0)
        for r in range(1, 12):
            watermark = Timestamp(r * 4)
            elements = []
            for i in range(6):
                ts = Timestamp(rng.randint(r * 4 - 8, r * 4 + 8))
                windows = window_fn.assign(window.WindowFn.AssignContext(ts))
                elements.append(WindowedValue(b"%d-%d" % (r, i), ts, windows))
            fired, blob = panes.step(blob, elements, previous, watermark, 0.0)
            out += [(sorted(f.value), f.timestamp, f.windows, f.pane_info) for f in fired]
            previous = watermark
        fired, blob = panes.step(blob, [], previous, Timestamp(10**6), 0.0)
        out += [(sorted(f.value), f.timestamp, f.windows, f.pane_info) for f in fired]
        assert blob is None  # everything fired, nothing kept
        results.append(sorted(out, key=repr))
    assert len(results[0]) > 10
    assert results[0] == results[1]


def test_other_windowing_takes_the_general_driver():
    early = Windowing(
        window.FixedWindows(5),
        triggerfn=trigger.AfterWatermark(early=trigger.AfterCount(2)),
        accumulation_mode=trigger.AccumulationMode.DISCARDING,
    )
    assert not OnTimePanes.applies(early)
    assert not OnTimePanes.applies(Windowing(window.Sessions(5)))


def test_on_time_state_of_another_kind_is_refused_by_name():
    """The tree-codec buffer of layouts <= 3 (kind 1) is not read: refused, not misread."""
    from sparkbeam.checkpoint import state_layout

    old = state_layout.encode_group(1, 10, math.inf, 8, b"m\x00\x00\x00\x00")
    panes = OnTimePanes(Windowing(window.FixedWindows(10)))
    with pytest.raises(
        state_layout.StateLayoutError, match="of kind 1, this sparkbeam reads kind 2"
    ):
        panes.step(old, [_element(4)], Timestamp(0), Timestamp(5), 0.0)


def test_a_damaged_flat_body_is_refused_naming_the_fix():
    from sparkbeam.checkpoint import state_layout

    panes = OnTimePanes(Windowing(window.FixedWindows(10)))
    _, blob = panes.step(None, [_element(4)], Timestamp(0), Timestamp(1), 0.0)
    header = len(blob) - len(state_layout.decode_group(blob)[1])
    for cut in (len(blob) - 1, header + 5, header + 17):  # a value, a window head, a length
        with pytest.raises(state_layout.StateLayoutError, match="new --checkpoint_dir"):
            panes.step(blob[:cut], [], Timestamp(1), Timestamp(2), 0.0)

"""A triggered side input's view (``runner/task/side_input_view.py``): per window, the
latest firing. Real Beam coders and a real store; no Spark."""

from __future__ import annotations

from apache_beam.coders import coders
from apache_beam.coders.coder_impl import create_InputStream
from apache_beam.transforms.window import GlobalWindow, IntervalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import (
    PANE_INFO_UNKNOWN,
    PaneInfo,
    PaneInfoTiming,
    WindowedValue,
)

from sparkbeam.runner.task.side_input_view import LatestFirings

W1, W2 = IntervalWindow(0, 5), IntervalWindow(5, 10)
CODER = coders.WindowedValueCoder(coders.VarIntCoder(), coders.IntervalWindowCoder())
GLOBAL = coders.WindowedValueCoder(coders.StrUtf8Coder(), coders.GlobalWindowCoder())


def _pane(index: int, timing=PaneInfoTiming.EARLY) -> PaneInfo:
    return PaneInfo(index == 0, timing == PaneInfoTiming.ON_TIME, timing, index, -1)


def _chunk(coder, *values: WindowedValue) -> bytes:
    return b"".join(coder.get_impl().encode_nested(v) for v in values)


def _view(coder, view: LatestFirings) -> dict:
    """window -> the values its view holds."""
    out = {}
    for window, chunk in view.windows.items():
        stream, values = create_InputStream(chunk), []
        while stream.size() > 0:
            values.append(coder.get_impl().decode_from_stream(stream, True).value)
        out[coder.window_coder.decode(window)] = values
    return out


def test_a_later_pane_replaces_the_window_and_other_windows_keep_theirs():
    view = LatestFirings(CODER)
    view.fold([_chunk(CODER, WindowedValue(100, 2, (W1,), _pane(0)))])
    view.fold([_chunk(CODER, WindowedValue(400, 7, (W2,), _pane(0)))])
    assert _view(CODER, view) == {W1: [100], W2: [400]}
    fired = view.fold([_chunk(CODER, WindowedValue(0, 4, (W1,), _pane(1, PaneInfoTiming.ON_TIME)))])
    assert list(fired) == [CODER.window_coder.encode(W1)]  # only the window that fired
    assert _view(CODER, view) == {W1: [0], W2: [400]}


def test_within_one_round_the_highest_pane_index_wins_and_a_pane_keeps_all_its_elements():
    view = LatestFirings(CODER)
    early = WindowedValue(100, 2, (W1,), _pane(0))
    on_time = [WindowedValue(v, 4, (W1,), _pane(1, PaneInfoTiming.ON_TIME)) for v in (1, 2)]
    view.fold([_chunk(CODER, on_time[0]), _chunk(CODER, early, on_time[1])])
    assert _view(CODER, view) == {W1: [1, 2]}


def test_elements_no_trigger_fired_are_each_a_firing_the_latest_by_timestamp():
    """The global-window AsSingleton pattern: a catch-up round brings several versions."""
    view = LatestFirings(GLOBAL)
    versions = [WindowedValue(f"v{t}", t, (GlobalWindow(),), PANE_INFO_UNKNOWN) for t in (3, 9, 6)]
    view.fold([_chunk(GLOBAL, *versions)])
    assert _view(GLOBAL, view) == {GlobalWindow(): ["v9"]}
    view.fold([_chunk(GLOBAL, WindowedValue("v12", 12, (GlobalWindow(),), PANE_INFO_UNKNOWN))])
    assert _view(GLOBAL, view) == {GlobalWindow(): ["v12"]}
    view.fold([])  # a round that read nothing keeps the view
    assert _view(GLOBAL, view) == {GlobalWindow(): ["v12"]}


def test_an_element_in_two_windows_is_in_both_views():
    view = LatestFirings(CODER)
    view.fold([_chunk(CODER, WindowedValue(7, Timestamp(4), (W1, W2), _pane(0)))])
    assert _view(CODER, view) == {W1: [7], W2: [7]}

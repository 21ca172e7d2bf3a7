"""The default trigger's per-key state in a streaming GroupByKey: a flat buffer per window.

``OnTimePanes`` is ``group``'s fast path for the common windowing; ``group`` keeps the state.
"""

from __future__ import annotations

import math
import struct

from apache_beam.transforms import trigger
from apache_beam.transforms.window import IntervalWindow, TimestampCombiner
from apache_beam.utils import windowed_value
from apache_beam.utils.windowed_value import WindowedValue

from sparkbeam.checkpoint import state_layout
from sparkbeam.runner.streaming.trigger_codec import window_coder_for

_ON_TIME = windowed_value.PaneInfo(True, False, windowed_value.PaneInfoTiming.ON_TIME, 0, 0)
_LATE = windowed_value.PaneInfo(True, False, windowed_value.PaneInfoTiming.LATE, 0, 0)


class OnTimePanes:
    """The default trigger without merging, lateness or a timestamp combiner: the common case.

    Each window fires once, ON_TIME, at its max timestamp when the watermark reaches its end;
    data for a window ending exactly at the watermark fires at once as a LATE pane, data behind
    it is dropped: the general driver's panes (a test compares them) at a fraction of its cost.
    The state, the encoded values per window kept flat (``GROUP_ON_TIME_FLAT``), is keyed by the
    encoded window, so a step builds no window objects and hashes none of Beam's (their
    ``__hash__`` reads two timestamps through properties); a task encodes each window once.
    """

    def __init__(self, windowing=None) -> None:
        self.window_coder = window_coder_for(windowing)
        self._windows: dict = {}  # window (or its micros) -> (encoded, end micros)
        self._decoded: dict[bytes, tuple] = {}  # encoded window -> (max timestamp, (window,))
        self._marks: tuple | None = None  # (previous, watermark, their micros)

    @staticmethod
    def applies(windowing) -> bool:
        return (
            windowing.triggerfn == trigger.DefaultTrigger()
            and not windowing.windowfn.is_merging()
            and windowing.timestamp_combiner == TimestampCombiner.OUTPUT_AT_EOW
            and windowing.allowed_lateness == 0
        )

    def step(self, blob, elements, previous, watermark, now: float):
        previous_us, watermark_us = self._micros(previous, watermark)
        buffered = self._load(blob)  # encoded window -> [end micros, values]
        late: dict[bytes, list] | None = None
        window = self._window
        for wv in elements:
            value = wv.value
            for w in wv.windows:
                encoded, end = window(w)
                if end > previous_us:
                    entry = buffered.get(encoded)
                    if entry is None:
                        buffered[encoded] = [end, [value]]
                    else:
                        entry[1].append(value)
                elif end == previous_us:  # at the watermark: a LATE pane at once, like Beam's
                    late = late if late is not None else {}
                    late.setdefault(encoded, []).append(value)
                # else: behind the watermark, dropped (no allowed lateness)
        fired = [self._pane(w, v, _LATE) for w, v in late.items()] if late else []
        due, first_end = [], None
        for encoded, (end, _) in buffered.items():
            if end <= watermark_us:
                due.append((end, encoded))
            elif first_end is None or end < first_end:
                first_end = end
        if due:
            due.sort()
            fired += [self._pane(w, buffered.pop(w)[1], _ON_TIME) for _, w in due]
        if first_end is None:
            return fired, None
        return fired, state_layout.encode_group(
            state_layout.GROUP_ON_TIME_FLAT,
            first_end,
            math.inf,
            first_end - 2,  # the earliest window's max timestamp (end - 1 us), minus 1 us
            _encode_flat(buffered),
        )

    def _micros(self, previous, watermark) -> tuple[int, int]:
        """Both watermarks in micros (ints compare in C; Timestamps in Python), once a task."""
        if self._marks is None or self._marks[0] is not previous or self._marks[1] is not watermark:
            self._marks = (previous, watermark, previous.micros, watermark.micros)
        return self._marks[2], self._marks[3]

    def _window(self, w) -> tuple[bytes, int]:
        """(encoded window, end micros), made once a task per window."""
        key = (w._start_micros, w._end_micros) if type(w) is IntervalWindow else w
        known = self._windows.get(key)
        if known is None:
            known = self._windows[key] = (self.window_coder.encode(w), w.end.micros)
        return known

    def _pane(self, encoded: bytes, values: list, pane) -> WindowedValue:
        known = self._decoded.get(encoded)
        if known is None:
            w = self.window_coder.decode(encoded)
            known = self._decoded[encoded] = (w.max_timestamp(), (w,))
        return WindowedValue(values, known[0], known[1], pane)

    def _load(self, blob) -> dict[bytes, list]:
        if blob is None:
            return {}
        if blob[0] == state_layout.V1 and blob[1] == state_layout.GROUP_ON_TIME_FLAT:
            return _decode_flat(blob[state_layout.GROUP_HEADER_SIZE :])
        kind, body = state_layout.decode_group(blob)  # refuses another version
        if kind != state_layout.GROUP_ON_TIME_FLAT:
            raise state_layout.StateLayoutError(
                f"A GroupByKey's default-trigger buffer is of kind {kind}, this sparkbeam reads "
                f"kind {state_layout.GROUP_ON_TIME_FLAT} (state layout "
                f"{state_layout.LAYOUT_VERSION}): the checkpoint was written by another sparkbeam "
                "version or is damaged; start the job over with a new --checkpoint_dir."
            )
        return _decode_flat(body)


_FLAT_WINDOW = struct.Struct(">IqI")  # encoded window's length, its end micros, value count
_FLAT_VALUE = struct.Struct(">I")


def _encode_flat(buffered: dict[bytes, list]) -> bytes:
    parts: list[bytes] = []
    for encoded, (end, values) in buffered.items():
        parts += (_FLAT_WINDOW.pack(len(encoded), end, len(values)), encoded)
        for value in values:
            parts += (_FLAT_VALUE.pack(len(value)), value)
    return b"".join(parts)


def _decode_flat(body: bytes) -> dict[bytes, list]:
    buffered: dict[bytes, list] = {}
    at, size = 0, len(body)
    try:
        while at < size:
            length, end, count = _FLAT_WINDOW.unpack_from(body, at)
            at += _FLAT_WINDOW.size
            encoded = body[at : at + length]
            at += length
            values = []
            for _ in range(count):
                (n,) = _FLAT_VALUE.unpack_from(body, at)
                at += _FLAT_VALUE.size
                values.append(body[at : at + n])
                at += n
            buffered[encoded] = [end, values]
    except struct.error:
        at = -1  # cut short: damaged, like bytes left over
    if at != size:
        raise state_layout.StateLayoutError(
            "A GroupByKey's buffered windows end past their bytes: the checkpoint is damaged; "
            "start the job over with a new --checkpoint_dir."
        )
    return buffered

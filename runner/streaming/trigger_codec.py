"""How a streaming GroupByKey's trigger state is written without pickle.

Beam's ``GeneralTriggerDriver`` keeps per-key state as plain dicts and lists of ints,
strings, encoded elements, Beam timestamps and windows. The layout's `TreeCodec`
(``sparkbeam.checkpoint.state_layout``) writes the plain part; this module supplies the
Beam part: timestamps and durations as micros, windows through the windowing's own window
coder. Leaves what the state means to ``sparkbeam.runner.streaming.group``.
"""

from __future__ import annotations

import struct

from apache_beam.coders.coders import IntervalWindowCoder
from apache_beam.transforms.window import BoundedWindow, GlobalWindow, IntervalWindow
from apache_beam.utils import timestamp

from sparkbeam.checkpoint import state_layout

_TIMESTAMP, _DURATION, _WINDOW = 1, 2, 3
_I64 = struct.Struct(">q")


def trigger_state_codec(windowing) -> state_layout.TreeCodec:
    """The layout's tree codec, with Beam timestamps and this windowing's windows (without
    one: interval and global windows)."""
    window_coder = window_coder_for(windowing)

    def ext_encode(obj):
        if isinstance(obj, timestamp.Timestamp):
            return _TIMESTAMP, _I64.pack(obj.micros)
        if isinstance(obj, timestamp.Duration):
            return _DURATION, _I64.pack(obj.micros)
        if isinstance(obj, BoundedWindow):
            return _WINDOW, window_coder.encode(obj)
        return None

    def ext_decode(tag: int, raw: bytes):
        if tag == _TIMESTAMP:
            return timestamp.Timestamp(micros=_I64.unpack(raw)[0])
        if tag == _DURATION:
            return timestamp.Duration(micros=_I64.unpack(raw)[0])
        if tag == _WINDOW:
            return window_coder.decode(raw)
        raise state_layout.StateLayoutError(f"GroupByKey trigger state: unknown type tag {tag}")

    return state_layout.TreeCodec(ext_encode, ext_decode)


def window_coder_for(windowing):
    """The windowing's window coder; without one, interval and global windows."""
    return _StandardWindows() if windowing is None else windowing.windowfn.get_window_coder()


class _StandardWindows:
    """Beam's interval and global window coders behind one encode/decode."""

    def __init__(self) -> None:
        self.interval = IntervalWindowCoder()

    def encode(self, w) -> bytes:
        if isinstance(w, GlobalWindow):
            return b"g"
        if isinstance(w, IntervalWindow):
            return b"i" + self.interval.encode(w)
        raise TypeError(f"No standard window coder for {type(w).__name__}: pass the windowing")

    def decode(self, raw: bytes):
        return GlobalWindow() if raw == b"g" else self.interval.decode(raw[1:])

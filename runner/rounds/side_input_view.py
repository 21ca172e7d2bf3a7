"""A triggered side input's view in streaming: per window, the contents of its latest firing.

Beam's programming guide (side inputs and windowing): when a side input has several trigger
firings, the main input reads the value of the latest one; in ACCUMULATING mode that firing
already holds everything so far. This is what the "slowly updating global-window side input"
pattern relies on: an ``AsSingleton`` of a ``Repeatedly(AfterCount(1))`` global window sees one
version at a time, the newest.

Which firing is the latest: a streaming round reads what the side input's writers emitted
since the last round, and rounds run in order, so what a round brings for a window replaces
what the view held for it (windows the round brought nothing for keep their view). Within one
round, Beam's ``PaneInfo`` orders the firings: a higher pane index is a later firing of the
trigger (a GroupByKey can fire an early and an on-time pane in one round); elements no trigger
fired (timing UNKNOWN, index 0: a ``WindowInto`` with a trigger and no GroupByKey after it)
are each their own firing, the latest by timestamp. Elements of the same firing are all kept.
A side input with the default trigger fires once per window with every element, so its chunks
are kept as they come, not folded (``SideInput.triggered`` says which is which).

Owns: the fold and the view's store entries, namespace ``side-input/<buffer>``, key
``window/`` + the encoded window, value the window's latest firing as one Beam-encoded chunk
(`state_layout.encode_side_input`): the store holds one entry per window, replaced by each
firing, and a restore reads the view as it was at the checkpoint. Stores of layout 4 and older
hold every chunk under ``round/index`` keys: a restore folds them round by round and rewrites
them as window entries. Leaves reading the chunks (``rounds.side_inputs``), when a main input
may read (``streaming.pushback``) and serving the view to the SDK (``task.side_input_state``)
to others. Batch reads a bounded side input whole, every pane, as Beam's FnApiRunner does.
"""

from __future__ import annotations

from collections import defaultdict

from apache_beam.coders.coder_impl import create_InputStream, create_OutputStream
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners import pipeline_context
from apache_beam.utils.windowed_value import PaneInfoTiming, WindowedValue

from sparkbeam.checkpoint import state_layout

WINDOW_KEY = b"window/"  # a view entry's key: this, then the encoded window


class LatestFirings:
    """One triggered side input's view: encoded window -> the chunk of its latest firing."""

    def __init__(self, coder) -> None:
        self._impl = coder.get_impl()  # the side input's (safe) windowed-value coder
        self._window_coder = coder.window_coder
        self.windows: dict[bytes, bytes] = {}

    def fold(self, chunks: list[bytes]) -> dict[bytes, bytes]:
        """Take one round's chunks; returns the windows they replaced (window -> new chunk)."""
        latest: dict[bytes, tuple[tuple[int, int], list[WindowedValue]]] = {}
        for chunk in chunks:
            stream = create_InputStream(chunk)
            while stream.size() > 0:
                value = self._impl.decode_from_stream(stream, True)
                rank = _firing_order(value)
                for window in value.windows:
                    key = self._window_coder.encode(window)
                    held = latest.get(key)
                    one = value
                    if len(value.windows) > 1:
                        one = WindowedValue(
                            value.value, value.timestamp, (window,), value.pane_info
                        )
                    if held is None or rank > held[0]:
                        latest[key] = (rank, [one])
                    elif rank == held[0]:
                        held[1].append(one)
        fired = {key: self._encode(values) for key, (_, values) in latest.items()}
        self.windows.update(fired)
        return fired

    def chunks(self) -> list[bytes]:
        """The view as the tasks load it: one chunk per window."""
        return list(self.windows.values())

    def _encode(self, values: list[WindowedValue]) -> bytes:
        out = create_OutputStream()
        for value in values:
            self._impl.encode_to_stream(value, out, True)
        return out.get()


def _firing_order(value: WindowedValue) -> tuple[int, int]:
    """Later firings sort higher: the pane index; for elements no trigger fired, their time."""
    pane = value.pane_info
    if pane.timing == PaneInfoTiming.UNKNOWN:
        return pane.index, value.timestamp.micros
    return pane.index, 0


def views(plan, stages) -> dict[str, LatestFirings]:
    """A view per triggered side-input buffer the stages read (none: no Beam context built)."""
    triggered = {si.buffer: si.coder for s in stages for si in s.side_inputs if si.triggered}
    if not triggered:
        return {}
    components = beam_runner_api_pb2.Components.FromString(plan.components)
    context = pipeline_context.PipelineContext(components)
    return {b: LatestFirings(context.coders[coder]) for b, coder in triggered.items()}


def store(state, buffer: str, fired: dict[bytes, bytes]) -> None:
    """The windows a round replaced, into the pipeline's working state."""
    namespace = state_layout.side_input(buffer)
    for window, chunk in fired.items():
        state.put(namespace, WINDOW_KEY + window, state_layout.encode_side_input(chunk))


def restore(state, buffer: str, view: LatestFirings, entries: list[tuple[bytes, bytes]]) -> None:
    """The view at the checkpoint from ``entries`` (key, chunk) of its namespace.

    Window entries are the view; ``round/index`` entries (layouts <= 4: every chunk) are folded
    round by round, then replaced in ``state`` by window entries."""
    rounds: dict[bytes, list[bytes]] = defaultdict(list)
    older = []
    for key, chunk in sorted(entries):
        if key.startswith(WINDOW_KEY):
            view.windows[key[len(WINDOW_KEY) :]] = chunk
        else:
            rounds[key.split(b"/", 1)[0]].append(chunk)
            older.append(key)
    if not older:
        return
    for round_key in sorted(rounds):
        view.fold(rounds[round_key])
    namespace = state_layout.side_input(buffer)
    for key in older:
        state.delete(namespace, key)
    store(state, buffer, view.windows)

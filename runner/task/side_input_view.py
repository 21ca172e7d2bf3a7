"""A triggered side input's view in streaming: per window, the contents of its latest firing.

Beam's programming guide: a main input reads a side input's latest trigger firing (in
ACCUMULATING mode it holds everything so far), which the "slowly updating global-window side
input" pattern relies on. Rounds run in order, so what a round brings for a window replaces the
view's entry; within a round a higher pane index is a later firing, and elements no trigger
fired (timing UNKNOWN) are each their own firing, the latest by timestamp. Elements of one
firing are all kept. A side input with the default trigger fires once per window, so its
chunks are kept as they come (``SideInput.triggered`` says which).

Owns: the fold, and the view as task-owned state (``side-view/<buffer>``, key ``window/`` +
the encoded window, value the latest firing's chunk with the window's end,
`state_layout.encode_side_view`): new elements are keyed by window (`window_keyed`) and
shuffled to the window's subtask, which replaces those entries and deletes the windows no
reader needs (`keeping_view`). Leaves reading the files (``task.side_input_files``), when a
main input may read (``streaming.pushback``) and serving the SDK (``task.side_input_state``)
to others. Batch reads a bounded side input whole, every pane, as Beam's FnApiRunner does.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator

from apache_beam.utils.windowed_value import PaneInfoTiming, WindowedValue

from sparkbeam.checkpoint import state_layout
from sparkbeam.runner.task.records import CommitRecord
from sparkbeam.runner.task.side_input_files import SideInputHeld, commit_stage, later, window_end
from sparkbeam.runner.task.staged_state import StateRound
from sparkbeam.runner.task.task_range import TaskRange, finish, staged_writer_for_task
from sparkbeam.runner.task.worker_context import plan_context, register_plan

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
        for window, one in _per_window(self._impl, chunks):
            key = self._window_coder.encode(window)
            rank, held = _firing_order(one), latest.get(key)
            if held is None or rank > held[0]:
                latest[key] = (rank, [one])
            elif rank == held[0]:
                held[1].append(one)
        fired = {key: _encoded(self._impl, values) for key, (_, values) in latest.items()}
        self.windows.update(fired)
        return fired


def _firing_order(value: WindowedValue) -> tuple[int, int]:
    """Later firings sort higher: the pane index; for elements no trigger fired, their time."""
    pane = value.pane_info
    if pane.timing == PaneInfoTiming.UNKNOWN:
        return pane.index, value.timestamp.micros
    return pane.index, 0


# --- task side ------------------------------------------------------------------------------


def window_keyed(plan_key: str, components, coder_id: str, chunks) -> Iterator[tuple]:
    """(view key, one-element chunk) per window of each element of ``chunks``."""
    register_plan(plan_key, components.value)
    coder = plan_context(plan_key).coders[coder_id]
    impl, window_coder = coder.get_impl(), coder.window_coder
    for window, one in _per_window(impl, chunks):
        yield WINDOW_KEY + window_coder.encode(window), _encoded(impl, (one,))


def _per_window(impl, chunks) -> Iterator[tuple[object, WindowedValue]]:
    """(window, the element in that window alone) per window of each element of ``chunks``
    (Beam-encoded by ``impl``)."""
    for chunk in chunks:
        for value in impl.decode_all(chunk):
            for window in value.windows:
                one = value
                if len(value.windows) > 1:
                    one = WindowedValue(value.value, value.timestamp, (window,), value.pane_info)
                yield window, one


def _encoded(impl, values: Iterable[WindowedValue]) -> bytes:
    """One chunk of ``values``, Beam-encoded by ``impl``."""
    return b"".join(impl.encode_nested(value) for value in values)


def keeping_view(
    spec: StateRound, buffer: str, plan_key: str, components, coder_id: str, subtask: int,
    rows, writer=None, horizon: int | None = None, report: bool = False,
) -> Iterator:  # fmt: skip
    """Task body: fold this subtask's windows' new elements (``rows``, by `window_keyed`) into
    their entries, each with its window's end, and delete the windows ended by ``horizon``.
    Yields its `CommitRecord` (with ``report``, then a `SideInputHeld` of the new windows)."""
    register_plan(plan_key, components.value)
    namespace = state_layout.side_view(buffer)
    coder = plan_context(plan_key).coders[coder_id]
    fired = LatestFirings(coder).fold([data for _, data in rows])
    chunks = {WINDOW_KEY + window: chunk for window, chunk in fired.items()}
    stage = commit_stage(buffer)
    if writer is None:
        writer = staged_writer_for_task(spec, stage)
    view = TaskRange(spec, subtask, namespace)

    @functools.cache
    def ends(key: bytes) -> int:
        """A view key's window end (micros), each key's decoded once."""
        return window_end(coder.window_coder.decode(key[len(WINDOW_KEY) :]))

    latest = None
    for key, chunk in chunks.items():
        if horizon is None or ends(key) > horizon:
            view.put(key, state_layout.encode_side_view(chunk, ends(key)))
            latest = later(latest, ends(key))
    if horizon is not None:
        for key in [k for k in view.stored if ends(k) <= horizon]:
            view.delete(key)
    view.stage(writer)
    staged = finish(writer, view)  # what it staged is the next round's read
    yield CommitRecord(stage, staged)
    if report:
        yield SideInputHeld(buffer, latest, complete=False)

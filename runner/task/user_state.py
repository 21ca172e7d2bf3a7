"""The in-process Fn API state servicer, with the user-state cells a task touched.

Beam's ``worker_handlers.StateServicer`` serves the SDK's state requests in process. A
streaming stateful task persists every cell the SDK wrote or cleared: this subclass notes them
as requests arrive, and reads and restores them through the public requests (``get_raw``,
``append_raw``), never the servicer's private dicts. Leaves what is stored, and how, to
``sparkbeam.runner.streaming.stateful`` and ``sparkbeam.checkpoint.state_layout``.
"""

from __future__ import annotations

from collections.abc import Callable

from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.portability.fn_api_runner import worker_handlers

USER_STATE_TYPES = ("bag_user_state", "multimap_user_state", "ordered_list_user_state")
_ORDERED = "ordered_list_user_state"
_INT64 = (-(2**63), 2**63 - 1)


def cell_key(state_key: beam_fn_api_pb2.StateKey) -> bytes | None:
    """The stored identity of a user-state cell (an ordered list without its range)."""
    kind = state_key.WhichOneof("type")
    if kind not in USER_STATE_TYPES:
        return None
    if kind == _ORDERED and state_key.ordered_list_user_state.HasField("range"):
        state_key = beam_fn_api_pb2.StateKey.FromString(state_key.SerializeToString())
        state_key.ordered_list_user_state.ClearField("range")
    return state_key.SerializeToString()


def user_key(cell: bytes) -> bytes:
    """The (SDK-encoded) user key a cell belongs to."""
    state_key = beam_fn_api_pb2.StateKey.FromString(cell)
    return getattr(state_key, state_key.WhichOneof("type")).key


class UserStateServicer(worker_handlers.StateServicer):
    """A ``StateServicer`` that notes each user-state cell the SDK appends to or clears. A
    key's stored cells (``restore_lazily``) are put back when the SDK first asks for its state,
    so a round costs what its keys touch, not what the stage stores."""

    def __init__(self) -> None:
        super().__init__()
        self.touched: set[bytes] = set()
        self.restored: set[bytes] = set()  # user keys whose stored cells are back
        self._stored: dict[bytes, bytes] = {}
        self._decode: Callable[[bytes], dict[bytes, bytes]] | None = None

    def restore_lazily(
        self, stored: dict[bytes, bytes], decode: Callable[[bytes], dict[bytes, bytes]]
    ) -> None:
        """``stored``: {user key: its cells' value}, restored through ``decode`` when asked
        for (``stored`` is not changed)."""
        self._stored, self._decode = stored, decode

    def _restore_key_of(self, state_key) -> None:
        if not self._stored:  # batch, or nothing stored: no request needs a lookup
            return
        kind = state_key.WhichOneof("type")
        if kind not in USER_STATE_TYPES:
            return
        key = getattr(state_key, kind).key
        if key in self.restored or key not in self._stored:
            return
        self.restored.add(key)
        assert self._decode is not None
        self.restore_cells(self._decode(self._stored[key]))

    def get_raw(self, state_key, continuation_token=None):
        self._restore_key_of(state_key)
        return super().get_raw(state_key, continuation_token)

    def append_raw(self, state_key, data):
        self._touch(state_key)
        return super().append_raw(state_key, data)

    def clear(self, state_key):
        self._touch(state_key)
        return super().clear(state_key)

    def _touch(self, state_key) -> None:
        """Before a change: the key's stored cells are back, and a user-state cell is noted."""
        self._restore_key_of(state_key)
        cell = cell_key(state_key)
        if cell is not None:
            self.touched.add(cell)

    def restore_cells(self, cells: dict[bytes, bytes]) -> None:
        """Put stored cells back, as the SDK's append requests would have."""
        for cell, data in cells.items():
            self.append_raw(beam_fn_api_pb2.StateKey.FromString(cell), data)

    def read_cell(self, cell: bytes) -> bytes:
        """All of a cell's bytes through a get request (an ordered list over its full range)."""
        state_key = beam_fn_api_pb2.StateKey.FromString(cell)
        if state_key.WhichOneof("type") == _ORDERED:
            state_key.ordered_list_user_state.range.start = _INT64[0]
            state_key.ordered_list_user_state.range.end = _INT64[1]
        data, token = self.get_raw(state_key)
        parts = [data]
        while token:
            data, token = self.get_raw(state_key, token)
            parts.append(data)
        return b"".join(parts)

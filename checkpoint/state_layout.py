"""The state layout: every namespace of a pipeline's store and the codec of its values.

One place says what a checkpoint holds, so nothing else builds a namespace string and nothing
is pickled into a store: a checkpoint does not depend on the versions that wrote it, and a
writable store is no code-execution path. Beam data stays Beam-encoded (its own coder); around
it is a small explicit format whose first byte is its version.

| namespace | key | value |
|---|---|---|
| ``sdf-residual/<stage>`` | encoded element + 0x00 + uuid | `encode_residual` v1 |
| ``stage-output/<stage>`` | ``round/partition/seq`` | `encode_row` v1 (buffer, chunk) |
| ``pushback/<stage>`` | ``round/partition/seq`` | `encode_row` v1 (transform, chunk) |
| ``gbk/<buffer>`` | encoded key | `encode_group` v1 (header + trigger state tree) |
| ``user-state/<stage>`` | SDK-encoded user key | `encode_user_state` v1 (Fn API cells) |
| ``user-timers/<stage>`` | SDK-encoded user key | `encode_user_timers` v2 (summary, timers) |
| ``side-rows/<buffer>`` | ``round/partition/seq`` | `encode_side_row` v2 (end, buffer, chunk) |
| ``side-view/<buffer>`` | ``window/<window>`` | `encode_side_view` v2 (end, latest firing) |
| ``sink-pending`` | final path (UTF-8) | `encode_sink_pending` v1 (staged path, UTF-8) |
| ``sink-staging-dirs`` | directory (UTF-8) | `encode_staging_dir` v1 (the version byte) |

Also the completed-work markers and manifest metadata keys, with `LAYOUT_KEY`: the layout
(`LAYOUT_VERSION`) every checkpoint records, checked by `check_restorable` at restore before
anything is read. Leaves the meaning of each value to its owner (``sdf.checkpoint_handler``,
``runner.streaming.group``, ...). No Beam import: the trigger state's Beam types go through
`TreeCodec` hooks.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, NamedTuple

from sparkbeam.checkpoint.errors import StateLayoutError

LAYOUT_VERSION = 9  # checkpoints of older layouts are refused at restore (`check_restorable`)
LAYOUT_KEY = "state_layout"
V1 = 1  # the version byte of every value codec below
V2 = 2  # user-timers values with a `TimerSummary` after the version byte; side-rows and
#        side-view values with their windows' latest end

# Namespaces.
SDF_RESIDUAL_PREFIX = "sdf-residual/"
STAGE_OUTPUT_PREFIX = "stage-output/"
PUSHBACK_PREFIX = "pushback/"
GBK_PREFIX = "gbk/"
USER_STATE_PREFIX = "user-state/"
USER_TIMERS_PREFIX = "user-timers/"
SIDE_ROWS_PREFIX = "side-rows/"
SIDE_VIEW_PREFIX = "side-view/"
SINK_PENDING = "sink-pending"
SINK_STAGING_DIRS = "sink-staging-dirs"

# Completed-work markers, and the metadata key of a finished run (the round's other metadata is
# ``sparkbeam.runner.rounds.ledger.RoundMetadata``'s).
IMPULSE_DONE = "impulse"
FINISHED = "finished"

# Namespaces only the tasks that own their key groups write (`sparkbeam.checkpoint.task_state`).
TASK_OWNED_PREFIXES = (
    GBK_PREFIX, USER_STATE_PREFIX, USER_TIMERS_PREFIX, SDF_RESIDUAL_PREFIX, STAGE_OUTPUT_PREFIX,
    PUSHBACK_PREFIX, SIDE_ROWS_PREFIX, SIDE_VIEW_PREFIX,
)  # fmt: skip
# Task-owned namespaces whose keys are put once and never deleted: a range's snapshot keeps its
# base's files and adds one of its tail (`sparkbeam.runner.task.task_range` `RowKeeper`).
APPEND_ONLY_PREFIXES = (STAGE_OUTPUT_PREFIX, PUSHBACK_PREFIX, SIDE_ROWS_PREFIX)


def is_task_owned(namespace: str) -> bool:
    """Whether tasks own ``namespace``: the driver holds its handles, never its records."""
    return namespace.startswith(TASK_OWNED_PREFIXES)


def layout_of(metadata) -> int:
    """The state layout a checkpoint's metadata records (1: before layouts were recorded)."""
    return int(metadata.get(LAYOUT_KEY, 1))


# Namespaces whose values carry a version byte: all of them (the tasks' and the driver's).
VERSIONED_PREFIXES = TASK_OWNED_PREFIXES + (SINK_PENDING, SINK_STAGING_DIRS)


# Namespace builders: the prefix + the stage's (or buffer's) id.
sdf_residual = partial(operator.add, SDF_RESIDUAL_PREFIX)
stage_output = partial(operator.add, STAGE_OUTPUT_PREFIX)
pushback = partial(operator.add, PUSHBACK_PREFIX)
gbk = partial(operator.add, GBK_PREFIX)
user_state = partial(operator.add, USER_STATE_PREFIX)
user_timers = partial(operator.add, USER_TIMERS_PREFIX)
side_rows = partial(operator.add, SIDE_ROWS_PREFIX)
side_view = partial(operator.add, SIDE_VIEW_PREFIX)


def input_marker(stage: str) -> str:
    """Completed-work marker: the stage consumed its (bounded) input."""
    return f"{stage}:input"


def side_data_marker(buffer: str) -> str:
    """Completed-work marker: data arrived for streaming side input ``buffer`` (ready for good)."""
    return f"{buffer}:side-data"


# Restore check.


def check_restorable(metadata: dict, where: str) -> None:
    """Refuse a checkpoint (its manifest ``metadata``, named by ``where``) of another layout
    before anything of it is read: older layouts are not upgraded. A finished run's passes:
    nothing of it is resumed (only ``--fresh`` runs the job again)."""
    version = layout_of(metadata)
    if version == LAYOUT_VERSION or metadata.get(FINISHED):
        return
    if version > LAYOUT_VERSION:
        raise StateLayoutError(
            f"{where} was written in state layout {version}, newer than layout "
            f"{LAYOUT_VERSION}, the one this sparkbeam reads: run the job with the sparkbeam "
            "version that wrote it, or a newer one. The store was left as it was."
        )
    raise StateLayoutError(
        f"{where} was written in state layout {version}, older than layout {LAYOUT_VERSION}, "
        "the only one this sparkbeam reads (older stores are not upgraded): drain the job with "
        "the sparkbeam version that wrote it (a batch job: let it finish), then rerun it here "
        "with --fresh, or start it over with a new --checkpoint_dir. The store was left as it "
        "was."
    )


def _check(value: bytes, namespace: str, where: str, versions: tuple[int, ...] = (V1,)) -> None:
    if not value or value[0] not in versions:
        found = f"0x{value[0]:02x}" if value else "none (empty value)"
        readable = " or ".join(str(v) for v in versions)
        raise StateLayoutError(
            f"A value in namespace {namespace!r}{' of ' + where if where else ''} has version "
            f"byte {found}; this sparkbeam reads version {readable} (state layout "
            f"{LAYOUT_VERSION}). "
            "The checkpoint was written by another sparkbeam version or is damaged: finish the "
            "job with the version that wrote it, or start it over with a new --checkpoint_dir."
        )


def check_value(value: bytes, namespace: str, where: str = "") -> None:
    """Raise `StateLayoutError` unless ``value`` of a versioned namespace is readable."""
    if namespace.startswith((USER_TIMERS_PREFIX, SIDE_ROWS_PREFIX, SIDE_VIEW_PREFIX)):
        _check(value, namespace, where, (V2,))
    elif namespace.startswith(VERSIONED_PREFIXES):
        _check(value, namespace, where)


# sdf-residual/<stage>.
_RESIDUAL = struct.Struct(">BqqdH")


def encode_residual(
    transform: str, element: bytes, fire_at_ms: int, hold_micros: int, delay_ms: float
) -> bytes:
    """A pending residual: version, fire time ms, hold micros, delay ms, transform, element."""
    name = transform.encode("utf-8")
    return _RESIDUAL.pack(V1, fire_at_ms, hold_micros, delay_ms, len(name)) + name + element


def decode_residual(value: bytes, namespace: str = SDF_RESIDUAL_PREFIX, where: str = ""):
    """(transform, element, fire_at_ms, hold_micros, delay_ms) of `encode_residual` bytes."""
    _check(value, namespace, where)
    _, fire_at_ms, hold_micros, delay_ms, n = _RESIDUAL.unpack_from(value)
    start = _RESIDUAL.size
    transform = value[start : start + n].decode("utf-8")
    return transform, value[start + n :], fire_at_ms, hold_micros, delay_ms


def residual_timer(value: bytes, namespace: str = SDF_RESIDUAL_PREFIX) -> tuple[int, int]:
    """(fire_at_ms, hold_micros) of `encode_residual` bytes, without copying the element."""
    _check(value, namespace, "")
    _, fire_at_ms, hold_micros, _, _ = _RESIDUAL.unpack_from(value)
    return fire_at_ms, hold_micros


# stage-output/<stage>, pushback/<stage>.
_ROW = struct.Struct(">BH")
_U16 = struct.Struct(">H")


def encode_row(name: str, data: bytes) -> bytes:
    """A named chunk of Beam-encoded elements (an output buffer or an input transform)."""
    raw = name.encode("utf-8")
    return _ROW.pack(V1, len(raw)) + raw + data


def decode_row(value: bytes, namespace: str, where: str = "") -> tuple[str, bytes]:
    _check(value, namespace, where)
    _, n = _ROW.unpack_from(value)
    return value[_ROW.size : _ROW.size + n].decode("utf-8"), value[_ROW.size + n :]


def row_key(round_no: int, partition: int, seq: int, round_width: int = 10) -> bytes:
    """Keys that sort in commit order: round, partition, sequence within the task."""
    return f"{round_no:0{round_width}d}/{partition:06d}/{seq:09d}".encode()


# side-rows/<buffer> and side-view/<buffer> (v2): version, the latest end (micros) of the
# chunk's windows (`END_NEVER`: the global window's), then a side row's name and chunk, or the
# latest firing of a view's window (key ``window/`` + the encoded window). A window's data is
# dropped once every reader's watermark passed its end plus the allowed lateness.
END_NEVER = 2**63 - 1  # the end of a window that never expires: the global window
_END = struct.Struct(">Bq")


def encode_side_row(name: str, data: bytes, end: int) -> bytes:
    """A side input's chunk (``name``: its buffer) and its windows' latest ``end``."""
    raw = name.encode("utf-8")
    return _END.pack(V2, end) + _U16.pack(len(raw)) + raw + data


def decode_side_row(value: bytes, namespace: str, where: str = "") -> tuple[str, bytes, int]:
    """(name, chunk, latest end) of a side row."""
    _check(value, namespace, where, (V2,))
    _, end = _END.unpack_from(value)
    (n,) = _U16.unpack_from(value, _END.size)
    start = _END.size + _U16.size
    return value[start : start + n].decode("utf-8"), value[start + n :], end


def encode_side_view(chunk: bytes, end: int) -> bytes:
    """A triggered side input's window entry: its latest firing, and the window's end."""
    return _END.pack(V2, end) + chunk


def decode_side_view(value: bytes, namespace: str, where: str = "") -> tuple[bytes, int]:
    """(chunk, window end) of a view entry."""
    _check(value, namespace, where, (V2,))
    return value[_END.size :], _END.unpack_from(value)[1]


# sink-pending: key the final path; value version, staged path (UTF-8 both).
def encode_sink_pending(final: str, staged: str) -> tuple[bytes, bytes]:
    """(key, value) of a staged sink file awaiting its rename to ``final``."""
    return final.encode("utf-8"), bytes([V1]) + staged.encode("utf-8")


def decode_sink_pending(key: bytes, value: bytes, where: str = "") -> tuple[str, str]:
    """(staged, final) of `encode_sink_pending`'s key and value."""
    _check(value, SINK_PENDING, where)
    return value[1:].decode("utf-8"), key.decode("utf-8")


# sink-staging-dirs: key the directory (UTF-8); value the version byte alone.
def encode_staging_dir(directory: str) -> tuple[bytes, bytes]:
    """(key, value) recording a sink staging directory to clean on restore."""
    return directory.encode("utf-8"), bytes([V1])


def decode_staging_dir(key: bytes, value: bytes, where: str = "") -> str:
    _check(value, SINK_STAGING_DIRS, where)
    if len(value) != 1:
        raise StateLayoutError(
            f"A value in namespace {SINK_STAGING_DIRS!r}{' of ' + where if where else ''} "
            f"has {len(value)} bytes, the version byte alone was expected: the checkpoint is "
            "damaged; start the job over with a new --checkpoint_dir."
        )
    return key.decode("utf-8")


# gbk/<buffer>: version, kind, header (next event-time wake, next processing timer, hold).
_GROUP = struct.Struct(">BBqdq")
GROUP_HEADER = _GROUP  # (version, kind, wake, real_ms, hold): unchecked reads of many headers
GROUP_HEADER_SIZE = _GROUP.size
GROUP_TRIGGER = 0  # Beam's GeneralTriggerDriver state
GROUP_ON_TIME_FLAT = 2  # the OnTimePanes buffer (``streaming.on_time_panes``): per window, its
#                         length, end micros, value count, encoded window, then each value


def encode_group(kind: int, wake: int, real_ms: float, hold: int, body: bytes) -> bytes:
    return _GROUP.pack(V1, kind, wake, real_ms, hold) + body


def read_group_header(value: bytes, namespace: str = GBK_PREFIX) -> tuple[int, float, int]:
    """(next event-time wake micros, next processing timer ms or inf, hold micros)."""
    _check(value, namespace, "")
    return _GROUP.unpack_from(value)[2:]


def decode_group(value: bytes, namespace: str = GBK_PREFIX) -> tuple[int, bytes]:
    """(kind, body) of `encode_group` bytes."""
    _check(value, namespace, "")
    return value[1], value[_GROUP.size :]


# user-state/<stage> and user-timers/<stage>.
_U32 = struct.Struct(">I")
_TIMER_SUMMARY = struct.Struct(">Iqqq")
NO_TIME = 2**63 - 1  # a summary's time when the key has no such timer


class TimerSummary(NamedTuple):
    """What a round needs of one key's timers without decoding them (micros)."""

    timers: int
    event_fire: int  # the earliest event-time timer's firing time
    hold: int  # the earliest output-timestamp hold of its event-time timers
    processing_fire: int  # the earliest processing-time timer's firing time


def _pack_blobs(blobs: Iterable[bytes], head: bytes = bytes([V1])) -> bytes:
    blobs = list(blobs)
    parts = [head, _U32.pack(len(blobs))]
    for blob in blobs:
        parts += [_U32.pack(len(blob)), blob]
    return b"".join(parts)


def _unpack_blobs(value: bytes, start: int = 1) -> list[bytes]:
    (count,), pos, out = _U32.unpack_from(value, start), start + 4, []
    for _ in range(count):
        (n,) = _U32.unpack_from(value, pos)
        out.append(value[pos + 4 : pos + 4 + n])
        pos += 4 + n
    return out


def encode_user_state(cells: dict[bytes, bytes]) -> bytes:
    """One user key's state: {serialized Fn API StateKey: its raw state bytes}."""
    return _pack_blobs(b for k in sorted(cells) for b in (k, cells[k]))


def decode_user_state(value: bytes, namespace: str = USER_STATE_PREFIX, where: str = ""):
    _check(value, namespace, where)
    blobs = _unpack_blobs(value)
    return dict(zip(blobs[::2], blobs[1::2]))


def encode_user_timers(timers: Iterable[tuple[str, str, bytes]], summary: TimerSummary) -> bytes:
    """One user key's timers: (transform, timer family, Beam-encoded timer) each, after their
    summary (so a round reads when the key is due and what it holds without Beam)."""
    parts = []
    for transform, family, data in timers:
        parts += [transform.encode("utf-8"), family.encode("utf-8"), data]
    return _pack_blobs(parts, bytes([V2]) + _TIMER_SUMMARY.pack(*summary))


def user_timers_summary(
    value: bytes, namespace: str = USER_TIMERS_PREFIX, where: str = ""
) -> TimerSummary:
    """The summary of one key's timers, without decoding them."""
    if not value or value[0] != V2:
        _check(value, namespace, where, (V2,))
    return TimerSummary._make(_TIMER_SUMMARY.unpack_from(value, 1))


def decode_user_timers(value: bytes, namespace: str = USER_TIMERS_PREFIX, where: str = ""):
    _check(value, namespace, where, (V2,))
    blobs = _unpack_blobs(value, 1 + _TIMER_SUMMARY.size)
    return [
        (blobs[i].decode("utf-8"), blobs[i + 1].decode("utf-8"), blobs[i + 2])
        for i in range(0, len(blobs), 3)
    ]


class TreeCodec:
    """Plain data (None, bool, int, float, str, bytes, list, tuple, dict) as tagged bytes; Beam
    types through ``ext_encode(obj) -> (tag, bytes) or None`` and ``ext_decode(tag, bytes)``.
    Anything else raises TypeError: nothing falls back to pickle."""

    def __init__(self, ext_encode: Callable, ext_decode: Callable) -> None:
        self.ext_encode, self.ext_decode = ext_encode, ext_decode

    def encode(self, obj: Any) -> bytes:
        out: list[bytes] = []
        self._enc(obj, out)
        return b"".join(out)

    def _enc(self, obj: Any, out: list) -> None:
        if obj is None or obj is True or obj is False:
            out.append({None: b"N", True: b"T", False: b"F"}[obj])
        elif type(obj) is int:
            out += [b"i", struct.pack(">q", obj)]
        elif type(obj) is float:
            out += [b"d", struct.pack(">d", obj)]
        elif type(obj) in (str, bytes):
            raw = obj.encode("utf-8") if type(obj) is str else obj
            out += [b"s" if type(obj) is str else b"b", _U32.pack(len(raw)), raw]
        elif type(obj) in (list, tuple):
            out += [b"l" if type(obj) is list else b"t", _U32.pack(len(obj))]
            for item in obj:
                self._enc(item, out)
        elif isinstance(obj, dict):
            out += [b"m", _U32.pack(len(obj))]
            for k, v in obj.items():
                self._enc(k, out)
                self._enc(v, out)
        else:
            ext = self.ext_encode(obj)
            if ext is None:
                raise TypeError(
                    f"The state layout cannot encode a {type(obj).__name__} in GroupByKey "
                    "trigger state; this is a sparkbeam bug, please report it with the trigger."
                )
            tag, raw = ext
            out += [b"x", bytes([tag]), _U32.pack(len(raw)), raw]

    def decode(self, data: bytes) -> Any:
        obj, _ = self._dec(memoryview(data), 0)
        return obj

    def _dec(self, data: memoryview, pos: int) -> tuple[Any, int]:
        tag, pos = bytes(data[pos : pos + 1]), pos + 1
        if tag in (b"N", b"T", b"F"):
            return {b"N": None, b"T": True, b"F": False}[tag], pos
        if tag in (b"i", b"d"):
            return struct.unpack_from(">q" if tag == b"i" else ">d", data, pos)[0], pos + 8
        if tag in (b"s", b"b"):
            (n,) = _U32.unpack_from(data, pos)
            raw = bytes(data[pos + 4 : pos + 4 + n])
            return (raw.decode("utf-8") if tag == b"s" else raw), pos + 4 + n
        if tag in (b"l", b"t", b"m"):
            (n,) = _U32.unpack_from(data, pos)
            pos += 4
            items = []
            for _ in range(n * (2 if tag == b"m" else 1)):
                item, pos = self._dec(data, pos)
                items.append(item)
            if tag == b"m":
                return dict(zip(items[::2], items[1::2])), pos
            return (items if tag == b"l" else tuple(items)), pos
        if tag == b"x":
            ext, (n,) = data[pos], _U32.unpack_from(data, pos + 1)
            raw = bytes(data[pos + 5 : pos + 5 + n])
            return self.ext_decode(ext, raw), pos + 5 + n
        raise StateLayoutError(f"GroupByKey trigger state has an unknown tag {tag!r}: damaged")

"""The state layout's codecs (pure; no Spark): round trips, and refusals of other versions."""

from __future__ import annotations

import pickle
import struct

import pytest

from sparkbeam.checkpoint import state_layout as sl
from sparkbeam.checkpoint.errors import StateLayoutError


def _other_version(value: bytes) -> bytes:
    return bytes([0x09]) + value[1:]  # no value format has that version


def test_residual_round_trips_and_refuses_another_version():
    value = sl.encode_residual("t/in", b"\x00elem", 1_700_000_000_123, -5, 12.5)
    assert sl.decode_residual(value) == ("t/in", b"\x00elem", 1_700_000_000_123, -5, 12.5)
    with pytest.raises(StateLayoutError, match=r"'sdf-residual/s1'.*0x09.*--checkpoint_dir"):
        sl.decode_residual(_other_version(value), sl.sdf_residual("s1"))


def test_residual_of_the_old_layout_is_refused_not_misread():
    # Before the layout module a residual started with its fire time: 0x00 for any real date.
    old = (1_700_000_000_123).to_bytes(8, "big") + b"rest"
    with pytest.raises(StateLayoutError, match="version byte 0x00"):
        sl.decode_residual(old)


def test_rows_user_state_and_timers_round_trip():
    ns = sl.stage_output("s")
    assert sl.decode_row(sl.encode_row("buf-1", b"\x00data\x00"), ns) == ("buf-1", b"\x00data\x00")
    cells = {b"cell-b": b"\x01\x02", b"cell-a": b""}
    assert sl.decode_user_state(sl.encode_user_state(cells)) == cells
    timers = [("t1", "fam", b"\x00timer"), ("t2", "f2", b"")]
    summary = sl.TimerSummary(2, 1_000, -5, sl.NO_TIME)
    stored = sl.encode_user_timers(timers, summary)
    assert sl.decode_user_timers(stored) == timers
    assert sl.user_timers_summary(stored) == summary


def test_timers_stored_before_summaries_are_refused():
    blobs = [b"t", b"f", b"\x01"]  # v1: version, count, then each blob after its length
    v1 = (
        bytes([sl.V1])
        + struct.pack(">I", 3)
        + b"".join(struct.pack(">I", len(b)) + b for b in blobs)
    )
    for read in (sl.decode_user_timers, sl.user_timers_summary, sl.check_value):
        with pytest.raises(StateLayoutError, match=r"'user-timers/s'.*0x01.*reads version 2"):
            read(v1, sl.user_timers("s"))


@pytest.mark.parametrize(
    "namespace, value",
    [
        (sl.pushback("s"), sl.encode_row("t", b"x")),
        (sl.user_state("s"), sl.encode_user_state({b"k": b"v"})),
        (
            sl.user_timers("s"),
            sl.encode_user_timers([("t", "f", b"v")], sl.TimerSummary(1, 0, 0, 0)),
        ),
        (sl.gbk("b"), sl.encode_group(sl.GROUP_TRIGGER, 1, 2.0, 3, b"N")),
        (sl.side_rows("b"), sl.encode_side_row("b", b"\x7fchunk", 10)),
        (sl.side_view("b"), sl.encode_side_view(b"\x7fchunk", sl.END_NEVER)),
        (sl.SINK_PENDING, sl.encode_sink_pending("/out/f", "/out/.staging/f")[1]),
        (sl.SINK_STAGING_DIRS, sl.encode_staging_dir("/out/.staging")[1]),
    ],
)
def test_every_versioned_namespace_refuses_a_wrong_version_byte(namespace, value):
    sl.check_value(value, namespace, "checkpoint 7 of pipeline 'p'")
    with pytest.raises(StateLayoutError) as e:
        sl.check_value(_other_version(value), namespace, "checkpoint 7 of pipeline 'p'")
    assert repr(namespace) in str(e.value)
    assert "checkpoint 7 of pipeline 'p'" in str(e.value)
    assert "--checkpoint_dir" in str(e.value)


def test_a_pickled_value_is_refused():
    blob = pickle.dumps({b"cell": [b"v"]}, protocol=4)
    for decode in (sl.decode_user_state, sl.decode_user_timers, sl.read_group_header):
        with pytest.raises(StateLayoutError, match="version byte 0x80"):
            decode(blob)


def test_tree_codec_round_trips_plain_data_and_never_falls_back_to_pickle():
    codec = sl.TreeCodec(lambda o: (7, o.raw) if isinstance(o, _Ext) else None, _decode_ext)
    tree = ({1: [b"a", b"b"], "s": (None, True, False, -3, 2.5)}, {_Ext(b"w"): {("n", "d"): 4}})
    assert codec.decode(codec.encode(tree)) == tree
    with pytest.raises(TypeError, match="cannot encode a set"):
        codec.encode({"x": {1, 2}})


class _Ext:
    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def __eq__(self, other) -> bool:
        return isinstance(other, _Ext) and other.raw == self.raw

    def __hash__(self) -> int:
        return hash(self.raw)


def _decode_ext(tag: int, raw: bytes):
    assert tag == 7
    return _Ext(raw)


def test_side_input_and_sink_values_round_trip():
    for chunk in (b"", b"\x01", b"\x7f\xdf;dZ\x1c\xac\t\x00"):
        row = sl.encode_side_row("buf", chunk, -3)
        assert sl.decode_side_row(row, sl.side_rows("buf")) == ("buf", chunk, -3)
        view = sl.encode_side_view(chunk, sl.END_NEVER)
        assert sl.decode_side_view(view, sl.side_view("buf")) == (chunk, sl.END_NEVER)
    key, value = sl.encode_sink_pending("s3://b/out/f-é", "s3://b/out/.staging/f-é.tmp")
    assert key == "s3://b/out/f-é".encode()  # the key is the final path, as in layout 2
    assert sl.decode_sink_pending(key, value) == ("s3://b/out/.staging/f-é.tmp", "s3://b/out/f-é")
    key, value = sl.encode_staging_dir("/out/.sparkbeam-staging")
    assert (key, value) == (b"/out/.sparkbeam-staging", bytes([sl.V1]))
    assert sl.decode_staging_dir(key, value) == "/out/.sparkbeam-staging"


def test_side_input_and_sink_values_of_older_layouts_are_refused_not_misread():
    where = "checkpoint 3 of pipeline 'p'"
    with pytest.raises(StateLayoutError, match=r"'sink-pending' of checkpoint 3.*byte 0x2f"):
        sl.decode_sink_pending(b"/out/f", b"/out/.staging/f", where)  # raw staged path
    with pytest.raises(StateLayoutError, match=r"'sink-staging-dirs'.*none \(empty value\)"):
        sl.decode_staging_dir(b"/out/.staging", b"")  # layout 2 stored nothing
    for old in (sl.encode_row("buf", b"chunk"), bytes([sl.V1]) + b"chunk"):  # layout 8: no end
        with pytest.raises(StateLayoutError, match=r"'side-rows/b'.*0x01.*reads version 2"):
            sl.decode_side_row(old, sl.side_rows("b"))
        with pytest.raises(StateLayoutError, match=r"'side-view/b'.*0x01.*reads version 2"):
            sl.decode_side_view(old, sl.side_view("b"))
    with pytest.raises(StateLayoutError, match=r"'sink-staging-dirs'.*has 3 bytes.*damaged"):
        sl.decode_staging_dir(b"/out/.staging", bytes([sl.V1]) + b"xy")

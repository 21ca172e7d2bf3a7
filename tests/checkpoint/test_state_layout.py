"""The state layout's codecs (pure; no Spark): round trips, and refusals of other versions."""

from __future__ import annotations

import pickle

import pytest

from sparkbeam.checkpoint import state_layout as sl
from sparkbeam.checkpoint.errors import StateLayoutError


def _other_version(value: bytes) -> bytes:
    return bytes([sl.V1 + 1]) + value[1:]


def test_residual_round_trips_and_refuses_another_version():
    value = sl.encode_residual("t/in", b"\x00elem", 1_700_000_000_123, -5, 12.5)
    assert sl.decode_residual(value) == ("t/in", b"\x00elem", 1_700_000_000_123, -5, 12.5)
    with pytest.raises(StateLayoutError, match=r"'sdf-residual/s1'.*0x02.*--checkpoint_dir"):
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
    assert sl.decode_user_timers(sl.encode_user_timers(timers)) == timers


@pytest.mark.parametrize(
    "namespace, value",
    [
        (sl.pushback("s"), sl.encode_row("t", b"x")),
        (sl.user_state("s"), sl.encode_user_state({b"k": b"v"})),
        (sl.user_timers("s"), sl.encode_user_timers([("t", "f", b"v")])),
        (sl.gbk("b"), sl.encode_group(sl.GROUP_TRIGGER, 1, 2.0, 3, b"N")),
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


def test_restore_check_refuses_an_older_layout_only_when_it_holds_changed_state():
    where = "Checkpoint 4 of pipeline 'p' in store '/s'"
    sl.check_restorable({sl.LAYOUT_KEY: sl.LAYOUT_VERSION}, [sl.gbk("b")], where)
    sl.check_restorable({}, [sl.SINK_PENDING, sl.side_input("b")], where)  # unchanged formats
    with pytest.raises(StateLayoutError) as e:
        sl.check_restorable({}, [sl.gbk("b"), sl.SINK_PENDING], where)
    message = str(e.value)
    assert "state layout version 1" in message and f"version {sl.LAYOUT_VERSION}" in message
    assert "'gbk/b'" not in message and "gbk/b" in message and where in message
    assert "--checkpoint_dir" in message
    with pytest.raises(StateLayoutError, match="layout version 3"):
        sl.check_restorable({sl.LAYOUT_KEY: 3}, [], where)  # a newer layout: never guessed

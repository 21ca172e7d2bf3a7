"""``sparkbeam startpoints set`` refuses positions the restart could never apply, at once."""

from __future__ import annotations

import re

import pytest

from sparkbeam.checkpoint import open_store
from sparkbeam.checkpoint.cli import main


def _set(tmp_path, kind: str, value: str) -> int:
    args = ["startpoints", "set", "--checkpoint_dir", str(tmp_path), "--pipeline", "pipeline-0"]
    return main([*args, "--transform", "Read", "--kind", kind, "--value", value])


@pytest.mark.parametrize(
    "kind, value, match",
    [
        ("offset", "-5", r"offset '-5' is not a non-negative integer"),
        ("offset", "abc", r"offset 'abc' is not a non-negative integer"),
        ("offset", "1.5", r"offset '1.5' is not a non-negative integer"),
        ("timestamp", "soon", r"--value 'soon' is not a timestamp: give epoch milliseconds"),
    ],
)
def test_set_refuses_a_bad_position_and_stores_nothing(tmp_path, capsys, kind, value, match):
    assert _set(tmp_path, kind, value) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert re.search(match, err), err
    with open_store(str(tmp_path), read_only=True) as store:
        assert store.startpoints.list() == []


def test_set_accepts_offsets_from_zero(tmp_path):
    assert _set(tmp_path, "offset", "0") == 0
    assert _set(tmp_path, "offset", "42") == 0
    with open_store(str(tmp_path), read_only=True) as store:
        assert [s.position for s in store.startpoints.list()] == ["42"]

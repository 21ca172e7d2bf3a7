"""``StagedWriter.write_all``: a task's changes to one namespace in one call, as put/delete."""

from __future__ import annotations

import pytest

from sparkbeam.checkpoint import open_staged_writer, open_store


def _committed(root: str, round_no: int, write) -> dict:
    writer = open_staged_writer(root, "p", "s", round_no, 0, 0)
    write(writer)
    store = open_store(root)
    st = store.pipeline("p")
    st.checkpoint(fingerprint="f", parallelism=1, commit_messages=[writer.finish()])
    state = {k: v for _, k, v in st.items("ns")}
    store.close()
    return state


def test_write_all_stages_what_put_and_delete_stage(tmp_path):
    def one_by_one(writer):
        writer.put("ns", b"a", b"1")
        writer.put("ns", b"b", b"2")

    def changes(writer):
        writer.write_all("ns", {b"a": None, b"c": b"3", b"b": b"4"})

    root = str(tmp_path)
    assert _committed(root, 0, one_by_one) == {b"a": b"1", b"b": b"2"}
    assert _committed(root, 1, changes) == {b"b": b"4", b"c": b"3"}


def test_write_all_refuses_a_key_that_is_not_bytes(tmp_path):
    writer = open_staged_writer(str(tmp_path), "p", "s", 0, 0, 0)
    with pytest.raises(TypeError, match="state key must be bytes"):
        writer.write_all("ns", {"k": b"v"})
    with pytest.raises(TypeError, match="must be bytes, got str"):
        writer.write_all("ns", {b"k": "v"})

"""A startpoint a run could not apply is kept, marked failed; setting it again clears that."""

from __future__ import annotations

from sparkbeam.checkpoint import open_store


def test_mark_failed_keeps_the_token_and_set_again_makes_a_fresh_one(tmp_path):
    with open_store(str(tmp_path / "ckpt")) as store:
        sps = store.startpoints
        sp = sps.set("pipeline-1", "Read", "offset", "3", b"a")
        other = sps.set("pipeline-1", "Read", "oldest", None, b"b")
        marked = sps.mark_failed(sp.token, "it broke")
        assert marked is not None and marked.token == sp.token
        assert sps.mark_failed("0000000000000000", "nothing") is None
    with open_store(str(tmp_path / "ckpt"), read_only=True) as store:  # durable
        got = {s.element_key_text: s for s in store.startpoints.list()}
    assert got["a"].failed == "it broke" and got["a"].token == sp.token
    assert got["b"].failed is None and got["b"].token == other.token
    with open_store(str(tmp_path / "ckpt")) as store:
        again = store.startpoints.set("pipeline-1", "Read", "offset", "3", b"a")
        assert again.failed is None and again.token != sp.token
        assert store.startpoints.get("pipeline-1", "Read", b"a").failed is None

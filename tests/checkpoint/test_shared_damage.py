"""One damaged file shared by the newest checkpoints does not lose the pipeline.

Consecutive checkpoints name the same materialization and changelog prefix. Retention keeps,
besides the newest ones, a fallback checkpoint that shares no file with the newest, so
8 flipped bytes in a shared changelog segment or one deleted materialization file leave a
checkpoint to restore; `sparkbeam checkpoints verify` says which one a restart would use.
"""

from __future__ import annotations

import logging

import pytest

from sparkbeam.checkpoint import open_store
from sparkbeam.checkpoint.cli import main as cli
from sparkbeam.checkpoint.layout import pipeline_dir

ROUNDS = 8


def _round(store, st, n: int) -> int:
    """Round ``n``: two tasks stage a change each, the driver one; commit. Round 3 writes a
    materialization, which the checkpoints after it share."""
    if n == 3:
        st.materialize()
    msgs = []
    for p in range(2):
        w = store.staged_writer("p", "stage", n, p, 0)
        w.put("staged", b"s%d" % ((n + p) % 3), b"%d/%d" % (n, p))
        msgs.append(w.finish())
    st.put("driver", b"k%d" % (n % 5), b"%d" % n)
    return st.checkpoint(fingerprint="f", parallelism=2, commit_messages=msgs)


def _model(n: int) -> dict:
    state = {}
    for r in range(1, n + 1):
        for p in range(2):
            state[("staged", b"s%d" % ((r + p) % 3))] = b"%d/%d" % (r, p)
        state[("driver", b"k%d" % (r % 5))] = b"%d" % r
    return state


def _state(st) -> dict:
    return {(ns, k): v for ns, k, v in st.items()}


def _shared_file(store, kind: str) -> str:
    """A file of the given kind that every one of the newest three checkpoints names."""
    newest = [i.checkpoint_id for i in store.list_checkpoints("p")][-3:]
    named = [
        {f.name for f in getattr(store.load_manifest("p", c), kind)} for c in newest
    ]  # fmt: skip
    shared = sorted(set.intersection(*named))
    assert shared, f"the newest checkpoints {newest} share no {kind} file"
    return f"{store.url}/{pipeline_dir('p')}/{shared[0]}"


def _flip_8_bytes(path: str) -> None:
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        middle = len(data) // 2
        data[middle : middle + 8] = bytes(b ^ 0xFF for b in data[middle : middle + 8])
        f.seek(0)
        f.write(data)


def _delete(path: str) -> None:
    import os

    os.remove(path)


@pytest.mark.parametrize(
    "kind, damage",
    [("changelog", _flip_8_bytes), ("materialization", _delete)],
    ids=["flipped-segment", "deleted-materialization"],
)
def test_damaged_shared_file_falls_back_to_a_disjoint_checkpoint(tmp_path, caplog, kind, damage):
    root = str(tmp_path)
    with open_store(root, retain=3) as store:
        st = store.pipeline("p")
        for n in range(1, ROUNDS + 1):
            assert _round(store, st, n) == n
        damage(_shared_file(store, kind))
    with open_store(root, retain=3) as store:
        st = store.pipeline("p")
        with caplog.at_level(logging.WARNING, logger="sparkbeam.checkpoint"):
            info = st.restore(fingerprint="f")
        older = info.checkpoint_id
        assert older < ROUNDS - 2  # not one of the three newest, which share the file
        assert _state(st) == _model(older)
        assert f"Checkpoint {ROUNDS} of pipeline 'p' is unusable" in caplog.text
        # The job goes on from there; its next checkpoint drops the damaged ones and is
        # itself backed by a fallback again.
        for n in range(older + 1, ROUNDS + 1):
            _round(store, st, n)
        assert _state(st) == _model(ROUNDS)
        ids = [i.checkpoint_id for i in store.list_checkpoints("p")]
        assert older in ids and not set(range(older + 1, ROUNDS + 1)) & set(ids)
        assert all(store.verify("p", c).ok for c in ids)
        newest = {f.name for f in store.load_manifest("p", ids[-1]).files}
        assert any(
            newest.isdisjoint(f.name for f in store.load_manifest("p", c).files) for c in ids[:-1]
        )
    with open_store(root, retain=3) as store:
        st = store.pipeline("p")
        assert st.restore(fingerprint="f").checkpoint_id == ids[-1]
        assert _state(st) == _model(ROUNDS)


def test_verify_says_which_checkpoint_a_restart_would_use(tmp_path, capsys):
    root = str(tmp_path)
    with open_store(root, retain=3) as store:
        st = store.pipeline("p")
        for n in range(1, ROUNDS + 1):
            _round(store, st, n)
        _flip_8_bytes(_shared_file(store, "changelog"))
        retained = [i.checkpoint_id for i in store.list_checkpoints("p")]
    assert cli(["checkpoints", "verify", "--checkpoint_dir", root]) == 1
    out = capsys.readouterr().out
    fallback = retained[0]
    assert f"p: a restart would use checkpoint {fallback} (the newest undamaged one)" in out
    assert cli(["checkpoints", "verify", "--checkpoint_dir", root, "--json"]) == 1
    import json

    docs = json.loads(capsys.readouterr().out)
    assert [d["checkpoint_id"] for d in docs if d["restart"]] == [fallback]

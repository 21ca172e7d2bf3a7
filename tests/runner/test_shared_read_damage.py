"""A read another Python worker of the executor left (``shared_reads``) is used only whole.

A changed byte, a cut file or another slot's file reads as none: the worker replays from the
durable store instead, and its read is exact. Real stores; the executor's directory is a
stand-in (``SPARK_LOCAL_DIRS``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sparkbeam.checkpoint import open_store
from sparkbeam.runner.task import shared_reads, staged_state
from tests.runner import test_task_state_reads
from tests.runner.test_task_state_reads import (
    _another_worker,
    _commit,
    _keep,
    _read,
    _stage,
    _value,
)

applied = test_task_state_reads.applied  # a fixture: entries each tail replay applied


@pytest.fixture
def shared(tmp_path, monkeypatch):
    """The executor's shared directory; no read kept or seen in this process before."""
    monkeypatch.setattr(staged_state, "_READS", type(staged_state._READS)())
    monkeypatch.setattr(shared_reads, "_SEEN", {})
    monkeypatch.setattr(shared_reads, "shared_dir", lambda: str(tmp_path / "spark-local"))
    return tmp_path / "spark-local"


def _alter(path, old: bytes, new: bytes) -> None:
    """A changed value in the file, as a bad disk block leaves it (same length)."""
    blob = path.read_bytes()
    assert blob.count(old) == 1 and len(old) == len(new)
    path.write_bytes(blob.replace(old, new))


@pytest.mark.parametrize("damage", ["a changed value", "cut"])
def test_a_damaged_whole_read_is_replayed_from_the_store(tmp_path, shared, replays, damage):
    root = str(tmp_path / "store")
    store = open_store(root)
    _commit(store, root, 0, {b"x": 0})
    first = _commit(store, root, 1, {b"a": 1, b"b": 2})
    second = _commit(store, root, 2, {b"c": 3})
    assert _read(root, first) == {b"x": _value(0), b"a": _value(1), b"b": _value(2)}
    (whole,) = shared.glob("*/whole")
    if damage == "cut":
        whole.write_bytes(whole.read_bytes()[:-20])
    else:
        _alter(whole, _value(2), _value(7))
    _another_worker()
    got = _read(root, second)
    assert got == {b"x": _value(0), b"a": _value(1), b"b": _value(2), b"c": _value(3)}
    assert replays == [first, second]
    store.close()


class _Workers:
    """Two Python workers of one executor, each with what it keeps in memory."""

    def __init__(self) -> None:
        self.kept: dict = {}

    def become(self, worker: str) -> None:
        reads, seen = self.kept.get(worker, ({}, {}))
        staged_state._READS.clear()  # a copy: a read extends its state dict in place
        staged_state._READS.update({k: replace(r, state=dict(r.state)) for k, r in reads.items()})
        shared_reads._SEEN.clear()
        shared_reads._SEEN.update(seen)

    def leave(self, worker: str) -> None:
        self.kept[worker] = (dict(staged_state._READS), dict(shared_reads._SEEN))


@pytest.mark.parametrize("damage", ["a changed value", "cut", "another slot's"])
def test_a_damaged_delta_is_not_applied_the_segment_is_replayed(tmp_path, shared, applied, damage):
    """Round 2 ran here, round 3 on another worker, which left its delta: round 4 here
    replays round 3's segment from the store when that delta is damaged."""
    root = str(tmp_path / "store")
    store = open_store(root)
    _commit(store, root, 0, {b"x": 0})
    checkpoint = _commit(store, root, 1, {b"a": 1})
    workers = _Workers()
    for round_no, worker in ((2, "here"), (3, "other")):
        workers.become(worker)
        state = _read(root, checkpoint)
        message, changes = _stage(root, round_no, {b"r%d" % round_no: round_no})
        _keep(root, state, changes, message)
        workers.leave(worker)
        st = store.pipeline("p")
        checkpoint = st.checkpoint(fingerprint="f", parallelism=1, commit_messages=[message])
    (delta,) = [d for d in shared.glob("*/delta-*") if _value(3) in d.read_bytes()]
    if damage == "cut":
        delta.write_bytes(delta.read_bytes()[:-4])
    elif damage == "a changed value":
        _alter(delta, _value(3), _value(8))
    else:  # the same segment's delta of another namespace, in this slot's place
        segment = message.files[0].name
        shared_reads.save_delta(("another", "slot"), segment, {b"r3": _value(9)})
        other = shared_reads.slot_dir(("another", "slot"))
        delta.write_bytes((shared / other / delta.name).read_bytes())
    workers.become("here")  # kept round 2
    applied.clear()
    expected = {b"x": _value(0), b"a": _value(1), b"r2": _value(2), b"r3": _value(3)}
    assert _read(root, checkpoint) == expected
    assert applied == [1]  # round 3's segment replayed from the store
    store.close()

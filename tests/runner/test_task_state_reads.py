"""A task's state read: only the changelog committed since this process's last read is applied."""

from __future__ import annotations

import math
import os

import pytest

from sparkbeam.checkpoint import (
    CheckpointCorruptError,
    open_staged_writer,
    open_store,
    state_layout,
)
from sparkbeam.checkpoint.layout import pipeline_dir
from sparkbeam.runner.task import staged_state
from sparkbeam.runner.task.grouping import partition_for_key

NS = state_layout.gbk("ref_PCollection_x")


def _value(n: int) -> bytes:
    return state_layout.encode_group(state_layout.GROUP_ON_TIME, n, math.inf, n, b"%d" % n)


def _commit(store, root: str, round_no: int, puts: dict, deletes=()) -> int:
    writer = open_staged_writer(root, "p", "gbk:x", round_no, 0, 0)
    for key, n in puts.items():
        writer.put(NS, key, _value(n))
    for key in deletes:
        writer.delete(NS, key)
    st = store.pipeline("p")
    return st.checkpoint(fingerprint="f", parallelism=1, commit_messages=[writer.finish()])


@pytest.fixture
def replays(monkeypatch):
    """Counts whole-state replays (the real function runs)."""
    calls = []
    real = staged_state.replay

    def counting(*args, **kwargs):
        calls.append(args[2].checkpoint_id)
        return real(*args, **kwargs)

    monkeypatch.setattr(staged_state, "replay", counting)
    monkeypatch.setattr(staged_state, "_READS", type(staged_state._READS)())
    return calls


def test_next_round_applies_only_the_new_changelog(tmp_path, replays):
    root = str(tmp_path)
    store = open_store(root)
    _commit(store, root, 0, {b"x": 0})
    first = _commit(store, root, 1, {b"a": 1, b"b": 2})  # the store rebased its changelog here
    second = _commit(store, root, 2, {b"b": 3, b"c": 4}, deletes=[b"a"])
    third = _commit(store, root, 3, {b"d": 5}, deletes=[b"c", b"x"])

    def read(cid, subtask=0, parallelism=1):
        return staged_state.read_task_state(root, "p", cid, subtask, parallelism, NS)

    assert read(first) == {b"x": _value(0), b"a": _value(1), b"b": _value(2)}
    assert read(second) == {b"x": _value(0), b"b": _value(3), b"c": _value(4)}
    assert read(third) == {b"b": _value(3), b"d": _value(5)}
    assert replays == [first]  # the later reads applied only their new segments
    # An older checkpoint does not extend what was read last: read whole, and right.
    assert read(first) == {b"x": _value(0), b"a": _value(1), b"b": _value(2)}
    assert replays == [first, first]
    # Each key-group range is its own read; two halves make the whole.
    halves = [read(third, subtask, 2) for subtask in (0, 1)]
    assert not halves[0].keys() & halves[1].keys()
    assert {**halves[0], **halves[1]} == read(third)
    store.close()


def test_a_new_materialization_means_a_whole_read(tmp_path, replays):
    root = str(tmp_path)
    store = open_store(root)
    first = _commit(store, root, 0, {b"a": 1})
    assert staged_state.read_task_state(root, "p", first, 0, 1, NS) == {b"a": _value(1)}
    store.pipeline("p").materialize()
    second = _commit(store, root, 1, {b"b": 2})
    manifest = store.load_manifest("p", second)
    assert manifest.materialization  # the test needs the snapshot in the manifest
    got = staged_state.read_task_state(root, "p", second, 0, 1, NS)
    assert got == {b"a": _value(1), b"b": _value(2)}
    assert replays == [first, second]
    store.close()


def test_a_damaged_new_segment_fails_the_read_and_is_not_kept(tmp_path, replays):
    root = str(tmp_path)
    store = open_store(root)
    first = _commit(store, root, 0, {b"a": 1})
    second = _commit(store, root, 1, {b"b": 2})
    assert staged_state.read_task_state(root, "p", first, 0, 1, NS) == {b"a": _value(1)}
    tail = store.load_manifest("p", second).changelog[-1]
    path = tmp_path / pipeline_dir("p") / tail.name
    path.write_bytes(path.read_bytes()[:-3] + b"xyz")
    with pytest.raises(CheckpointCorruptError):
        staged_state.read_task_state(root, "p", second, 0, 1, NS)
    assert not staged_state._READS  # a half-applied read is dropped, not kept
    store.close()


def test_a_read_skips_segments_of_other_key_groups(tmp_path, replays):
    """Each task's segment records the key groups it holds; a reader of others never opens it."""
    root = str(tmp_path)
    store = open_store(root)
    keys = {subtask: [] for subtask in (0, 1)}
    for i in range(200):
        key = b"k%d" % i
        keys[partition_for_key(key, 2, 128)].append(key)
    messages = []
    for subtask in (0, 1):
        writer = open_staged_writer(root, "p", "gbk:x", 0, subtask, 0)
        for key in keys[subtask][:3]:
            writer.put(NS, key, _value(subtask))
        messages.append(writer.finish())
    cid = store.pipeline("p").checkpoint(fingerprint="f", parallelism=2, commit_messages=messages)
    other = [f for f in store.load_manifest("p", cid).changelog if "/p00001-" in f.name]
    assert len(other) == 1 and other[0].kg_start >= 64  # subtask 1 of 2 owns groups 64-127
    os.remove(os.path.join(pipeline_dir_path(root), other[0].name))
    got = staged_state.read_task_state(root, "p", cid, 0, 2, NS)
    assert got == {key: _value(0) for key in keys[0][:3]}
    with pytest.raises(CheckpointCorruptError):
        staged_state.read_task_state(root, "p", cid, 1, 2, NS)
    store.close()


def pipeline_dir_path(root: str) -> str:
    return os.path.join(root, pipeline_dir("p"))


def test_another_worker_of_the_executor_builds_on_the_shared_read(tmp_path, replays, monkeypatch):
    """A round's task may land on another Python worker: it loads the last read the executor's
    workers shared (a file in Spark's local directory) and applies only the new changelog."""
    shared = tmp_path / "spark-local"
    monkeypatch.setattr(staged_state, "_shared_dir", lambda: str(shared))
    root = str(tmp_path / "store")
    store = open_store(root)
    _commit(store, root, 0, {b"x": 0})
    first = _commit(store, root, 1, {b"a": 1, b"b": 2, b"x": 9})  # rebased here (see above)
    second = _commit(store, root, 2, {b"c": 3}, deletes=[b"a", b"x"])

    def read(cid):
        return staged_state.read_task_state(root, "p", cid, 0, 1, NS)

    assert read(first) == {b"a": _value(1), b"b": _value(2), b"x": _value(9)}
    assert replays == [first]
    staged_state._READS.clear()  # another Python worker: nothing read in this process
    assert read(second) == {b"b": _value(2), b"c": _value(3)}
    assert replays == [first]  # built on the shared read: no whole replay
    staged_state._READS.clear()
    assert read(first) == {b"a": _value(1), b"b": _value(2), b"x": _value(9)}  # shared: second
    assert replays == [first, first]  # which the older checkpoint does not extend: whole
    (file,) = shared.glob("*")
    file.write_bytes(b"damaged")
    staged_state._READS.clear()
    assert read(second) == {b"b": _value(2), b"c": _value(3)}  # a bad file: read whole
    assert replays == [first, first, second]
    store.close()


def test_outside_a_spark_task_nothing_is_shared(monkeypatch):
    monkeypatch.delenv("SPARK_LOCAL_DIRS", raising=False)
    assert staged_state._shared_dir() is None
    monkeypatch.setenv("SPARK_LOCAL_DIRS", "/tmp/blockmgr-1,/tmp/blockmgr-2")
    assert staged_state._shared_dir() == "/tmp/blockmgr-1/sparkbeam-state-reads"

"""A task's state read: only the changelog committed since this process's last read is applied."""

from __future__ import annotations

import math
import os
from dataclasses import replace

import pytest

from sparkbeam.checkpoint import (
    CheckpointCorruptError,
    open_staged_writer,
    open_store,
    state_layout,
)
from sparkbeam.checkpoint.layout import pipeline_dir
from sparkbeam.runner.task import shared_reads, staged_state
from sparkbeam.runner.task.grouping import partition_for_key

NS = state_layout.gbk("ref_PCollection_x")


def _value(n: int) -> bytes:
    return state_layout.encode_group(state_layout.GROUP_ON_TIME_FLAT, n, math.inf, n, b"%d" % n)


def _commit(store, root: str, round_no: int, puts: dict, deletes=()) -> int:
    writer = open_staged_writer(root, "p", "gbk:x", round_no, 0, 0)
    for key, n in puts.items():
        writer.put(NS, key, _value(n))
    for key in deletes:
        writer.delete(NS, key)
    st = store.pipeline("p")
    return st.checkpoint(fingerprint="f", parallelism=1, commit_messages=[writer.finish()])


def _spec(root: str, checkpoint_id, parallelism: int = 1, **settings) -> staged_state.StateRound:
    return staged_state.StateRound(
        pipeline="p", url=root, checkpoint_id=checkpoint_id, round_no=0,
        parallelism=parallelism, max_key_groups=128, **settings,
    )  # fmt: skip


def _read(root: str, checkpoint_id, subtask: int = 0, parallelism: int = 1, **settings):
    spec = _spec(root, checkpoint_id, parallelism, **settings)
    return staged_state.read_task_state(spec, subtask, NS)


def test_next_round_applies_only_the_new_changelog(tmp_path, replays):
    root = str(tmp_path)
    store = open_store(root)
    _commit(store, root, 0, {b"x": 0})
    first = _commit(store, root, 1, {b"a": 1, b"b": 2})  # the store rebased its changelog here
    second = _commit(store, root, 2, {b"b": 3, b"c": 4}, deletes=[b"a"])
    third = _commit(store, root, 3, {b"d": 5}, deletes=[b"c", b"x"])

    def read(cid, subtask=0, parallelism=1):
        return _read(root, cid, subtask, parallelism)

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


def _log(store, cid: int):
    """The segments of ``NS`` a checkpoint names after its ranges' snapshots."""
    return [f for _, f in store.load_manifest("p", cid).task_state.namespaces[NS].log]


def test_a_new_snapshot_of_the_range_means_a_whole_read(tmp_path, replays):
    root = str(tmp_path)
    store = open_store(root)
    first = _commit(store, root, 0, {b"a": 1})
    assert _read(root, first, 0, 1) == {b"a": _value(1)}
    writer = open_staged_writer(root, "p", "gbk:x", 1, 0, 0)
    writer.put(NS, b"b", _value(2))
    writer.snapshot(NS, 0, 128, {b"a": _value(1), b"b": _value(2)}.items(), 1 << 20)
    second = store.pipeline("p").checkpoint(
        fingerprint="f", parallelism=1, commit_messages=[writer.finish()]
    )
    (only,) = store.load_manifest("p", second).task_state.namespaces[NS].ranges
    assert only.base and not _log(store, second)  # the snapshot replaced the range's files
    got = _read(root, second, 0, 1)
    assert got == {b"a": _value(1), b"b": _value(2)}
    assert replays == [first, second]
    store.close()


def test_a_damaged_new_segment_fails_the_read_and_is_not_kept(tmp_path, replays):
    root = str(tmp_path)
    store = open_store(root)
    first = _commit(store, root, 0, {b"a": 1})
    second = _commit(store, root, 1, {b"b": 2})
    assert _read(root, first, 0, 1) == {b"a": _value(1)}
    tail = _log(store, second)[-1]
    path = tmp_path / pipeline_dir("p") / tail.name
    path.write_bytes(path.read_bytes()[:-3] + b"xyz")
    with pytest.raises(CheckpointCorruptError):
        _read(root, second, 0, 1)
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
    other = [f for f in _log(store, cid) if "/p00001-" in f.name]
    assert len(other) == 1 and other[0].kg_start >= 64  # subtask 1 of 2 owns groups 64-127
    os.remove(os.path.join(pipeline_dir_path(root), other[0].name))
    got = _read(root, cid, 0, 2)
    assert got == {key: _value(0) for key in keys[0][:3]}
    with pytest.raises(CheckpointCorruptError):
        _read(root, cid, 1, 2)
    store.close()


def _another_worker() -> None:
    """What another Python worker process has: nothing read or shared by it."""
    staged_state._READS.clear()
    shared_reads._SEEN.clear()


def pipeline_dir_path(root: str) -> str:
    return os.path.join(root, pipeline_dir("p"))


def test_another_worker_of_the_executor_builds_on_the_shared_read(tmp_path, replays, monkeypatch):
    """A round's task may land on another Python worker: it loads the last read the executor's
    workers shared (a file in Spark's local directory) and applies only the new changelog."""
    shared = tmp_path / "spark-local"
    monkeypatch.setattr(shared_reads, "shared_dir", lambda: str(shared))
    root = str(tmp_path / "store")
    store = open_store(root)
    _commit(store, root, 0, {b"x": 0})
    first = _commit(store, root, 1, {b"a": 1, b"b": 2, b"x": 9})  # rebased here (see above)
    second = _commit(store, root, 2, {b"c": 3}, deletes=[b"a", b"x"])

    def read(cid):
        return _read(root, cid, 0, 1)

    assert read(first) == {b"a": _value(1), b"b": _value(2), b"x": _value(9)}
    assert replays == [first]
    _another_worker()
    assert read(second) == {b"b": _value(2), b"c": _value(3)}
    assert replays == [first]  # built on the shared read: no whole replay
    _another_worker()
    assert read(first) == {b"a": _value(1), b"b": _value(2), b"x": _value(9)}  # shared: first
    assert replays == [first]  # a whole read is shared, not every read built on it
    (file,) = shared.glob("*/whole")
    file.write_bytes(b"damaged")
    _another_worker()
    assert read(second) == {b"b": _value(2), b"c": _value(3)}  # a bad file: read whole
    assert replays == [first, second]
    store.close()


def test_outside_a_spark_task_nothing_is_shared(monkeypatch):
    monkeypatch.delenv("SPARK_LOCAL_DIRS", raising=False)
    assert shared_reads.shared_dir() is None
    monkeypatch.setenv("SPARK_LOCAL_DIRS", "/tmp/blockmgr-1,/tmp/blockmgr-2")
    assert shared_reads.shared_dir() == "/tmp/blockmgr-1/sparkbeam-state-reads"


@pytest.fixture
def applied(monkeypatch):
    """The number of changelog entries each tail replay applied (the real function runs)."""
    counts = []
    real = staged_state.replay_changelog

    def counting(storage, directory, entries, *args):
        counts.append(len(entries))
        return real(storage, directory, entries, *args)

    monkeypatch.setattr(staged_state, "replay_changelog", counting)
    return counts


def _first_read(tmp_path, puts: dict):
    """A store whose second checkpoint holds ``puts`` (the first: x=0), and its read here."""
    root = str(tmp_path)
    store = open_store(root)
    _commit(store, root, 0, {b"x": 0})
    first = _commit(store, root, 1, puts)  # rebased here (see above)
    return root, store, first, _read(root, first, 0, 1)


def _stage(root: str, round_no: int, puts: dict, deletes=(), attempt: int = 0):
    writer = open_staged_writer(root, "p", "gbk:x", round_no, 0, attempt)
    changes: dict = {}
    for key, n in puts.items():
        writer.put(NS, key, _value(n))
        changes[key] = _value(n)
    for key in deletes:
        writer.delete(NS, key)
        changes[key] = None
    return writer.finish(), changes


def _keep(root: str, state: dict, changes: dict, message) -> None:
    staged_state.keep_staged(_spec(root, None), 0, NS, state, changes, message.files)


def test_the_state_a_task_staged_is_its_next_read_once_committed(
    tmp_path, replays, applied, monkeypatch
):
    """No replay of the task's own changes: the read it kept with them applied is the next
    checkpoint's state when that checkpoint commits this attempt's files."""
    monkeypatch.setattr(shared_reads, "shared_dir", lambda: None)
    root, store, first, state = _first_read(tmp_path, {b"a": 1, b"b": 2})
    message, changes = _stage(root, 2, {b"b": 3, b"c": 4}, deletes=[b"a"])
    _keep(root, state, changes, message)
    second = store.pipeline("p").checkpoint(
        fingerprint="f", parallelism=1, commit_messages=[message]
    )
    applied.clear()
    got = _read(root, second, 0, 1)
    assert got == {b"x": _value(0), b"b": _value(3), b"c": _value(4)}
    assert replays == [first] and applied == []  # nothing replayed: the kept read is it
    store.close()


def test_a_kept_state_of_an_attempt_not_committed_is_not_read(tmp_path, replays, monkeypatch):
    monkeypatch.setattr(shared_reads, "shared_dir", lambda: None)
    root, store, first, state = _first_read(tmp_path, {b"a": 1})
    lost, changes = _stage(root, 2, {b"a": 7, b"lost": 8}, attempt=0)
    _keep(root, state, changes, lost)
    # The same checkpoint read again (a retried task) is not the kept state either.
    assert _read(root, first, 0, 1) == {
        b"x": _value(0),
        b"a": _value(1),
    }
    state = _read(root, first, 0, 1)
    _keep(root, state, changes, lost)
    won, _ = _stage(root, 2, {b"a": 9}, attempt=1)  # the driver committed another attempt
    second = store.pipeline("p").checkpoint(fingerprint="f", parallelism=1, commit_messages=[won])
    got = _read(root, second, 0, 1)
    assert got == {b"x": _value(0), b"a": _value(9)}
    assert replays == [first, first, second]
    store.close()


def test_a_task_without_changes_keeps_its_read(tmp_path, replays, monkeypatch):
    monkeypatch.setattr(shared_reads, "shared_dir", lambda: None)
    root, store, first, state = _first_read(tmp_path, {b"a": 1})
    message, changes = _stage(root, 2, {})
    assert message.files == ()
    _keep(root, state, changes, message)
    second = store.pipeline("p").checkpoint(
        fingerprint="f", parallelism=1, commit_messages=[message]
    )
    assert _read(root, second, 0, 1) == {
        b"x": _value(0),
        b"a": _value(1),
    }
    assert replays == [first]
    store.close()


def test_another_worker_builds_on_the_shared_kept_state(tmp_path, replays, monkeypatch):
    shared = tmp_path / "spark-local"
    monkeypatch.setattr(shared_reads, "shared_dir", lambda: str(shared))
    root = str(tmp_path / "store")
    store = open_store(root)
    _commit(store, root, 0, {b"x": 0})
    first = _commit(store, root, 1, {b"a": 1})
    state = _read(root, first, 0, 1)
    message, changes = _stage(root, 2, {b"b": 2}, deletes=[b"x"])
    _keep(root, state, changes, message)
    second = store.pipeline("p").checkpoint(
        fingerprint="f", parallelism=1, commit_messages=[message]
    )
    _another_worker()
    got = _read(root, second, 0, 1)
    assert got == {b"a": _value(1), b"b": _value(2)}
    assert replays == [first]
    store.close()


def test_a_kept_state_takes_later_rounds_of_its_slot_on_top(tmp_path, replays, monkeypatch):
    """This worker kept round 2; round 3 of the same task ran on another worker: its files
    come after ours in the changelog and are applied on top, without a whole replay."""
    monkeypatch.setattr(shared_reads, "shared_dir", lambda: None)
    root, store, first, state = _first_read(tmp_path, {b"a": 1})
    message, changes = _stage(root, 2, {b"a": 2, b"b": 2})
    _keep(root, state, changes, message)
    store.pipeline("p").checkpoint(fingerprint="f", parallelism=1, commit_messages=[message])
    third = _commit(store, root, 3, {b"b": 3, b"c": 3}, deletes=[b"x"])
    got = _read(root, third, 0, 1)
    assert got == {b"a": _value(2), b"b": _value(3), b"c": _value(3)}
    assert replays == [first]
    store.close()


def test_a_change_ordered_before_the_kept_attempts_files_means_a_whole_read(
    tmp_path, replays, monkeypatch
):
    """Only a stage's own tasks write its namespace; should another file change it before
    this attempt's, the kept state (changes applied in the other order) is not used."""
    monkeypatch.setattr(shared_reads, "shared_dir", lambda: None)
    root, store, first, state = _first_read(tmp_path, {b"a": 1})
    mine, changes = _stage(root, 2, {b"b": 3})
    _keep(root, state, changes, mine)
    other = open_staged_writer(root, "p", "gbk:a", 2, 0, 0)  # commits sort it before "gbk:x"
    other.put(NS, b"b", _value(5))
    st = store.pipeline("p")
    second = st.checkpoint(fingerprint="f", parallelism=1, commit_messages=[mine, other.finish()])
    names = [e.name for e in _log(store, second)]
    assert names.index(mine.files[0].name) > max(i for i, n in enumerate(names) if "gbk%3Aa" in n)
    got = _read(root, second, 0, 1)
    assert got == {b"x": _value(0), b"a": _value(1), b"b": _value(3)}
    assert replays == [first, second]
    store.close()


def test_a_worker_catches_up_from_the_delta_another_worker_left(tmp_path, applied, monkeypatch):
    """Round 2 ran here, round 3 on another worker of the executor: round 4 here applies the
    delta that worker left for round 3's segment instead of replaying the segment."""
    monkeypatch.setattr(staged_state, "_READS", type(staged_state._READS)())
    monkeypatch.setattr(shared_reads, "_SEEN", {})
    monkeypatch.setattr(shared_reads, "shared_dir", lambda: str(tmp_path / "spark-local"))
    root = str(tmp_path / "store")
    store = open_store(root)
    _commit(store, root, 0, {b"x": 0})
    checkpoint = _commit(store, root, 1, {b"a": 1})
    workers: dict = {}  # worker -> (its _READS, its _SEEN)

    def become(worker: str) -> None:
        reads, seen = workers.get(worker, ({}, {}))
        staged_state._READS.clear()  # a copy: a read extends its state dict in place
        staged_state._READS.update({k: replace(r, state=dict(r.state)) for k, r in reads.items()})
        shared_reads._SEEN.clear()
        shared_reads._SEEN.update(seen)

    for round_no, worker in ((2, "here"), (3, "other")):
        become(worker)
        state = _read(root, checkpoint, 0, 1)
        message, changes = _stage(root, round_no, {b"r%d" % round_no: round_no})
        _keep(root, state, changes, message)
        workers[worker] = (dict(staged_state._READS), dict(shared_reads._SEEN))
        st = store.pipeline("p")
        checkpoint = st.checkpoint(fingerprint="f", parallelism=1, commit_messages=[message])
    expected = {b"x": _value(0), b"a": _value(1), b"r2": _value(2), b"r3": _value(3)}
    become("here")  # kept round 2
    applied.clear()
    assert _read(root, checkpoint, 0, 1) == expected
    assert applied == []  # round 3's changes came from the other worker's delta
    for delta in (tmp_path / "spark-local").glob("*/delta-*"):
        delta.unlink()
    become("here")
    assert _read(root, checkpoint, 0, 1) == expected
    assert applied == [1]  # without it: round 3's segment replayed
    store.close()

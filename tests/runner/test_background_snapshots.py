"""A grown range's snapshot is written in the background and committed by a later round."""

from __future__ import annotations

import os
import threading

import pytest

from sparkbeam.checkpoint import commit, open_staged_writer, open_store, task_state
from sparkbeam.checkpoint.keygroups import KeyGroupRange
from sparkbeam.checkpoint.layout import pipeline_dir
from sparkbeam.checkpoint.task_state import Due, NamespaceState
from sparkbeam.runner.task import background_snapshots, staged_state
from sparkbeam.runner.task.task_range import TaskRange, finish
from tests.runner.test_task_state_reads import NS, _spec, _value


@pytest.fixture
def store(tmp_path, executor_dir, monkeypatch):
    """A store whose ranges are due a snapshot after 2 tail segments (overdue after 4)."""
    monkeypatch.setattr(task_state, "_segments_due", lambda start: 2)
    root = str(tmp_path / "store")
    with open_store(root) as store:
        yield store


def _run_round(store, cid, round_no: int, changes: dict, attempt: int = 0, stage=True):
    """One task of a keyed round as the runner runs it: read, stage, maybe snapshot, keep."""
    root = store.storage.root
    task_range = TaskRange(_spec(root, cid), 0, NS)
    writer = open_staged_writer(root, "p", "gbk:x", round_no, 0, attempt)
    keys = len({**task_range.stored, **changes})
    for key, value in changes.items():
        task_range.put(key, value)
    if stage:
        task_range.stage(writer, keys)
    else:  # its segment only: no count, no snapshot reported
        writer.write_all(NS, changes)
    return finish(writer, task_range)


def _commit(store, message) -> int:
    return store.pipeline("p").checkpoint(fingerprint="f", parallelism=1, commit_messages=[message])


def _finish_background() -> None:
    for thread in threading.enumerate():
        if thread.name.startswith("sparkbeam-snapshot"):
            thread.join(30)


def _range(store, cid: int):
    (only,) = store.load_manifest("p", cid).task_state.namespaces[NS].ranges
    return only


def _stored(store, cid: int, monkeypatch) -> dict:
    """The range as a task on another executor reads it: from the store alone."""
    staged_state._READS.clear()
    monkeypatch.setenv("SPARK_LOCAL_DIRS", os.environ["SPARK_LOCAL_DIRS"] + "-elsewhere")
    return dict(staged_state.read_task_state(_spec(store.storage.root, cid), 0, NS))


def _values(n: int, start: int = 0) -> dict:
    return {b"k%04d" % i: _value(i) for i in range(start, start + n)}


def _settled(store) -> int:
    """Rounds 0-4, 101 keys: the second checkpoint asks for a snapshot (the fallback
    guarantee), the third writes it in the round, two more make the range's tail due."""
    cid = _commit(store, _run_round(store, None, 0, _values(50)))
    cid = _commit(store, _run_round(store, cid, 1, _values(50, 50)))
    message = _run_round(store, cid, 2, {})
    (snapshot,) = message.snapshots
    assert snapshot.since is None
    cid = _commit(store, message)
    assert not _range(store, cid).since < 0 and not _log(store, cid)
    cid = _commit(store, _run_round(store, cid, 3, {b"k0000": None, **_values(1, 100)}))
    return _commit(store, _run_round(store, cid, 4, _values(1, 150)))


def _log(store, cid: int) -> list:
    return list(store.load_manifest("p", cid).task_state.namespaces[NS].log)


def test_a_grown_range_is_snapshotted_in_the_background_and_a_later_round_commits_it(
    store, monkeypatch
):
    cid = _settled(store)  # a tail of two segments: due
    message = _run_round(store, cid, 5, _values(1, 200))
    assert message.snapshots == ()  # not in the round
    cid = _commit(store, message)
    _finish_background()
    message = _run_round(store, cid, 6, _values(1, 300))
    (late,) = message.snapshots
    cid = _commit(store, message)
    (range_,) = store.load_manifest("p", cid).task_state.namespaces[NS].ranges
    assert range_.base == late.files and late.entries == 102  # round 5's state
    assert range_.since == late.since and range_.checkpoint == cid
    assert [f.name for _, f in _log(store, cid)] == [f.name for f in message.files]
    assert all(seq > late.since for seq, _ in _log(store, cid))  # round 6's is the tail
    added = (100, 150, 200, 300)
    expected = {**_values(100), **{k: v for n in added for k, v in _values(1, n).items()}}
    del expected[b"k0000"]
    assert _stored(store, cid, monkeypatch) == expected


def test_a_snapshot_of_an_attempt_that_did_not_commit_is_dropped(store):
    cid = _settled(store)
    _run_round(store, cid, 5, _values(1, 200), attempt=0)  # starts a background snapshot
    _finish_background()
    other = _run_round(store, cid, 5, _values(1, 400), attempt=1, stage=False)
    cid = _commit(store, other)  # the other attempt's changes are the round's
    message = _run_round(store, cid, 6, _values(1, 300))
    assert message.snapshots == ()  # attempt 0's state is not the committed one
    _commit(store, message)
    _finish_background()


def test_a_snapshot_not_committed_within_its_rounds_is_dropped_and_swept(store, monkeypatch):
    monkeypatch.setattr(background_snapshots, "WITHIN_ROUNDS", 2)
    monkeypatch.setattr(commit, "SWEEP_EVERY", 1)
    cid = _commit(store, _run_round(store, _settled(store), 5, _values(1, 200)))
    _finish_background()
    directory = os.path.join(store.storage.root, pipeline_dir("p"))

    def late_files() -> set[str]:
        return {name for _, _, names in os.walk(directory) for name in names if "-late-" in name}

    made = late_files()
    assert made
    for round_no in (6, 7):  # the rounds run where the snapshot is not (another executor)
        cid = _commit(store, _run_round(store, cid, round_no, _values(1, round_no), stage=False))
    message = _run_round(store, cid, 8, _values(1, 800))
    assert all(s.since is None for s in message.snapshots)  # too late: not reported
    _commit(store, message)
    _finish_background()
    assert not made & late_files()


def test_an_overdue_range_is_snapshotted_in_the_round(store, monkeypatch):
    monkeypatch.setattr(background_snapshots, "start", lambda *args: True)  # never comes back
    cid = _settled(store)
    for round_no in (5, 6):  # a tail of 2, then 3: due, "started"
        message = _run_round(store, cid, round_no, _values(1, 100 * round_no))
        assert message.snapshots == ()
        cid = _commit(store, message)
    message = _run_round(store, cid, 7, _values(1, 700))  # a tail of 4: overdue
    (snapshot,) = message.snapshots
    assert snapshot.since is None and snapshot.entries == 104


def test_a_late_snapshot_behind_a_later_base_is_ignored_by_the_commit():
    state = NamespaceState.empty(128).append([])
    newer = state.rebase(0, 128, (), 5, checkpoint=3, since=10)
    assert newer.rebase(0, 64, (), 7, checkpoint=4, since=8) == newer
    assert newer.rebase(0, 64, (), 7, checkpoint=4, since=11).ranges[0].since == 11
    assert newer.snapshot_due(KeyGroupRange(0, 128)) is None
    assert newer.request_snapshots(4).snapshot_due(KeyGroupRange(0, 64)) is Due.REQUESTED


def test_a_snapshot_is_matched_by_file_names_not_by_round():
    """A restore that abandoned the made round reruns it with new segments under the same
    stage, round and attempt: a snapshot of the abandoned ones does not hold that state."""
    from sparkbeam.checkpoint.ids import FileEntry
    from sparkbeam.checkpoint.task_state import TaskSnapshot

    def segment(name: str) -> FileEntry:
        return FileEntry(f"staged/s/r00000005/p00000-a000-{name}.seg", 10, "crc32:0", 1, 0, 128)

    groups = KeyGroupRange(0, 128)
    made = background_snapshots._Made(
        TaskSnapshot(NS, 0, 128, (), 3), 5, frozenset(), frozenset({segment("old").name})
    )
    rerun = NamespaceState.empty(128).append([segment("new")])
    assert background_snapshots._as_of_log(made, rerun, groups, 6) is None
    committed = NamespaceState.empty(128).append([segment("old"), segment("later")])
    held = background_snapshots._as_of_log(made, committed, groups, 6)
    assert held is not None and held.since == 0  # the later segment stays in the tail
    foreign = NamespaceState.empty(128).append([segment("other"), segment("old")])
    assert background_snapshots._as_of_log(made, foreign, groups, 6) is None

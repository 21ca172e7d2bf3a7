"""A task's key-group range (`task_range.TaskRange`): read, changed, staged, kept for next round.

A stateful stage stages two ranges (cells and timers) into one writer: each is kept with its
own changes, so the next round reads neither from the store again, whether or not both
changed. Real store, real writer; the Spark task context is not needed (no shared reads).
"""

from __future__ import annotations

import pytest

from sparkbeam.checkpoint import open_staged_writer, open_store, state_layout
from sparkbeam.runner.task import shared_reads, staged_state
from sparkbeam.runner.task.staged_state import StateRound
from sparkbeam.runner.task.task_range import TaskRange, finish

CELLS, TIMERS = state_layout.user_state("s"), state_layout.user_timers("s")


def _cells(n: int) -> bytes:
    return state_layout.encode_user_state({b"cell": b"%d" % n})


def _timers(n: int) -> bytes:
    summary = state_layout.TimerSummary(1, n, n, state_layout.NO_TIME)
    return state_layout.encode_user_timers([("t", "f", b"%d" % n)], summary)


def _spec(root: str, checkpoint_id: int | None) -> StateRound:
    return StateRound(
        pipeline="p", url=root, checkpoint_id=checkpoint_id, round_no=checkpoint_id or 0,
        parallelism=1, max_key_groups=128,
    )  # fmt: skip


def _round(root: str, store, checkpoint_id: int | None, cells: dict, timers: dict) -> int:
    """One stateful task of subtask 0 of 1: its two ranges changed, staged into one writer,
    finished, kept; then the driver's commit. Returns the checkpoint."""
    spec = _spec(root, checkpoint_id)
    ranges = [TaskRange(spec, 0, CELLS), TaskRange(spec, 0, TIMERS)]
    writer = open_staged_writer(root, "p", "s", spec.round_no, 0, 0, max_key_groups=128)
    for task_range, changes in zip(ranges, (cells, timers)):
        for key, value in changes.items():
            if value is None:
                task_range.delete(key)
            else:
                task_range.put(key, value)
        task_range.stage(writer)
    message = finish(writer, *ranges)
    st = store.pipeline("p")
    return st.checkpoint(fingerprint="f", parallelism=1, commit_messages=[message])


@pytest.fixture
def applied(monkeypatch):
    """The changelog entries each tail replay of a read applied (the real function runs)."""
    counts: list[int] = []
    real = staged_state.replay_changelog

    def counting(storage, directory, entries, *args):
        counts.append(len(entries))
        return real(storage, directory, entries, *args)

    monkeypatch.setattr(staged_state, "replay_changelog", counting)
    monkeypatch.setattr(shared_reads, "shared_dir", lambda: None)
    return counts


@pytest.mark.parametrize("timers_change", [True, False])
def test_two_ranges_in_one_writer_are_each_kept_with_their_changes(
    tmp_path, replays, applied, timers_change
):
    root = str(tmp_path)
    store = open_store(root)
    first = _round(root, store, None, {b"a": _cells(1), b"b": _cells(2)}, {b"a": _timers(1)})
    timers = {b"a": None, b"b": _timers(2)} if timers_change else {}
    second = _round(root, store, first, {b"a": _cells(3), b"c": _cells(4)}, timers)
    assert replays == [first, first]  # the first round's reads: whole
    applied.clear()
    spec = _spec(root, second)
    cells, timer_range = TaskRange(spec, 0, CELLS), TaskRange(spec, 0, TIMERS)
    assert dict(cells.stored) == {b"a": _cells(3), b"b": _cells(2), b"c": _cells(4)}
    expected = {b"b": _timers(2)} if timers_change else {b"a": _timers(1)}
    assert dict(timer_range.stored) == expected
    assert replays == [first, first] and applied == []  # nothing read again: both kept
    store.close()


def test_a_range_stages_what_it_holds_after_its_changes(tmp_path):
    spec = _spec(str(tmp_path), None)
    task_range = TaskRange(spec, 0, CELLS, {b"a": _cells(1), b"b": _cells(2)})
    task_range.put(b"c", _cells(3))
    task_range.delete(b"c")  # put and deleted in one round: nothing to stage
    task_range.delete(b"a")
    task_range.put(b"b", _cells(5))
    key = task_range.new_key(b"row")
    assert key.startswith(b"row\x00") and key != task_range.new_key(b"row")
    task_range.put(key, _cells(6))
    assert task_range.changes == {b"a": None, b"b": _cells(5), key: _cells(6)}
    assert task_range.get(b"a") is None and task_range.get(b"b") == _cells(5)
    assert dict(task_range.items()) == {b"b": _cells(5), key: _cells(6)}
    assert task_range.held() == 2

"""A key-group range larger than the worker's memory budget is held on the executor's disk.

Real stores and a real RocksDB under a stand-in Spark local directory (``SPARK_LOCAL_DIRS``,
as an executor's Python worker sees it); the reads are the ones tasks make."""

from __future__ import annotations

import glob
import os
import shutil

import pytest

from sparkbeam.checkpoint import open_store
from sparkbeam.checkpoint.task_state import Due, NamespaceState
from sparkbeam.runner.task import held_state, shared_reads, staged_state, task_range
from tests.runner.test_task_state_reads import NS, _commit, _read, _spec, _stage, _value

BUDGET = 2_000  # bytes: a few dozen of the test's entries


def _puts(n: int, start: int = 0) -> dict:
    return {b"key-%05d" % i: i for i in range(start, start + n)}


def _expected(puts: dict, deletes=()) -> dict:
    return {k: _value(n) for k, n in puts.items() if k not in deletes}


def _store(tmp_path):
    root = str(tmp_path / "store")
    return root, open_store(root)


def test_a_range_past_the_budget_is_read_from_disk_and_equals_the_dict(
    tmp_path, executor_dir, replays
):
    root, store = _store(tmp_path)
    puts = _puts(300)
    first = _commit(store, root, 0, puts)
    small = _read(root, first)  # the default budget: in memory
    assert type(small) is dict
    staged_state._READS.clear()
    state = _read(root, first, memory_bytes=BUDGET)
    assert isinstance(state, held_state.SpilledState)
    assert dict(state.items()) == small == _expected(puts)
    assert len(state) == 300 and b"key-00007" in state and state.get(b"nope") is None
    assert not staged_state._READS  # nothing of it kept in the worker's memory
    assert any(executor_dir.rglob("CURRENT"))  # a RocksDB under the executor's directory
    held_state.release()
    assert not state.is_open
    store.close()


def test_the_next_round_extends_the_range_on_disk(tmp_path, executor_dir, replays):
    """A later checkpoint applies only its new segment to the database (any worker of the
    executor opens it: this one closed it when its task ended)."""
    root, store = _store(tmp_path)
    first = _commit(store, root, 0, _puts(300))
    _read(root, first, memory_bytes=BUDGET)
    held_state.release()
    second = _commit(store, root, 1, _puts(5, start=400), deletes=[b"key-00003"])
    state = _read(root, second, memory_bytes=BUDGET)
    expected = {**_expected(_puts(300), [b"key-00003"]), **_expected(_puts(5, start=400))}
    assert dict(state.items()) == expected and len(state) == 304
    assert replays == [first]  # the second read extended the first
    held_state.release()
    store.close()


def test_what_a_task_staged_is_kept_on_disk_for_the_checkpoint_that_commits_it(
    tmp_path, executor_dir, replays
):
    root, store = _store(tmp_path)
    first = _commit(store, root, 0, _puts(300))
    state = _read(root, first, memory_bytes=BUDGET)
    message, changes = _stage(root, 1, {b"key-00001": 7, b"new": 8}, deletes=[b"key-00002"])
    staged_state.keep_staged(_spec(root, first), 0, NS, state, changes, message.files)
    held_state.release()
    second = store.pipeline("p").checkpoint(
        fingerprint="f", parallelism=1, commit_messages=[message]
    )
    got = _read(root, second, memory_bytes=BUDGET)
    expected = _expected(_puts(300), [b"key-00002"])
    expected.update({b"key-00001": _value(7), b"new": _value(8)})
    assert dict(got.items()) == expected
    assert replays == [first]
    held_state.release()
    store.close()


def test_a_worker_killed_while_changing_the_range_leaves_a_whole_read(
    tmp_path, executor_dir, replays
):
    """The identity goes before the first change: a half-changed database is never built on."""
    root, store = _store(tmp_path)
    first = _commit(store, root, 0, _puts(300))
    state = _read(root, first, memory_bytes=BUDGET)
    state.put(b"key-00001", b"half-applied")  # then the worker dies: no claim written
    held_state.release()
    second = _commit(store, root, 1, _puts(1, start=500))
    got = _read(root, second, memory_bytes=BUDGET)
    assert dict(got.items()) == {**_expected(_puts(300)), **_expected(_puts(1, start=500))}
    assert replays == [first, second]
    held_state.release()
    store.close()


def test_a_second_worker_takes_another_directory_while_the_first_holds_the_range(
    tmp_path, executor_dir, replays
):
    root, store = _store(tmp_path)
    first = _commit(store, root, 0, _puts(300))
    held = _read(root, first, memory_bytes=BUDGET)
    other = held_state.open_spilled(_slot(root), BUDGET)  # as another worker would
    assert other is not None and other.path != held.path
    other.close()
    held_state.release()
    store.close()


def _slot(root: str) -> tuple:
    return (root, "p", NS, 0, 128)


def test_a_range_past_the_budget_is_snapshotted_in_parts(tmp_path, executor_dir, monkeypatch):
    """A snapshot streams the range from disk into files of a quarter of the budget each,
    and reads back as the state."""
    root, store = _store(tmp_path)
    first = _commit(store, root, 0, _puts(300))
    spec = _spec(root, first, memory_bytes=BUDGET)
    state = staged_state.read_task_state(spec, 0, NS)
    monkeypatch.setattr(NamespaceState, "snapshot_due", lambda *args: Due.REQUESTED)
    writer = _writer(root)
    changes = {b"key-00004": None, b"extra": _value(9)}
    kept = task_range.TaskRange(spec, 0, NS, stored=state)
    kept.changes = changes
    kept.stage(writer, 300)
    message = writer.finish()
    held_state.release()
    snapshot = store.pipeline("p").checkpoint(
        fingerprint="f", parallelism=1, commit_messages=[message]
    )
    chains = store.load_manifest("p", snapshot).task_state.namespaces[NS]
    files = chains.files()
    sizes = [f.size for f in files if "snap-" in f.name]
    assert len(sizes) > 10 and max(sizes) < 4 * BUDGET
    staged_state._READS.clear()
    expected = {**_expected(_puts(300), [b"key-00004"]), b"extra": _value(9)}
    assert _read(root, snapshot) == expected
    store.close()


def _writer(root: str):
    from sparkbeam.checkpoint import open_staged_writer

    return open_staged_writer(root, "p", "gbk:x", 1, 0, 0)


def test_outside_an_executor_a_large_range_stays_in_memory(tmp_path, monkeypatch):
    """No Spark local directory (the driver, a unit test): nothing to spill to."""
    monkeypatch.delenv("SPARK_LOCAL_DIRS", raising=False)
    assert shared_reads.shared_dir() is None
    root, store = _store(tmp_path)
    first = _commit(store, root, 0, _puts(300))
    assert _read(root, first, memory_bytes=BUDGET) == _expected(_puts(300))
    assert not os.path.exists(tmp_path / "blockmgr")
    store.close()


def test_a_stage_done_with_its_range_leaves_another_stages_range_open(tmp_path, executor_dir):
    """One Spark task may run a GroupByKey and the SDF stage it feeds: the first to finish
    closes only its own range."""
    root, store = _store(tmp_path)
    first = _commit(store, root, 0, _puts(300))
    mine = _read(root, first, memory_bytes=BUDGET)
    other = held_state.open_spilled(("another", "range"), BUDGET)
    held_state.release(mine)
    assert not mine.is_open and other.is_open and len(other) == 0
    held_state.release(other)
    store.close()


def _held(root: str, first: int) -> str:
    """Read the range past the budget (so it is held on disk) and close it: its directory."""
    state = _read(root, first, memory_bytes=BUDGET)
    assert isinstance(state, held_state.SpilledState)
    held_state.release()
    return state.path


def test_a_deleted_directory_is_not_trusted_the_range_is_replayed(tmp_path, executor_dir, replays):
    """A /tmp cleaner or a lost disk takes the database, not what lies beside it: the next
    read opens a new database, which claims nothing, and replays the range."""
    root, store = _store(tmp_path)
    first = _commit(store, root, 0, _puts(300))
    shutil.rmtree(_held(root, first))
    second = _commit(store, root, 1, _puts(1, start=500))
    got = _read(root, second, memory_bytes=BUDGET)
    assert dict(got.items()) == {**_expected(_puts(300)), **_expected(_puts(1, start=500))}
    assert len(got) == 301 and replays == [first, second]
    held_state.release()
    store.close()


def test_a_directory_replaced_by_another_ranges_is_not_trusted(tmp_path, executor_dir, replays):
    """Two subtasks' ranges swap directories: each claims the other's range, so neither read
    builds on it."""
    root, store = _store(tmp_path)
    first = _commit(store, root, 0, _puts(600))
    paths = [_held_range(root, first, subtask) for subtask in (0, 1)]
    shutil.move(paths[0], paths[0] + ".moved")
    shutil.move(paths[1], paths[0])
    shutil.move(paths[0] + ".moved", paths[1])
    for subtask in (0, 1):
        got = _read(root, first, subtask, 2, memory_bytes=BUDGET)
        assert dict(got.items()) == _read(root, first, subtask, 2)  # the default budget: a dict
        held_state.release()
    assert replays == [first] * 6
    store.close()


def _held_range(root: str, first: int, subtask: int) -> str:
    state = _read(root, first, subtask, 2, memory_bytes=BUDGET)
    assert isinstance(state, held_state.SpilledState)
    held_state.release()
    return state.path


def test_a_directory_with_tables_missing_is_made_anew_and_replayed(
    tmp_path, executor_dir, replays, caplog
):
    root, store = _store(tmp_path)
    first = _commit(store, root, 0, _puts(300))
    path = _held(root, first)
    (table, *_) = sorted(glob.glob(os.path.join(path, "*.sst")))
    os.remove(table)
    got = _read(root, first, memory_bytes=BUDGET)
    assert dict(got.items()) == _expected(_puts(300)) and replays == [first, first]
    assert f"replaying the range held at {path} from the store" in caplog.text
    held_state.release()
    store.close()


def test_a_directory_deleted_while_a_task_holds_it_is_replayed_next(
    tmp_path, executor_dir, replays
):
    """The task goes on with the open database (its files are gone from the directory); its
    claim goes with them, so the next read replays."""
    root, store = _store(tmp_path)
    first = _commit(store, root, 0, _puts(300))
    state = _read(root, first, memory_bytes=BUDGET)
    shutil.rmtree(state.path)
    message, changes = _stage(root, 1, {b"key-00001": 7}, deletes=[b"key-00002"])
    staged_state.keep_staged(_spec(root, first), 0, NS, state, changes, message.files)
    held_state.release()
    second = store.pipeline("p").checkpoint(
        fingerprint="f", parallelism=1, commit_messages=[message]
    )
    got = _read(root, second, memory_bytes=BUDGET)
    expected = {**_expected(_puts(300), [b"key-00002"]), b"key-00001": _value(7)}
    assert dict(got.items()) == expected and replays == [first, second]
    held_state.release()
    store.close()


def _rot(path: str) -> None:
    """Flip a byte in every 4 KB of the database's largest table (of records, not its
    claim's), as a failing disk does."""
    for table in sorted(glob.glob(os.path.join(path, "*.sst")), key=os.path.getsize)[-1:]:
        with open(table, "r+b") as f:
            blob = bytearray(f.read())
            for at in range(100, len(blob), 4096):
                blob[at] ^= 0xFF
            f.seek(0)
            f.write(blob)


def test_a_damaged_table_fails_the_task_by_name_and_its_retry_replays(
    tmp_path, executor_dir, replays
):
    """RocksDB's iterator ends early, silently, at a damaged block: the read counts what it
    yields against the claim, removes the database and fails; the next read replays."""
    root, store = _store(tmp_path)
    first = _commit(store, root, 0, _puts(300))
    path = _held(root, first)
    _rot(path)
    state = _read(root, first, memory_bytes=BUDGET)  # built on the claim: nothing read yet
    with pytest.raises(held_state.SpilledStateError, match="failed and is removed"):
        dict(state.items())
    assert not os.path.exists(path)
    held_state.release()
    got = _read(root, first, memory_bytes=BUDGET)
    assert dict(got.items()) == _expected(_puts(300)) and replays == [first, first]
    held_state.release()
    store.close()

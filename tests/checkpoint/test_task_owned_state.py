"""Task-owned state: the driver's commit takes handles, never bytes (`checkpoint.task_state`).

GroupByKey buffers, user state and timers are written, snapshotted and read by the tasks that
own their key groups. The driver's commit appends the files a task names to the namespace's
log, takes its snapshots and counts, and reads none of them; restore reads none of them either.
A reader of some key groups reads the ranges that overlap them: base, then tail.
"""

from __future__ import annotations

import os

import pytest

from sparkbeam.checkpoint import key_group_range, open_store, state_layout
from sparkbeam.checkpoint.keygroups import key_group
from sparkbeam.checkpoint.task_state import Due

NS = state_layout.gbk("ref_PCollection_x")
FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures")


class Reads:
    """Paths a storage object read (the real reads run)."""

    def __init__(self, storage, monkeypatch):
        self.paths: list[str] = []
        self.bytes = 0  # whole files and ranges
        real, real_range = storage.read, storage.read_range

        def read(path, *args, **kwargs):
            self.paths.append(path)
            data = real(path, *args, **kwargs)
            self.bytes += len(data)
            return data

        def read_range(path, offset, length):
            self.paths.append(path)
            data = real_range(path, offset, length)
            self.bytes += len(data)
            return data

        monkeypatch.setattr(storage, "read", read)
        monkeypatch.setattr(storage, "read_range", read_range)

    def staged(self) -> list[str]:
        return [p for p in self.paths if "/staged/" in p]


def _keys_by_subtask(parallelism: int, n: int = 400) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {i: [] for i in range(parallelism)}
    for i in range(n):
        key = b"key-%d" % i
        for sub in range(parallelism):
            if key_group(key, 128) in key_group_range(sub, parallelism, 128):
                out[sub].append(key)
    return out


def _round(store, round_no: int, state: dict, changes_by_sub: dict, parallelism: int, snap=()):
    """One round of ``parallelism`` GroupByKey tasks staging their changes (None: delete)."""
    messages = []
    for sub, changes in changes_by_sub.items():
        writer = store.staged_writer("p", "gbk:x", round_no, sub, 0)
        groups = key_group_range(sub, parallelism, 128)
        for key, value in changes.items():
            if value is None:
                writer.delete(NS, key)
                state.pop(key, None)
            else:
                writer.put(NS, key, value)
                state[key] = value
        mine = {k: v for k, v in state.items() if key_group(k, 128) in groups}
        if sub in snap:
            writer.snapshot(NS, groups.start, groups.stop, mine.items(), 1 << 20)
        else:
            writer.count(NS, groups.start, groups.stop, len(mine))
        messages.append(writer.finish())
    st = store.pipeline("p")
    return st.checkpoint(fingerprint="f", parallelism=parallelism, commit_messages=messages)


def _read(store, cid, sub: int, parallelism: int) -> dict[bytes, bytes]:
    return {k: v for ns, k, v in store.read_subtask_state("p", cid, sub, parallelism) if ns == NS}


def _value(n: int) -> bytes:
    return bytes([state_layout.V1]) + b"v%d" % n


def test_a_commit_and_a_restore_read_no_task_owned_file_on_the_driver(tmp_path, monkeypatch):
    root = str(tmp_path)
    keys = _keys_by_subtask(2)
    state: dict[bytes, bytes] = {}
    with open_store(root) as store:
        reads = Reads(store.storage, monkeypatch)
        st = store.pipeline("p")
        st.put(state_layout.SINK_PENDING, b"r", b"\x01driver")  # the driver's own state
        for rnd in range(4):
            changes = {
                sub: {k: _value(rnd) for k in keys[sub][rnd * 10 : rnd * 10 + 30]} for sub in (0, 1)
            }
            changes[0][keys[0][0]] = None if rnd == 3 else changes[0].get(keys[0][0], _value(9))
            cid = _round(store, rnd, state, changes, 2)
        assert reads.staged() == []  # four commits: no staged byte read by the driver
        assert {ns for ns, _, _ in st.items()} == {state_layout.SINK_PENDING}
        assert len(st) == 1 + len(state)  # counted from the tasks' reports
        assert store.load_manifest("p", cid).entries == 1 + len(state)
        with pytest.raises(ValueError, match="task-owned"):
            st.put(NS, b"k", _value(0))
    with open_store(root) as store:
        reads = Reads(store.storage, monkeypatch)
        st = store.pipeline("p")
        assert st.restore(fingerprint="f").checkpoint_id == cid
        assert reads.staged() == []  # a restore reads the driver's files and the manifest
        assert NS in st.namespaces() and len(st) == 1 + len(state)
    with open_store(root, read_only=True) as store:
        for parallelism in (1, 2, 4):  # any parallelism reads exactly its own key groups
            got: dict[bytes, bytes] = {}
            for sub in range(parallelism):
                part = _read(store, cid, sub, parallelism)
                groups = key_group_range(sub, parallelism, 128)
                assert all(key_group(k, 128) in groups for k in part)
                got.update(part)
            assert got == state


def test_a_snapshot_replaces_its_range_and_the_log_drops_what_no_range_reads(tmp_path):
    root = str(tmp_path)
    keys = _keys_by_subtask(2)
    state: dict[bytes, bytes] = {}
    with open_store(root) as store:
        for rnd in range(3):
            changes = {sub: {k: _value(rnd) for k in keys[sub][: 5 + rnd]} for sub in (0, 1)}
            _round(store, rnd, state, changes, 2)
        changes = {0: {keys[0][0]: None, keys[0][50]: _value(7)}, 1: {keys[1][1]: _value(8)}}
        cid = _round(store, 3, state, changes, 2, snap={0})
        chains = store.load_manifest("p", cid).task_state.namespaces[NS]
        low, high = chains.ranges
        assert (low.start, low.stop, len(low.base), low.checkpoint) == (0, 64, 1, cid)
        assert (high.start, high.stop, high.base) == (64, 128, ())
        assert all(f.kg_start >= 64 for _, f in chains.log)  # subtask 0's segments are gone
        assert (low.entries, high.entries) == (
            sum(key_group(k, 128) < 64 for k in state),
            sum(key_group(k, 128) >= 64 for k in state),
        )
        for parallelism in (1, 3):  # a rescaled reader splits the ranges as it needs
            got: dict[bytes, bytes] = {}
            for sub in range(parallelism):
                got.update(_read(store, cid, sub, parallelism))
            assert got == state
        # After a rescale to 4, a snapshot of subtask 1 (32..64) splits the low range.
        changes = {1: {keys[0][60]: _value(11)}}
        cid = _round(store, 4, state, changes, 4, snap={1})
        ranges = store.load_manifest("p", cid).task_state.namespaces[NS].ranges
        assert [(r.start, r.stop) for r in ranges] == [(0, 32), (32, 64), (64, 128)]
        got = {}
        for sub in range(2):
            got.update(_read(store, cid, sub, 2))
        assert got == state


def test_a_fallback_asks_the_tasks_to_snapshot_then_shares_no_file(tmp_path):
    root = str(tmp_path)
    keys = _keys_by_subtask(2)
    state: dict[bytes, bytes] = {}
    with open_store(root) as store:
        st = store.pipeline("p")
        st.put(state_layout.SINK_PENDING, b"r", b"\x01driver")
        first = _round(store, 0, state, {s: {k: _value(0) for k in keys[s][:5]} for s in (0, 1)}, 2)
        second = _round(store, 1, state, {0: {keys[0][9]: _value(1)}, 1: {}}, 2)
        chains = store.load_manifest("p", second).task_state.namespaces[NS]
        assert chains.snapshots_pending  # shared with the first: the tasks are asked
        assert chains.snapshot_due(key_group_range(1, 2, 128)) is Due.REQUESTED
        third = _round(store, 2, state, {0: {}, 1: {}}, 2, snap={0, 1})
        files = {
            cid: {f.name for f in store.load_manifest("p", cid).files} for cid in (second, third)
        }
        assert files[third].isdisjoint(files[second])  # the second is the third's fallback
        assert not store.load_manifest("p", third).task_state.namespaces[NS].snapshots_pending
        assert first < second
        got: dict[bytes, bytes] = {}
        for sub in range(2):
            got.update(_read(store, third, sub, 2))
        assert got == state


@pytest.mark.parametrize("before, after", [(2, 4), (4, 2), (2, 3)])
def test_a_restore_at_another_parallelism_reads_only_its_own_key_groups(
    tmp_path, monkeypatch, before, after
):
    """A large range's snapshot is split by key-group sub-range: the tasks of a restore at
    another parallelism read, in all, about the live state once (before: each half of a
    range read its whole snapshot, 2x at 2 -> 4)."""
    from sparkbeam.checkpoint import staging

    monkeypatch.setattr(staging, "SPLIT_BYTES", 20_000)  # ranges of ~100 KB split
    store = open_store(str(tmp_path))
    state: dict = {}
    by_sub = _keys_by_subtask(before, n=2_000)
    changes = {
        s: {k: _value(i) + bytes(40) for i, k in enumerate(keys)} for s, keys in by_sub.items()
    }
    cid = _round(store, 0, state, changes, before, snap=range(before))
    files = list(store.load_manifest("p", cid).task_state.namespaces[NS].files())
    snapshot_bytes = sum(f.size for f in files if "snap-" in f.name)
    assert len(files) > before  # split by key groups
    reads = Reads(store.storage, monkeypatch)
    got: dict = {}
    for sub in range(after):
        got.update(_read(store, cid, sub, after))
    assert got == state
    read_bytes = sum(os.path.getsize(tmp_path / p) for p in reads.paths if "snap-" in p)
    assert read_bytes <= 1.2 * snapshot_bytes
    store.close()


@pytest.mark.parametrize("before, after", [(2, 4), (4, 2), (2, 3)])
def test_a_restore_at_another_parallelism_reads_each_tail_once(
    tmp_path, monkeypatch, before, after
):
    """The changelog tails too: a segment is written in key-group blocks, so the tasks of a
    restore at another parallelism read, in all, about each tail once (before: every task
    that overlapped a range read its whole tail, twice at 2 -> 4)."""
    from sparkbeam.checkpoint import staging

    monkeypatch.setattr(staging, "SPLIT_BYTES", 20_000)  # the snapshots split too
    store = open_store(str(tmp_path))
    state: dict = {}
    by_sub = _keys_by_subtask(before, n=3_000)
    for rnd in range(3):  # a snapshot, then two rounds that change every key (the tails)
        changes = {s: {k: _value(0) + os.urandom(200) for k in ks} for s, ks in by_sub.items()}
        cid = _round(store, rnd, state, changes, before, snap=range(before) if rnd == 0 else ())
    ns_state = store.load_manifest("p", cid).task_state.namespaces[NS]
    store.close()
    stored = sum(f.size for f in ns_state.files())
    assert sum(f.size for _, f in ns_state.log) > stored / 2  # the tails are most of it
    got: dict = {}
    read = 0
    for sub in range(after):  # each task its own store object (executors share no cache)
        with open_store(str(tmp_path), read_only=True) as task_store:
            reads = Reads(task_store.storage, monkeypatch)
            got.update(_read(task_store, cid, sub, after))
            read += reads.bytes
    assert got == state
    assert read <= 1.2 * stored, (read, stored)


def test_an_empty_range_of_a_finished_stage_does_not_hold_the_fallback_back(tmp_path):
    """A namespace whose ranges hold nothing (a finished SDF stage's drained residuals) has no
    task left to answer the commit's request for new snapshots; the commit drops such a
    range's empty snapshot files itself, so the driver's own state gets its fallback: a
    checkpoint sharing no file with a retained one."""
    store = open_store(str(tmp_path))
    first = _round(store, 0, {}, {0: {}, 1: {}}, 2, snap=range(2))  # empty snapshots
    assert all(r.base for r in store.load_manifest("p", first).task_state.namespaces[NS].ranges)
    st = store.pipeline("p")
    for i in range(6):  # the driver's own changes only: no task of the stage runs again
        st.put(state_layout.SINK_PENDING, b"k%d" % i, b"\x01v")
        cid = st.checkpoint(fingerprint="f", parallelism=2, commit_messages=[])
    last = store.load_manifest("p", cid)
    assert not last.task_state.namespaces[NS].snapshots_pending
    assert not any(r.base for r in last.task_state.namespaces[NS].ranges)
    names = {f.name for f in last.files} | {f.name for f in last.task_state.files()}
    retained = [c.checkpoint_id for c in store.list_checkpoints("p")][:-1]
    assert any(
        not names & ({f.name for f in m.files} | {f.name for f in m.task_state.files()})
        for m in (store.load_manifest("p", c) for c in retained)
    )
    assert _read(store, cid, 0, 2) == {} and _read(store, cid, 1, 3) == {}
    store.close()


def test_the_fallback_is_refreshed_when_a_range_never_changes_again(tmp_path, monkeypatch):
    """A range without traffic keeps its snapshot file for ever; the checkpoint before that
    snapshot was then the only one sharing no file with the newest, kept as the fallback for
    the rest of the job (a restore to it replaying all the input since). The fallback is
    refreshed once older than `retention.FALLBACK_MAX_INTERVALS` materialization intervals."""
    from types import SimpleNamespace

    from sparkbeam.checkpoint import commit, retention

    clock = [1_000.0]
    monkeypatch.setattr(
        commit, "time", SimpleNamespace(time=lambda: clock[0], monotonic=lambda: 0.0)
    )
    interval, step = 60.0, 20.0
    keys = _keys_by_subtask(2)
    state: dict[bytes, bytes] = {}
    store = open_store(str(tmp_path), materialization_interval_s=interval)
    store.pipeline("p").put(state_layout.SINK_PENDING, b"r", b"\x01driver")
    cid = _round(store, 0, state, {s: {k: _value(0) for k in keys[s][:5]} for s in (0, 1)}, 2)
    for rnd in range(1, 40):  # only subtask 0's keys change; each task answers a request
        clock[0] += step
        chains = store.load_manifest("p", cid).task_state.namespaces[NS]
        asked = {
            s for s in (0, 1) if chains.snapshot_due(key_group_range(s, 2, 128)) is Due.REQUESTED
        }
        cid = _round(store, rnd, state, {0: {keys[0][rnd % 9]: _value(rnd)}, 1: {}}, 2, asked)
    kept = [store.load_manifest("p", c.checkpoint_id) for c in store.list_checkpoints("p")]
    newest = kept[-1]
    names = lambda m: {f.name for f in m.files} | {f.name for f in m.task_state.files()}  # noqa: E731
    fallbacks = [m for m in kept[:-1] if names(m).isdisjoint(names(newest))]
    assert fallbacks, "no retained checkpoint shares no file with the newest"
    age = newest.created - max(m.created for m in fallbacks)
    assert age <= retention.FALLBACK_MAX_INTERVALS * interval + 3 * step, (
        f"the fallback is {age:.0f} s older than the newest checkpoint "
        f"({[m.checkpoint_id for m in kept]})"
    )
    for sub in range(2):
        assert _read(store, cid, sub, 2) == {
            k: v for k, v in state.items() if key_group(k, 128) in key_group_range(sub, 2, 128)
        }
    store.close()

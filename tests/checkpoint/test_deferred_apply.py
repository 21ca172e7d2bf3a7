"""A task's staged changes to one namespace, with their entry count, are applied by the driver
only when it reads that namespace, counts or snapshots the state: not on the commit's path."""

from __future__ import annotations

import pytest

from sparkbeam.checkpoint import open_staged_writer, open_store
from sparkbeam.checkpoint import pipeline as pipeline_module


@pytest.fixture
def parsed(monkeypatch):
    """Records the driver parsed out of staged segments (the real parser runs)."""
    seen = []
    real = pipeline_module.iter_records

    def counting(data, path, *args):
        for record in real(data, path, *args):
            seen.append(record[3])
            yield record

    monkeypatch.setattr(pipeline_module, "iter_records", counting)
    return seen


def _stage(root, round_no, puts, deletes=(), delta=None, ns="gbk/x", partition=0):
    writer = open_staged_writer(root, "p", "gbk:x", round_no, partition, 0)
    for key, value in puts.items():
        writer.put(ns, key, value)
    for key in deletes:
        writer.delete(ns, key)
    return writer.finish(delta)


def test_counted_changes_wait_until_their_namespace_is_read(tmp_path, parsed):
    root = str(tmp_path)
    store = open_store(root)
    st = store.pipeline("p")
    st.put("driver", b"d", b"1")
    for _ in range(2):  # the second checkpoint of a pipeline compacts its state (a fallback)
        st.checkpoint(fingerprint="f", parallelism=1)
    first = _stage(root, 0, {b"a": b"1", b"b": b"1"}, delta=2)
    cid = st.checkpoint(fingerprint="f", parallelism=1, commit_messages=[first])
    second = _stage(root, 1, {b"b": b"2", b"c": b"2"}, deletes=[b"a"], delta=0)
    st.checkpoint(fingerprint="f", parallelism=1, commit_messages=[second])
    assert parsed == []  # two commits, nothing parsed
    assert len(st) == 3 and store.load_manifest("p", cid).entries == 3
    assert dict((k, v) for _, k, v in st.items("driver")) == {b"d": b"1"}
    assert parsed == []  # another namespace: still nothing
    assert st.get("gbk/x", b"b") == b"2"
    assert sorted(parsed) == [b"a", b"a", b"b", b"b", b"c"]  # both rounds, in order
    assert dict((k, v) for _, k, v in st.items("gbk/x")) == {b"b": b"2", b"c": b"2"}
    assert len(st) == 3
    store.close()


def test_a_driver_change_after_a_deferred_one_wins(tmp_path, parsed):
    root = str(tmp_path)
    store = open_store(root)
    st = store.pipeline("p")
    staged = _stage(root, 0, {b"k": b"task"}, delta=1)
    st.checkpoint(fingerprint="f", parallelism=1, commit_messages=[staged])
    st.put("gbk/x", b"k", b"driver")
    cid = st.checkpoint(fingerprint="f", parallelism=1)
    assert st.get("gbk/x", b"k") == b"driver"
    store.close()
    again = open_store(root).pipeline("p")
    again.restore(cid)
    assert again.get("gbk/x", b"k") == b"driver"


def test_a_materialization_holds_the_deferred_changes(tmp_path, parsed):
    root = str(tmp_path)
    store = open_store(root)
    st = store.pipeline("p")
    staged = _stage(root, 0, {b"k1": b"v1", b"k2": b"v2"}, delta=2)
    st.checkpoint(fingerprint="f", parallelism=1, commit_messages=[staged])
    st.materialize()
    cid = st.checkpoint(fingerprint="f", parallelism=1)
    assert store.load_manifest("p", cid).materialization
    store.close()
    again = open_store(root).pipeline("p")
    again.restore(cid)
    assert dict((k, v) for _, k, v in again.items("gbk/x")) == {b"k1": b"v1", b"k2": b"v2"}


def test_changes_without_a_count_or_to_two_namespaces_are_applied_at_once(tmp_path, parsed):
    root = str(tmp_path)
    store = open_store(root)
    st = store.pipeline("p")
    uncounted = _stage(root, 0, {b"u": b"1"})
    writer = open_staged_writer(root, "p", "two", 0, 0, 0)
    writer.put("one", b"x", b"1")
    writer.put("other", b"y", b"1")
    two = writer.finish(2)
    assert two.namespaces == {"one", "other"}
    st.checkpoint(fingerprint="f", parallelism=1, commit_messages=[uncounted, two])
    assert sorted(parsed) == [b"u", b"x", b"y"]
    store.close()

"""Restoring at another parallelism: each subtask gets exactly its key groups, nothing twice."""

from __future__ import annotations

import pytest

from sparkbeam.checkpoint import MemoryStorage, key_group, key_group_range, open_store

MAX_KG = 64


def _fill(st, n=2000):
    model = {}
    for i in range(n):
        ns = "stage%d/state" % (i % 3)
        st.put(ns, b"elem-%d" % i, b"value-%d" % i)
        model[(ns, b"elem-%d" % i)] = b"value-%d" % i
    return model


def _split(store, pid, cid, p, max_kg=MAX_KG):
    parts = []
    for sub in range(p):
        rng = key_group_range(sub, p, max_kg)
        part = {}
        for ns, k, v in store.read_subtask_state(pid, cid, sub, p):
            assert key_group(k, max_kg) in rng
            part[(ns, k)] = v
        parts.append(part)
    return parts


def _assert_partition(parts, model):
    union = {}
    for part in parts:
        overlap = union.keys() & part.keys()
        assert not overlap, f"keys in two subtasks: {sorted(overlap)[:3]}"
        union.update(part)
    assert union == model


@pytest.mark.parametrize("chain", [(2, 4), (4, 2), (3, 5, 1), (1, 7), (64, 3), (5, 64)])
def test_rescale_chain(tmp_path, chain):
    """Write at P, read each subtask's share at P', write it back through a new pipeline
    store as a job at P' would, checkpoint, and go on to the next parallelism."""
    store = open_store(str(tmp_path / "s"), max_key_groups=MAX_KG, materialization_files=4)
    st = store.pipeline("p")
    model = _fill(st)
    st.materialize()
    for i in range(0, 2000, 11):  # changelog on top of the materialization
        st.put("stage0/state", b"elem-%d" % i, b"changed")
        model[("stage0/state", b"elem-%d" % i)] = b"changed"
    cid = st.checkpoint(fingerprint="f", parallelism=chain[0])
    for p_new in chain[1:]:
        parts = _split(store, "p", cid, p_new)
        _assert_partition(parts, model)
        # The job at p_new writes every subtask's state back (staged, as tasks would).
        msgs = []
        for sub, part in enumerate(parts):
            w = store.staged_writer("p", "restore", cid, sub, 0)
            for (ns, k), v in part.items():
                w.put(ns, k, v)
            msgs.append(w.finish())
        st.close()
        st = store.pipeline("p")
        cid = st.checkpoint(fingerprint="f", parallelism=p_new, commit_messages=msgs)
    _assert_partition(_split(store, "p", cid, chain[-1]), model)
    store.close()


def test_restore_on_driver_after_rescale_keeps_every_key(tmp_path):
    with open_store(str(tmp_path), max_key_groups=8) as store:
        st = store.pipeline("p")
        model = _fill(st, 500)
        cid = st.checkpoint(parallelism=2)
    with open_store(str(tmp_path), max_key_groups=128) as store:
        st = store.pipeline("p")
        st.restore()
        assert st.max_key_groups == 8, "a pipeline keeps the max_key_groups of its checkpoints"
        assert {(ns, k): v for ns, k, v in st.items()} == model
        _assert_partition(_split(store, "p", cid, 8, max_kg=8), model)


class CountingStorage(MemoryStorage):
    def __init__(self):
        super().__init__()
        self.reads: dict[str, int] = {}

    def read(self, path):
        self.reads[path] = self.reads.get(path, 0) + 1
        return super().read(path)


def test_restoring_many_subtasks_reads_each_changelog_segment_once():
    storage = CountingStorage()
    with open_store(storage, max_key_groups=MAX_KG, flush_bytes=2000) as store:
        st = store.pipeline("p")
        model = _fill(st, 300)
        cid = st.checkpoint(parallelism=1)
        segments = [f.name for f in store.load_manifest("p", cid).changelog]
        assert len(segments) > 3
        _assert_partition(_split(store, "p", cid, 8), model)
        counts = {p: n for p, n in storage.reads.items() if p.endswith(".seg")}
        assert sorted(counts) == sorted(f"pipelines/p/{name}" for name in segments)
        assert set(counts.values()) == {1}

"""Conformance checks every backend must pass (zict's ``check_mapping`` style).

`check_storage` for `Storage` backends, `check_state_table` for state-table backends,
`check_store` for a whole `CheckpointStore` over some storage and state backend.
"""

from __future__ import annotations

from sparkbeam.checkpoint import (
    CheckpointStore,
    KeyGroupRange,
    StateTable,
    Storage,
    key_group,
)


def check_storage(storage: Storage) -> None:
    assert storage.list() == []
    assert not storage.exists("a/b.bin")
    storage.write("a/b.bin", b"hello")
    storage.write("a/c/d.bin", b"x" * 1000)
    storage.write("top.bin", b"")
    assert storage.read("a/b.bin") == b"hello"
    assert storage.exists("a/b.bin") and storage.size("a/c/d.bin") == 1000
    storage.write("a/r.bin", bytes(range(200)))
    assert storage.read_range("a/r.bin", 10, 5) == bytes(range(10, 15))
    assert storage.read_range("a/r.bin", 190, 50) == bytes(range(190, 200))  # to the end
    storage.delete("a/r.bin")
    assert storage.read("top.bin") == b""
    storage.write("a/b.bin", b"replaced")
    assert storage.read("a/b.bin") == b"replaced"
    assert storage.list() == ["a/b.bin", "a/c/d.bin", "top.bin"]
    assert storage.list("a") == ["a/b.bin", "a/c/d.bin"]
    assert storage.list("a/c") == ["a/c/d.bin"]
    assert storage.list("missing") == []
    assert storage.mtime("a/b.bin") > 0
    assert storage.create_exclusive("lock", b"1")
    assert not storage.create_exclusive("lock", b"2")
    assert storage.read("lock") == b"1"
    storage.delete("lock")
    storage.delete("lock")  # absent: ignored
    assert not storage.exists("lock")
    try:
        storage.read("nope")
    except FileNotFoundError:
        pass
    else:
        raise AssertionError("reading a missing file must raise FileNotFoundError")
    assert storage.bytes_written >= len(b"hello") + 1000 + len(b"replaced")
    for p in storage.list():
        storage.delete(p)
    assert storage.list() == []


def check_state_table(table: StateTable) -> None:
    m = table.max_key_groups
    assert len(table) == 0 and table.get("a", b"k") is None
    model = {}
    for i in range(300):
        ns = "ns%d" % (i % 3)
        key = b"key-%d" % i
        table.put(ns, key, b"v%d" % i)
        model[(ns, key)] = b"v%d" % i
    table.put("ns0", b"key-0", b"new")
    model[("ns0", b"key-0")] = b"new"
    for i in range(0, 300, 7):
        ns = "ns%d" % (i % 3)
        table.delete(ns, b"key-%d" % i)
        model.pop((ns, b"key-%d" % i), None)
    table.delete("ns0", b"never-there")
    table.put("", b"", b"")  # empty namespace, key and value are legal
    model[("", b"")] = b""
    assert len(table) == len(model)
    assert {(ns, k): v for ns, k, v in table.items()} == model
    for (ns, k), v in model.items():
        assert table.get(ns, k) == v
    assert {k for _ns, k, _v in table.items("ns1")} == {k for ns, k in model if ns == "ns1"}
    rng = KeyGroupRange(m // 4, m // 2)
    got = {(ns, k) for ns, k, _ in table.items(key_groups=rng)}
    assert got == {(ns, k) for ns, k in model if key_group(k, m) in rng}
    for kg, ns, k, v in table.snapshot():
        assert kg == key_group(k, m) and model[(ns, k)] == v
    table.clear()
    assert len(table) == 0 and list(table.items()) == []
    table.put("a", b"k", b"v")
    assert table.get("a", b"k") == b"v"


def check_store(store: CheckpointStore) -> None:
    """Checkpoint, mutate, restore, rescale and list through the public API."""
    st = store.pipeline("conf")
    model = {}
    for i in range(200):
        st.put("s", b"%d" % i, b"v%d" % i)
        model[("s", b"%d" % i)] = b"v%d" % i
    st.mark_completed("input-a")
    st.set_source_position("src", b"\x00\xff")
    c1 = st.checkpoint(fingerprint="fp", parallelism=2, metadata={"round": 1})
    st.materialize()
    for i in range(0, 200, 3):
        st.delete("s", b"%d" % i)
        model.pop(("s", b"%d" % i))
    st.put("t", b"x", b"y")
    model[("t", b"x")] = b"y"
    c2 = st.checkpoint(fingerprint="fp", parallelism=2)
    assert c2 == c1 + 1
    st.put("s", b"uncommitted", b"lost")
    st.close()
    st = store.pipeline("conf")
    info = st.restore(fingerprint="fp")
    assert info is not None and info.checkpoint_id == c2 and info.entries == len(model)
    assert {(ns, k): v for ns, k, v in st.items()} == model
    assert st.completed() == {"input-a"} and st.source_positions() == {"src": b"\x00\xff"}
    st.restore(c1)
    assert len(st) == 200
    for p in (1, 3):
        union = {}
        for sub in range(p):
            for ns, k, v in store.read_subtask_state("conf", c2, sub, p):
                assert (ns, k) not in union
                union[(ns, k)] = v
        assert union == model
    assert "conf" in store.list_pipelines()
    assert [i.checkpoint_id for i in store.list_checkpoints("conf")][-2:] == [c1, c2]
    assert store.verify("conf", c2).ok
    st.close()

"""Every storage, state-table and store backend passes the same conformance checks."""

from __future__ import annotations

import pytest
from checkpoint_conformance import check_state_table, check_storage, check_store

from sparkbeam.checkpoint import (
    FileSystemsStorage,
    LocalStorage,
    MemoryStorage,
    make_state_table,
    open_storage,
    open_store,
)


@pytest.fixture(params=["memory", "local", "file-url", "beam-filesystems"])
def storage(request, tmp_path):
    if request.param == "memory":
        return MemoryStorage()
    if request.param == "local":
        return LocalStorage(str(tmp_path / "root"))
    if request.param == "file-url":
        return open_storage(f"file://{tmp_path}/root")
    pytest.importorskip("apache_beam")
    return FileSystemsStorage(str(tmp_path / "root"))


def test_storage_conformance(storage):
    check_storage(storage)


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@pytest.mark.parametrize("max_key_groups", [1, 16, 128])
def test_state_table_conformance(backend, max_key_groups):
    table = make_state_table(backend, max_key_groups)
    try:
        check_state_table(table)
    finally:
        table.close()


@pytest.mark.parametrize(
    "where,backend",
    [
        ("memory", "memory"),
        ("local", "memory"),
        ("local", "rocksdb"),
        ("memory", "rocksdb"),
        ("beam-filesystems", "memory"),
    ],
)
def test_store_conformance(where, backend, tmp_path):
    url = MemoryStorage() if where == "memory" else str(tmp_path / "store")
    if where == "beam-filesystems":
        pytest.importorskip("apache_beam")
        url = FileSystemsStorage(str(tmp_path / "store"))
    with open_store(url, state_backend=backend, max_key_groups=32, retain=5) as store:
        check_store(store)


def test_open_storage_picks_backend(tmp_path):
    assert isinstance(open_storage(str(tmp_path)), LocalStorage)
    assert isinstance(open_storage(f"file://{tmp_path}"), LocalStorage)
    assert isinstance(open_storage("memory://x"), MemoryStorage)
    assert isinstance(open_storage("gs://bucket/dir"), FileSystemsStorage)


def test_memory_urls_share_files():
    a, b = open_storage("memory://shared-test"), open_storage("memory://shared-test")
    a.write("f", b"1")
    assert b.read("f") == b"1"
    a.delete("f")


def test_local_storage_leaves_no_temp_files(tmp_path):
    s = LocalStorage(str(tmp_path))
    for i in range(5):
        s.write("d/f", b"%d" % i)
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["f"]

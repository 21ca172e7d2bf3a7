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


def test_exclusive_create_without_hard_links_writes_every_byte(tmp_path, monkeypatch):
    """Where the filesystem has no hard links, an exclusive create writes the file in place:
    all of it, though ``os.write`` may take part of the data per call (a signal, a full pipe
    buffer, over 2 GB); a failed write leaves no half file under the name."""
    import errno
    import os

    def no_links(src, dst):
        raise OSError(errno.EPERM, "no hard links here")

    real_write = os.write
    monkeypatch.setattr(os, "link", no_links)
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:1000])))
    s = LocalStorage(str(tmp_path))
    data = bytes(range(256)) * 40
    assert s.create_exclusive("d/f", data) is True
    assert s.read("d/f") == data
    assert s.create_exclusive("d/f", b"other") is False

    def failing(fd, data):
        raise OSError(errno.ENOSPC, "disk full")

    monkeypatch.setattr(os, "write", failing)
    with pytest.raises(OSError, match="disk full"):
        s.create_exclusive("d/g", data)
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["f"]

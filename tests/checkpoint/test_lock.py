"""The store lock when its file is damaged: an empty or garbage ``_LOCK.json`` (a crash between
creating and writing it) is a lock of an unknown holder that ``break_lock`` clears, and the lock
file is written atomically, so a crash can no longer leave an empty one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from sparkbeam.checkpoint import StoreLockedError, open_store
from sparkbeam.checkpoint.cli import main as cli
from sparkbeam.checkpoint.filesystem import LocalStorage
from sparkbeam.checkpoint.lock import LOCK_FILE, read_lock

DAMAGED = [b"", b'{"host": "build-7", "pi', b"\x00\x00\x00\x00", b"[1, 2]", b"null"]


@pytest.mark.parametrize("content", DAMAGED, ids=["empty", "torn", "zeros", "list", "null"])
def test_unreadable_lock_is_refused_clearly_and_break_lock_clears_it(tmp_path, content):
    (tmp_path / LOCK_FILE).write_bytes(content)
    with pytest.raises(
        StoreLockedError,
        match=r"is locked by an unreadable lock file '_LOCK\.json' .*empty or not a lock.*"
        r"break_lock=True \(CLI: --break_lock; pipeline option --break_lock\)",
    ):
        open_store(str(tmp_path), job_name="second")
    with open_store(str(tmp_path), job_name="operator", break_lock=True) as store:
        assert read_lock(store.storage)["job_name"] == "operator"
    assert not (tmp_path / LOCK_FILE).exists()  # released on close
    open_store(str(tmp_path)).close()  # and the store is usable again


def test_cli_break_lock_clears_an_empty_lock(tmp_path, capsys):
    (tmp_path / LOCK_FILE).write_bytes(b"")
    assert cli(["checkpoints", "clean", "--checkpoint_dir", str(tmp_path)]) == 2
    assert "unreadable lock file" in capsys.readouterr().err
    assert cli(["checkpoints", "clean", "--checkpoint_dir", str(tmp_path), "--break_lock"]) == 0
    assert not (tmp_path / LOCK_FILE).exists()


# The writer dies inside create_exclusive, between creating the file and writing its bytes.
CRASH_IN_CREATE = """
import os, signal, sys
from sparkbeam.checkpoint import open_store
os.write = lambda fd, data: os.kill(os.getpid(), signal.SIGKILL)
open_store(sys.argv[1], job_name="doomed")
"""


def test_crash_while_taking_the_lock_leaves_no_lock_behind(tmp_path):
    proc = subprocess.run([sys.executable, "-c", CRASH_IN_CREATE, str(tmp_path)], timeout=120)
    assert proc.returncode == -signal.SIGKILL
    lock = tmp_path / LOCK_FILE
    assert not lock.exists() or json.loads(lock.read_bytes())["job_name"] == "doomed"
    open_store(str(tmp_path), job_name="next").close()  # not blocked by a half-written lock


def test_create_exclusive_failing_midway_leaves_nothing(tmp_path, monkeypatch):
    storage = LocalStorage(str(tmp_path))

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        storage.create_exclusive(LOCK_FILE, b'{"job_name": "x"}')
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []  # neither the lock nor its temp file
    assert storage.create_exclusive(LOCK_FILE, b"1") and not storage.create_exclusive(
        LOCK_FILE, b"2"
    )
    assert storage.read(LOCK_FILE) == b"1"

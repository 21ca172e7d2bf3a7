"""A pipeline that committed checkpoints but whose manifests are gone is refused, not restarted
fresh (a fresh start would publish its output a second time); a first commit cut short (data
files, never a manifest) still starts fresh. `checkpoints verify` exits non-zero whenever it
says a restart fails."""

from __future__ import annotations

import glob
import os

import pytest

from sparkbeam.checkpoint import CheckpointCorruptError, open_store
from sparkbeam.checkpoint.cli import main
from sparkbeam.checkpoint.layout import pipeline_dir


def _committed(root: str, pid: str = "orders") -> None:
    with open_store(root, max_key_groups=16) as store:
        st = store.pipeline(pid)
        for i in range(20):
            st.put("n", b"%d" % i, b"v")
        w = store.staged_writer(pid, "stage", 1, 0, 0)
        w.put("n", b"staged", b"z")
        st.checkpoint(fingerprint="fp", commit_messages=[w.finish()])
        st.put("n", b"x", b"y")
        st.checkpoint(fingerprint="fp")


def _delete_manifests(root: str, pid: str = "orders") -> None:
    manifests = glob.glob(os.path.join(root, pipeline_dir(pid), "manifests", "chk-*.json"))
    assert manifests
    for path in manifests:
        os.remove(path)


def test_restore_refuses_a_pipeline_whose_manifests_were_deleted(tmp_path):
    root = str(tmp_path / "store")
    _committed(root)
    _delete_manifests(root)
    with open_store(root) as store:
        with pytest.raises(CheckpointCorruptError) as info:
            store.pipeline("orders").restore(fingerprint="fp")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"Pipeline 'orders' committed checkpoints in store {root!r}")
    assert f"{root}/{pipeline_dir('orders')}" in message  # the directory
    assert "no manifest" in message and "publish its output a second time" in message
    assert "restore the manifests from a backup" in message and "new --checkpoint_dir" in message


def test_a_first_commit_cut_short_starts_fresh(tmp_path):
    """Staged and changelog files of a first checkpoint whose manifest was never written."""
    root = str(tmp_path / "store")
    with open_store(root, max_key_groups=16) as store:
        st = store.pipeline("orders")
        st.put("n", b"k", b"v")
        st.log.flush()
        w = store.staged_writer("orders", "stage", 1, 0, 0)
        w.put("n", b"staged", b"z")
        w.finish()  # never committed: the job died in its first commit
    with open_store(root) as store:
        assert store.pipeline("orders").restore(fingerprint="fp") is None
    assert main(["checkpoints", "verify", "--checkpoint_dir", root]) == 0


def test_verify_exits_non_zero_whenever_it_says_a_restart_fails(tmp_path, capsys):
    root = str(tmp_path / "store")
    _committed(root, "orders")
    _committed(root, "clicks")
    assert main(["checkpoints", "verify", "--checkpoint_dir", root]) == 0
    capsys.readouterr()
    _delete_manifests(root, "orders")
    assert main(["checkpoints", "verify", "--checkpoint_dir", root]) == 1
    out = capsys.readouterr().out
    assert "orders: committed checkpoints, but no manifest is left: a restart fails" in out
    assert "clicks: a restart would use checkpoint 2" in out
    assert main(["checkpoints", "verify", "--checkpoint_dir", root, "--json"]) == 1

"""Two-phase commit across task attempts, retention, cleaning, and the store lock."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest

from sparkbeam.checkpoint import (
    CommitStatus,
    IncompatibleCheckpointError,
    StoreLockedError,
    open_staged_writer,
    open_store,
)
from sparkbeam.checkpoint.layout import pipeline_dir


def _state(st):
    return {(ns, k): v for ns, k, v in st.items()}


def test_only_named_attempts_are_committed_and_clean_removes_the_rest(tmp_path):
    root = str(tmp_path)
    store = open_store(root)
    st = store.pipeline("p")
    st.put("driver", b"k", b"v")
    msgs = {}
    for partition in range(3):
        for attempt in range(2):  # every task runs twice (speculation / retry)
            w = open_staged_writer(root, "p", "stage-a", 7, partition, attempt)
            w.put("s", b"part-%d" % partition, b"attempt-%d" % attempt)
            w.mark_completed(f"split-{partition}")
            w.set_source_position(f"src-{partition}", b"%d" % attempt)
            msgs[(partition, attempt)] = pickle.loads(pickle.dumps(w.finish()))
    # An attempt that never finished left a partial file behind.
    open_staged_writer(root, "p", "stage-a", 7, 2, 9).put("s", b"x", b"y")
    chosen = [msgs[(0, 1)], msgs[(1, 0)], msgs[(2, 1)]]
    cid = st.checkpoint(fingerprint="f", parallelism=3, commit_messages=chosen)
    assert st.status is CommitStatus.COMMITTED
    expected = {
        ("driver", b"k"): b"v",
        ("s", b"part-0"): b"attempt-1",
        ("s", b"part-1"): b"attempt-0",
        ("s", b"part-2"): b"attempt-1",
    }
    assert _state(st) == expected
    assert st.completed() == {"split-0", "split-1", "split-2"}
    manifest = store.load_manifest("p", cid)
    assert manifest.commits == (("stage-a", 7, 0, 1), ("stage-a", 7, 1, 0), ("stage-a", 7, 2, 1))
    staged_named = {f.name for f in manifest.changelog if f.name.startswith("staged/")}
    assert staged_named == {f.name for m in chosen for f in m.files}
    deleted = store.clean(grace_s=1e9)
    losers = {f.name for key in [(0, 0), (1, 1), (2, 0)] for f in msgs[key].files}
    assert {p.split("/", 2)[2] for p in deleted} == losers
    # Committing the same message again is a no-op; another attempt of it is refused.
    st.checkpoint(fingerprint="f", commit_messages=[msgs[(0, 1)]])
    with pytest.raises(ValueError, match=r"Two attempts \[0, 1\] of stage 'stage-a' round 7"):
        st.checkpoint(fingerprint="f", commit_messages=[msgs[(0, 0)]])
    assert st.status is CommitStatus.ABORTED
    store.close()
    with open_store(root) as store:
        st = store.pipeline("p")
        st.restore()
        assert _state(st) == expected


def test_two_messages_for_one_partition_are_refused(tmp_path):
    with open_store(str(tmp_path)) as store:
        st = store.pipeline("p")
        a = store.staged_writer("p", "s", 1, 0, 0).finish()
        b = store.staged_writer("p", "s", 1, 0, 1).finish()
        with pytest.raises(ValueError, match="exactly one commit message per"):
            st.checkpoint(commit_messages=[a, b])
        assert st.status is CommitStatus.ABORTED
        assert store.list_checkpoints("p") == []


def test_damaged_staged_file_aborts_without_applying_anything(tmp_path):
    with open_store(str(tmp_path)) as store:
        st = store.pipeline("p")
        good = store.staged_writer("p", "s", 1, 0, 0)
        good.put("n", b"a", b"1")
        bad = store.staged_writer("p", "s", 1, 1, 0)
        bad.put("n", b"b", b"2")
        msgs = [good.finish(), bad.finish()]
        path = os.path.join(str(tmp_path), pipeline_dir("p"), msgs[1].files[0].name)
        with open(path, "r+b") as f:
            f.truncate(10)
        from sparkbeam.checkpoint import CheckpointCorruptError

        with pytest.raises(CheckpointCorruptError, match="p00001-a000"):
            st.checkpoint(commit_messages=msgs)
        assert st.status is CommitStatus.ABORTED and len(st) == 0


def test_retention_keeps_last_k_and_truncates_old_changelog(tmp_path):
    root = str(tmp_path)
    with open_store(root, retain=2, flush_bytes=1) as store:
        st = store.pipeline("p")
        for cid in range(1, 7):
            st.put("n", b"k%d" % cid, b"v")
            if cid == 4:
                st.materialize()
            assert st.checkpoint() == cid
        # The last 2, plus 3: the newest checkpoint sharing no file with 6 (the fallback
        # if a file of 6 is damaged), kept until the next materialization.
        assert [i.checkpoint_id for i in store.list_checkpoints("p")] == [3, 5, 6]
        files = set(store.storage.list(pipeline_dir("p")))
        referenced = {
            f"{pipeline_dir('p')}/{f.name}"
            for c in (3, 5, 6)
            for f in store.load_manifest("p", c).files
        }
        data_files = {f for f in files if "/manifests/" not in f}
        assert data_files == referenced, "changelog before the materialization is truncated"
        assert all("changelog/" not in f or "0000000" in f for f in data_files)
    with open_store(root) as store:
        st = store.pipeline("p")
        st.restore(5)
        assert len(st) == 5


def test_clean_keeps_files_of_a_round_in_progress(tmp_path):
    with open_store(str(tmp_path)) as store:
        st = store.pipeline("p")
        w = store.staged_writer("p", "s", 1, 0, 0)
        w.put("n", b"a", b"1")
        st.checkpoint(commit_messages=[w.finish()])
        pending = store.staged_writer("p", "s", 2, 0, 0)
        pending.put("n", b"b", b"2")
        msg = pending.finish()
        st.put("n", b"driver", b"uncommitted but flushed")
        st.log.flush_bytes = 1  # force a flush of the driver's buffer
        st.put("n", b"driver2", b"x")
        assert store.clean(grace_s=1e9) == []
        st.checkpoint(commit_messages=[msg])
        assert st.get("n", b"b") == b"2"


def test_fingerprint_mismatch_is_refused_unless_allowed(tmp_path):
    with open_store(str(tmp_path)) as store:
        st = store.pipeline("orders")
        st.put("n", b"k", b"v")
        st.checkpoint(fingerprint="graph-v1")
        with pytest.raises(
            IncompatibleCheckpointError,
            match=r"Checkpoint 1 of pipeline 'orders' was written by a pipeline with fingerprint "
            r"'graph-v1', but the running pipeline has fingerprint 'graph-v2'.*"
            r"allow_fingerprint_change=True",
        ):
            st.restore(fingerprint="graph-v2")
        assert st.restore(fingerprint="graph-v2", allow_fingerprint_change=True).checkpoint_id == 1


LOCK_HOLDER = """
import sys, time
from sparkbeam.checkpoint import open_store
store = open_store(sys.argv[1], job_name="nightly-etl")
print("locked", flush=True)
time.sleep(60)
"""


def test_second_job_is_refused_and_stale_lock_is_taken_over(tmp_path):
    root = str(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, root], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(
            StoreLockedError,
            match=rf"is locked by job 'nightly-etl' \(host '.*', pid {proc.pid}, since .*\)\. "
            r"Stop that job first; .* break_lock=True",
        ):
            open_store(root)
        open_store(root, read_only=True).list_pipelines()  # readers need no lock
    finally:
        proc.kill()
        proc.wait()
    # The holder is dead (same host): the lock is stale and taken over.
    store = open_store(root, job_name="next")
    with pytest.raises(StoreLockedError, match="job 'next'"):
        open_store(root)
    store.close()
    open_store(root).close()
    with open_store(root) as again:
        again.pipeline("p")
        other = open_store(root, break_lock=True)  # forcibly broken
        other.close()


def test_closed_and_read_only_stores_refuse_writes(tmp_path):
    from sparkbeam.checkpoint import StoreClosedError

    store = open_store(str(tmp_path))
    st = store.pipeline("p")
    store.close()
    with pytest.raises(StoreClosedError, match="Pipeline 'p' of .* is closed"):
        st.put("n", b"k", b"v")
    with pytest.raises(PermissionError, match="opened read-only"):
        open_store(str(tmp_path), read_only=True).pipeline("p")


@pytest.mark.parametrize(
    "args,exc,match",
    [
        (("n", "str-key", b"v"), TypeError, "state key must be bytes, got str"),
        (("n", b"k", "v"), TypeError, r"state value for key b'k' must be bytes"),
        ((1, b"k", b"v"), TypeError, "state namespace must be str"),
    ],
)
def test_type_errors(tmp_path, args, exc, match):
    with open_store(str(tmp_path)) as store:
        with pytest.raises(exc, match=match):
            store.pipeline("p").put(*args)


def test_option_errors(tmp_path):
    with pytest.raises(ValueError, match=r"state_backend='leveldb' is not supported"):
        open_store(str(tmp_path), state_backend="leveldb")
    with pytest.raises(ValueError, match=r"retain=0 must be at least 1"):
        open_store(str(tmp_path), retain=0)


def test_missing_checkpoint_error(tmp_path):
    from sparkbeam.checkpoint import CheckpointNotFoundError

    with open_store(str(tmp_path)) as store:
        assert store.pipeline("p").restore() is None
        with pytest.raises(CheckpointNotFoundError, match="Pipeline 'p' has no checkpoint 4"):
            store.pipeline("p").restore(4)
        with pytest.raises(CheckpointNotFoundError, match="has no checkpoint in store"):
            list(store.read_subtask_state("p", None, 0, 1))


def test_materialization_interval_triggers_snapshots(tmp_path):
    with open_store(str(tmp_path), materialization_interval_s=0.0) as store:
        st = store.pipeline("p")
        for r in range(3):
            st.put("n", b"k%d" % r, b"v")
            cid = st.checkpoint()
            m = store.load_manifest("p", cid)
            assert m.materialization and not m.changelog
            assert sum(f.records for f in m.materialization) == r + 1
    with open_store(str(tmp_path), materialization_interval_s=None) as store:
        st = store.pipeline("p")
        st.restore()
        st.put("n", b"more", b"v")
        m = store.load_manifest("p", st.checkpoint())
        assert len(m.changelog) == 1 and m.entries == 4


def test_the_driver_remembers_only_each_stages_newest_round_of_committed_tasks(tmp_path):
    """A streaming job commits a round a second, forever: the driver's record of committed
    tasks (which refuses a second attempt of one) grew by every task of every round (a
    tracemalloc diff of a broker-free streaming driver: 3,268 blocks in 6 minutes). A restore
    already knew only its checkpoint's tasks; the running chain now keeps as much."""
    root = str(tmp_path)
    store = open_store(root)
    st = store.pipeline("p")
    last = {}
    for rnd in range(40):
        msgs = []
        for stage in ("stage-a", "stage-b"):
            for partition in range(3):
                w = open_staged_writer(root, "p", stage, rnd, partition, 0)
                w.put("s", b"%s-%d" % (stage.encode(), partition), b"%d" % rnd)
                msgs.append(w.finish())
        st.checkpoint(fingerprint="f", parallelism=3, commit_messages=msgs)
        last = {(m.stage, m.partition): m for m in msgs}
    assert len(st.chain.committed_tasks) == 6
    # The newest round's messages keep their meaning: again is a no-op, another attempt fails.
    st.checkpoint(fingerprint="f", commit_messages=[last[("stage-a", 0)]])
    other = open_staged_writer(root, "p", "stage-a", 39, 0, 1)
    other.put("s", b"x", b"y")
    with pytest.raises(ValueError, match=r"Two attempts \[0, 1\] of stage 'stage-a' round 39"):
        st.checkpoint(fingerprint="f", commit_messages=[other.finish()])
    store.close()

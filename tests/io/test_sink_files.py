"""The sink-file commit protocol without Spark: collectors, finalize, pending pairs in a store."""

from __future__ import annotations

import os

import pytest

from sparkbeam.checkpoint import LocalStorage, open_store
from sparkbeam.runner.rounds import sink_files
from sparkbeam.runner.task.records import SinkFilesRecord


def _staged_file(tmp_path, name: str, text: str) -> tuple[str, str]:
    staged = sink_files.staging_path(str(tmp_path), name)
    os.makedirs(os.path.dirname(staged), exist_ok=True)
    with open(staged, "w") as f:
        f.write(text)
    return staged, str(tmp_path / f"out-{name}")


def _visible(tmp_path) -> dict[str, str]:
    return {p.name: p.read_text() for p in tmp_path.iterdir() if p.is_file()}


def test_collector_is_active_only_while_its_records_are_pulled():
    assert sink_files.current_task() is None
    assert sink_files.stage("s", "f") is False

    def inner():
        assert sink_files.current_task() == ("stage-1", 3, 0)
        assert sink_files.stage("a.staged", "a") is True
        yield "x"
        assert sink_files.next_sequence() == 0
        assert sink_files.next_sequence() == 1
        yield "y"

    def outer(rows):
        for row in rows:  # a chained stage pulling from stage-1's wrapped records
            assert sink_files.current_task().stage == "stage-2"
            yield row.upper() if isinstance(row, str) else row

    wrapped = sink_files.collect_sink_files(
        outer(sink_files.collect_sink_files(inner(), "stage-1", 3)), "stage-2", 0
    )
    assert list(wrapped) == ["X", "Y", SinkFilesRecord("stage-1", (("a.staged", "a"),))]
    assert sink_files.current_task() is None


def test_collect_sink_files_ends_with_one_record_of_staged_pairs():
    def task():
        yield 1
        sink_files.stage("a.staged", "a")
        sink_files.stage("b.staged", "b")
        yield 2

    out = list(sink_files.collect_sink_files(task(), "stage-4", 0))
    assert out == [1, 2, SinkFilesRecord("stage-4", (("a.staged", "a"), ("b.staged", "b")))]
    assert list(sink_files.collect_sink_files(iter([1]), "stage-4", 0)) == [1]


def test_finalize_renames_and_is_idempotent(tmp_path):
    pairs = [_staged_file(tmp_path, n, f"data {n}\n") for n in ("a", "b")]
    assert sink_files.finalize(pairs) == 2
    assert sink_files.finalize(pairs) == 0  # staged gone, final present: already done
    assert _visible(tmp_path) == {"out-a": "data a\n", "out-b": "data b\n"}
    assert os.listdir(tmp_path / sink_files.STAGING_DIR) == []


def test_finalize_replaces_a_final_file_of_an_earlier_run(tmp_path):
    (tmp_path / "out-a").write_text("old\n")
    pair = _staged_file(tmp_path, "a", "new\n")
    assert sink_files.finalize([pair]) == 1
    assert _visible(tmp_path) == {"out-a": "new\n"}


def test_finalize_with_both_files_missing_names_the_lost_file(tmp_path):
    staged, final = str(tmp_path / "gone.staged"), str(tmp_path / "out-gone")
    with pytest.raises(sink_files.SinkFileLostError, match=r"'.*out-gone' cannot be finalized"):
        sink_files.finalize([(staged, final)])


def test_discard_staging_keeps_named_files_and_tolerates_missing_dirs(tmp_path):
    keep, _ = _staged_file(tmp_path, "keep", "k")
    _staged_file(tmp_path, "garbage1", "g")
    _staged_file(tmp_path, "garbage2", "g")
    staging = str(tmp_path / sink_files.STAGING_DIR)
    assert sink_files.staging_dirs([(keep, "x")]) == {staging}
    assert sink_files.discard_staging(staging, keep=[keep]) == 2
    assert os.listdir(staging) == ["keep"]
    assert sink_files.discard_staging(str(tmp_path / "no-such-dir")) == 0


def _store(root):
    return open_store(LocalStorage(str(root)), break_lock=True)


def test_pending_pairs_are_finalized_after_the_checkpoint_commits(tmp_path):
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    out.mkdir()
    pairs = [_staged_file(out, n, n) for n in ("r0-p0", "r0-p1")]
    store = _store(ckpt)
    state = store.pipeline("p")
    sink_files.record_pending(state, pairs)  # round commit = pending pairs + checkpoint
    state.checkpoint(fingerprint="f")
    assert _visible(out) == {}  # nothing visible before finalize
    assert sink_files.finalize_pending(state) == 2
    assert _visible(out) == {"out-r0-p0": "r0-p0", "out-r0-p1": "r0-p1"}
    assert list(state.items(sink_files.pending_namespace)) == []
    store.close()


def test_crash_after_commit_before_finalize_then_restore_finalizes_exactly_once(tmp_path):
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    out.mkdir()
    committed = [_staged_file(out, n, n) for n in ("r0-p0", "r0-p1")]
    uncommitted = _staged_file(out, "r1-p0", "never")  # a round killed before its checkpoint
    store = _store(ckpt)
    state = store.pipeline("p")
    sink_files.record_pending(state, committed)
    state.checkpoint(fingerprint="f")
    sink_files.record_pending(state, [uncommitted])  # killed here: no checkpoint, no finalize
    del store, state

    # Restore twice: the first restore's finalize is itself "crashed" before any checkpoint.
    for _ in range(2):
        store = _store(ckpt)
        state = store.pipeline("p")
        assert state.restore(fingerprint="f") is not None
        sink_files.finalize_pending(state)
        assert _visible(out) == {"out-r0-p0": "r0-p0", "out-r0-p1": "r0-p1"}
        del store, state

    store = _store(ckpt)
    state = store.pipeline("p")
    state.restore(fingerprint="f")
    sink_files.finalize_pending(state)
    state.checkpoint(fingerprint="f")  # commits the forgotten pending entries
    staging = str(out / sink_files.STAGING_DIR)
    assert sink_files.discard_staging(staging, keep=()) == 1  # the uncommitted round's file
    assert _visible(out) == {"out-r0-p0": "r0-p0", "out-r0-p1": "r0-p1"}
    store.close()
    store = _store(ckpt)
    state = store.pipeline("p")
    state.restore(fingerprint="f")
    assert list(state.items(sink_files.pending_namespace)) == []
    store.close()

"""A damaged task-owned file: the task names it and its checkpoint, the driver falls back.

A task that reads a checkpoint's task-owned file (a changelog segment: its block index, one
block, cut short, deleted; a range snapshot: a flipped byte, cut, deleted) and finds it damaged
fails with `TaskStateDamagedError`, naming the file and the checkpoint. The driver recognises it
in Spark's failure text (`runner.errors.DamagedStateError`), sets aside every checkpoint newer
than the newest one whose files are all sound -- the one `sparkbeam checkpoints verify` says a
restart uses -- and restores that one (`restore.fall_back`). The set-aside checkpoints are
never restored again; the next commit deletes them, logging which. Before, a restart restored
the damaged checkpoint, failed on it max_restores times, and ended in an error that claimed a
fallback and blamed coders. Jobs that do this end to end:
``tests/streaming/test_task_file_fallback``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil

import pytest

from sparkbeam.checkpoint import CheckpointCorruptError, key_group_range, open_store, state_layout
from sparkbeam.checkpoint.cli import main as cli
from sparkbeam.checkpoint.errors import TaskStateDamagedError
from sparkbeam.checkpoint.keygroups import key_group
from sparkbeam.checkpoint.layout import pipeline_dir
from sparkbeam.runner.task import staged_state

NAMESPACES = {
    "gbk": state_layout.gbk("ref_PCollection_x"),
    "user-state": state_layout.user_state("stage-4"),
    "sdf-residual": state_layout.sdf_residual("stage-2"),
}
SEGMENT_DAMAGE = ("block-index", "one-block", "truncated", "segment-deleted")
SNAPSHOT_DAMAGE = ("flipped", "cut", "snapshot-deleted")
KEYS = 600  # per namespace; ~300 KB of values per task's segment: several blocks


def _value(n: int, key: bytes) -> bytes:
    return bytes([state_layout.V1]) + os.urandom(480) + b"%d" % n + key


def _round(store, n: int, snap: bool) -> int:
    """Round ``n``: two tasks put every key of their key groups in each namespace, and
    snapshot their ranges if ``snap``."""
    messages = []
    for sub in range(2):
        groups = key_group_range(sub, 2, 128)
        writer = store.staged_writer("p", "stage", n, sub, 0)
        for ns in NAMESPACES.values():
            mine = {}
            for i in range(KEYS):
                key = b"%s-%d" % (ns.encode(), i)
                if key_group(key, 128) in groups:
                    mine[key] = _value(n, key)
                    writer.put(ns, key, mine[key])
            if snap:
                writer.snapshot(ns, groups.start, groups.stop, sorted(mine.items()), 1 << 20)
            else:
                writer.count(ns, groups.start, groups.stop, len(mine))
        messages.append(writer.finish())
    return store.pipeline("p").checkpoint(fingerprint="f", parallelism=2, commit_messages=messages)


@pytest.fixture(scope="session")  # not "module": conftest groups those for xdist
def built(tmp_path_factory) -> str:
    """Checkpoints 1-4: snapshots (1), a tail (2), new snapshots the retention asked for (3:
    no file shared with 2), a tail of multi-block segments (4). A damaged segment of 4 leaves
    3 sound; a damaged snapshot of 3 and 4 leaves 2."""
    root = str(tmp_path_factory.mktemp("built") / "store")
    with open_store(root) as store:
        assert [_round(store, n, snap=n in (0, 2)) for n in range(4)] == [1, 2, 3, 4]
    return root


def _copy(built: str, tmp_path) -> str:
    root = str(tmp_path / "store")
    shutil.copytree(built, root)
    return root


def damage_target(root: str, pipeline: str, namespace: str, kind: str) -> str:
    """The file of the newest checkpoint to damage with ``kind``: the first segment of
    ``namespace``'s log (the one most checkpoints share), or its first range's snapshot."""
    with open_store(root, read_only=True) as store:
        newest = store.list_checkpoints(pipeline)[-1].checkpoint_id
        chains = store.load_manifest(pipeline, newest).task_state.namespaces[namespace]
        if kind in SEGMENT_DAMAGE:
            entry = chains.log[0][1]
        else:
            entry = next(f for r in chains.ranges for f in r.base)
    return os.path.join(root, pipeline_dir(pipeline), entry.name)


def damage(path: str, kind: str) -> None:
    """Damage one file as a disk, a cleaner or a partial copy would."""
    data = bytearray(open(path, "rb").read())
    if kind.endswith("deleted"):
        os.remove(path)
        return
    if kind == "block-index":  # the index's last byte: just before its tail and the footer
        data[-(20 + 8 + 1)] ^= 0xFF
    elif kind in ("one-block", "flipped"):
        data[len(data) // 3] ^= 0xFF
    else:  # truncated, cut
        del data[len(data) // 2 :]
    with open(path, "wb") as f:
        f.write(data)


def _read_all(root: str, checkpoint_id: int, ns: str, parallelism: int) -> None:
    """Every subtask's read, as the round's tasks do (none kept from an earlier read)."""
    for subtask in range(parallelism):
        spec = staged_state.StateRound(
            pipeline="p", url=root, checkpoint_id=checkpoint_id, round_no=5,
            parallelism=parallelism, max_key_groups=128,
        )  # fmt: skip
        staged_state.read_task_state(spec, subtask, ns)


DAMAGE = [(k, p) for k in SEGMENT_DAMAGE for p in (2, 4)] + [(k, 2) for k in SNAPSHOT_DAMAGE]


@pytest.mark.parametrize("kind, parallelism", DAMAGE, ids=[f"{k}-p{p}" for k, p in DAMAGE])
@pytest.mark.parametrize("name", sorted(NAMESPACES))
def test_a_task_names_the_damaged_file_and_its_checkpoint(
    built, tmp_path, monkeypatch, executor_dir, name, kind, parallelism
):
    """At the parallelism that wrote them a task reads its segments whole (checked by their
    checksum); at 4 it reads the blocks of its key groups by ranged reads (each block and the
    index checked by their crc32)."""
    monkeypatch.setattr(staged_state, "_READS", type(staged_state._READS)())
    root = _copy(built, tmp_path)
    ns = NAMESPACES[name]
    path = damage_target(root, "p", ns, kind)
    assert kind not in SEGMENT_DAMAGE or os.path.getsize(path) > 256 << 10  # several blocks
    damage(path, kind)
    with pytest.raises(TaskStateDamagedError) as failed:
        _read_all(root, 4, ns, parallelism)
    message = str(failed.value)
    assert message.startswith(f"Checkpoint file {path!r} is corrupt: ")
    assert "checkpoint 4 of pipeline 'p' names it" in message
    assert "falls back" not in message and "\n" not in message
    assert isinstance(failed.value, CheckpointCorruptError | ValueError)
    assert (failed.value.pipeline_id, failed.value.checkpoint_id) == ("p", 4)
    _read_all(root, 2, ns, parallelism)  # an older checkpoint that does not name it reads


def _verify(root: str, capsys) -> tuple[int, int | None, list[dict]]:
    """``sparkbeam checkpoints verify``: exit code, the checkpoint a restart would use, docs."""
    code = cli(["checkpoints", "verify", "--checkpoint_dir", root, "--json"])
    docs = json.loads(capsys.readouterr().out)
    restart = [d["checkpoint_id"] for d in docs if d["restart"]]
    return code, (restart[0] if restart else None), docs


@pytest.mark.parametrize("kind, sound", [("one-block", 3), ("flipped", 2)])
def test_the_driver_falls_back_to_what_verify_says_and_sets_the_damaged_aside(
    built, tmp_path, caplog, capsys, kind, sound
):
    from sparkbeam.checkpoint.restore import fall_back

    root = _copy(built, tmp_path)
    path = damage_target(root, "p", NAMESPACES["user-state"], kind)
    damage(path, kind)
    code, restart, _ = _verify(root, capsys)
    assert (code, restart) == (1, sound)
    damaged = list(range(sound + 1, 5))
    cause = f"TaskStateDamagedError: Checkpoint file {path!r} is corrupt: ..."
    with open_store(root) as store:
        with caplog.at_level(logging.WARNING, logger="sparkbeam.checkpoint"):
            assert fall_back(store, "p", cause) == sound
        (line,) = [r.getMessage() for r in caplog.records if "set aside" in r.getMessage()]
        assert line.startswith(cause)  # cause first, one line
        assert f"checkpoints {', '.join(map(str, damaged))} of pipeline 'p'" in line
        assert f"restoring checkpoint {sound}" in line and "\n" not in line
        assert os.path.basename(path) in line
    # A restart (or the failed round's restore) never picks them again; verify agrees.
    assert _verify(root, capsys)[:2] == (1, sound)
    caplog.clear()
    with open_store(root) as store:
        st = store.pipeline("p")
        with caplog.at_level(logging.WARNING, logger="sparkbeam.checkpoint"):
            assert st.restore(fingerprint="f").checkpoint_id == sound
        listed = ", ".join(map(str, damaged))
        assert f"Checkpoints {listed} of pipeline 'p' were set aside" in caplog.text
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="sparkbeam.checkpoint"):
            new = st.checkpoint(fingerprint="f", parallelism=2)
        assert new == 5  # ids are never reused: workers cache manifests by id
        deleted = [r.getMessage() for r in caplog.records if "Deleted" in r.getMessage()]
        assert deleted and all(str(c) in deleted[0] for c in damaged)
        ids = [i.checkpoint_id for i in store.list_checkpoints("p")]
        assert not set(damaged) & set(ids) and sound in ids
        marks = os.listdir(os.path.join(root, pipeline_dir("p"), "manifests"))
        assert not [m for m in marks if m.endswith(".damaged")]
    assert _verify(root, capsys)[:2] == (0, 5)


def test_a_file_unreadable_for_a_while_sets_nothing_aside(built, tmp_path):
    """The task's read failed, but every file of the newest checkpoint is sound now: nothing
    to fall back past (the round loop restores the newest, counting it as a failed round)."""
    from sparkbeam.checkpoint.restore import fall_back

    root = _copy(built, tmp_path)
    with open_store(root) as store:
        assert fall_back(store, "p", "TaskStateDamagedError: ...") is None
    marks = os.listdir(os.path.join(root, pipeline_dir("p"), "manifests"))
    assert not [m for m in marks if m.endswith(".damaged")]


def test_with_no_sound_checkpoint_the_driver_says_so_and_sets_nothing_aside(
    built, tmp_path, capsys
):
    from sparkbeam.checkpoint.restore import fall_back

    root = _copy(built, tmp_path)
    with open_store(root, read_only=True) as store:
        assert [i.checkpoint_id for i in store.list_checkpoints("p")] == [2, 3, 4]
        files = {f.name for c in (2, 3, 4) for f in store.load_manifest("p", c).files}
    for name in sorted(files):
        if name.endswith(".arrow"):
            os.remove(os.path.join(root, pipeline_dir("p"), name))  # every snapshot
    code, restart, _ = _verify(root, capsys)
    assert (code, restart) == (1, None)
    with open_store(root) as store:
        with pytest.raises(CheckpointCorruptError, match="no checkpoint of pipeline 'p' is sound"):
            fall_back(store, "p", "TaskStateDamagedError: ...")
    marks = os.listdir(os.path.join(root, pipeline_dir("p"), "manifests"))
    assert not [m for m in marks if m.endswith(".damaged")]


def test_a_task_failure_naming_a_damaged_file_is_told_apart_and_its_message_is_true():
    """The error crosses Spark as text; the driver's error names the file, claims no fallback
    and says what fits a damaged store."""
    from sparkbeam.runner.errors import DamagedStateError, StageFailedError, run_guarded

    error = TaskStateDamagedError("/s/pipelines/p/staged/x.seg", "file is missing", "p", 7)
    spark_text = (
        "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage "
        "2.0 failed 1 times ...: org.apache.spark.api.python.PythonException: Traceback (most "
        'recent call last):\n  File "/x/runner/task/bundle_executor.py", line 102, in run\n'
        "    raise UserCodeError(...)\nsparkbeam.runner.task.stage_worker.UserCodeError: "
        f"[stage-3] TaskStateDamagedError: {error}\nTraceback (most recent call last):\n"
        '  File "/x/checkpoint/changelog.py", line 368, in read_segment\n    raise ...\n'
        f"sparkbeam.checkpoint.errors.TaskStateDamagedError: {error}\n\n"
        "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(x.scala:1)\n"
    )

    def action():
        raise RuntimeError(spark_text)

    with pytest.raises(DamagedStateError) as failed:
        run_guarded(None, action)
    e = failed.value
    assert isinstance(e, StageFailedError)  # what callers already catch
    assert e.path == "/s/pipelines/p/staged/x.seg" and e.stage == "stage-3"
    assert e.cause == f"TaskStateDamagedError: {error}"
    message = str(e)
    assert "'/s/pipelines/p/staged/x.seg'" in message.splitlines()[0]
    assert "falls back" not in message and "coder" not in message
    assert "sparkbeam checkpoints verify" in message

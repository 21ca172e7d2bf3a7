"""A durable batch SDF stage's output chunks are kept by its tasks, not by the driver.

Each task stages its chunks in its own key groups; the driver's commit takes the segments'
handles and reads none of them; a resumed stage's tasks read them back, each only its key
groups, at any parallelism; a range's snapshot keeps its base's files and adds one of its
tail (a fallback request rewrites the whole range).
"""

from __future__ import annotations

from collections import Counter

import pytest

from sparkbeam.checkpoint import open_staged_writer, open_store, state_layout, task_state
from sparkbeam.checkpoint.keygroups import key_group_range
from sparkbeam.runner.task import task_range
from sparkbeam.runner.task.records import OutputRecord
from sparkbeam.runner.task.staged_state import StateRound
from tests.checkpoint.test_task_owned_state import Reads

STAGE = "stage-3"
NS = state_layout.stage_output(STAGE)
M = 128
LAYOUT = {state_layout.LAYOUT_KEY: state_layout.LAYOUT_VERSION}


def _spec(root: str, cid, round_no: int, parallelism: int) -> StateRound:
    return StateRound(
        pipeline="p", url=root, checkpoint_id=cid, round_no=round_no,
        parallelism=parallelism, max_key_groups=M,
    )  # fmt: skip


def _chunks(round_no: int, subtask: int, n: int) -> list[OutputRecord]:
    return [OutputRecord("out", b"r%d-s%d-%d" % (round_no, subtask, i)) for i in range(n)]


def _round(store, cid, round_no: int, parallelism: int, per_task: int = 3):
    """One round of ``parallelism`` tasks, each passing its chunks through; committed."""
    root, messages = store.storage.root, []
    for sub in range(parallelism):
        writer = open_staged_writer(root, "p", STAGE, round_no, sub, 0, max_key_groups=M)
        spec = _spec(root, cid, round_no, parallelism)
        keeper = task_range.RowKeeper(spec, NS, sub, writer)  # as a durable SDF task keeps them
        for chunk in _chunks(round_no, sub, per_task):
            keeper.add(chunk.buffer, chunk.data)
        keeper.finish()
        messages.append(writer.finish())
    pipeline = store.pipeline("p")
    return pipeline.checkpoint(
        fingerprint="f", parallelism=parallelism, metadata=LAYOUT, commit_messages=messages
    )


def _read(root: str, cid, parallelism: int) -> Counter:
    got: Counter = Counter()
    for sub in range(parallelism):
        for _, data in task_range.read_rows(_spec(root, cid, 0, parallelism), NS, sub):
            got[data] += 1
    return got


def _expected(rounds: int, parallelism: int, per_task: int = 3) -> Counter:
    return Counter(
        c.data for r in range(rounds) for s in range(parallelism) for c in _chunks(r, s, per_task)
    )


def test_chunks_are_kept_by_tasks_and_read_back_by_key_group_at_any_parallelism(
    tmp_path, executor_dir, monkeypatch
):
    with open_store(str(tmp_path / "store"), materialization_interval_s=None) as store:
        reads = Reads(store.storage, monkeypatch)
        cid = None
        for r in range(3):
            cid = _round(store, cid, r, parallelism=2)
        assert reads.staged() == []  # the driver's commits read no chunk
        pipeline = store.pipeline("p")
        assert list(pipeline.items(NS)) == []  # nor hold one
        manifest = store.load_manifest("p", cid)
        chains = manifest.task_state.namespaces[NS]
        assert chains.entries == 18  # counted by the tasks
        for sub in range(2):  # each task's segments hold only its key groups
            groups = key_group_range(sub, 2, M)
            mine = [f for _, f in chains.log if f.name.split("/")[-1].startswith(f"p{sub:05d}")]
            assert mine and all(groups.start <= f.kg_start < f.kg_stop <= groups.stop for f in mine)
        root = store.storage.root
    for parallelism in (1, 2, 4):  # a resume at any parallelism reads every chunk once
        assert _read(root, cid, parallelism) == _expected(3, 2)


def test_a_grown_range_keeps_its_base_files_and_a_fallback_rewrites_them(
    tmp_path, executor_dir, monkeypatch
):
    monkeypatch.setattr(task_state, "_segments_due", lambda start: 2)
    with open_store(str(tmp_path / "store")) as store:
        root = store.storage.root

        def ranges(cid):
            return store.load_manifest("p", cid).task_state.namespaces[NS]

        cid = _round(store, None, 0, 1)
        cid = _round(store, cid, 1, 1)  # the second checkpoint asks for a fallback ...
        assert ranges(cid).snapshots_pending
        cid = _round(store, cid, 2, 1)  # ... the task rewrites its whole range
        (first,) = ranges(cid).ranges
        assert first.base and not ranges(cid).log and first.entries == 9
        cid = _round(store, cid, 3, 1)
        cid = _round(store, cid, 4, 1)  # a tail of two segments: due
        cid = _round(store, cid, 5, 1)
        (grown,) = ranges(cid).ranges
        kept = grown.base[: len(first.base)]
        assert kept == first.base  # the base's files are kept ...
        assert len(grown.base) == len(first.base) + 1  # ... and one file of the tail added
        assert grown.base[-1].records == 9 and grown.entries == 18  # rounds 3-5 in it
        assert not ranges(cid).log
        assert _read(root, cid, 1) == _expected(6, 1)
        assert _read(root, cid, 3) == _expected(6, 1)


def test_a_chunk_of_another_layout_is_refused_naming_its_namespace(tmp_path, executor_dir):
    with open_store(str(tmp_path / "store"), materialization_interval_s=None) as store:
        writer = open_staged_writer(store.storage.root, "p", STAGE, 0, 0, 0, max_key_groups=M)
        writer.put(NS, b"k", b"\x09junk")
        cid = store.pipeline("p").checkpoint(
            fingerprint="f", metadata=LAYOUT, commit_messages=[writer.finish()]
        )
        root = store.storage.root
    with pytest.raises(state_layout.StateLayoutError, match="stage-output/stage-3"):
        _read(root, cid, 1)


@pytest.mark.spark
def test_a_durable_sdf_task_commits_its_residuals_and_output_chunks_as_one_message(spark, tmp_path):
    """Each task of a durable SDF round stages its residuals and its output chunks with one
    writer: one commit message a task and round (issue 44: it sent two)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that, equal_to

    from tests.conftest import spark_test_options
    from tests.sdf.sdfs import ChunkedWithDelay

    url = str(tmp_path / "ckpt")
    flags = [f"--checkpoint_dir={url}", "--parallelism=2", "--checkpoint_interval_s=0.01"]
    with beam.Pipeline(options=PipelineOptions(spark_test_options(*flags))) as p:
        got = (
            p
            | beam.Create([("a", 7), ("b", 5)])
            | beam.ParDo(ChunkedWithDelay(per_call=3, delay_s=0.01))
            | beam.MapTuple(lambda name, pos, _: f"{name}{pos}")
        )
        assert_that(got, equal_to([f"a{i}" for i in range(7)] + [f"b{i}" for i in range(5)]))
    with open_store(url, read_only=True) as store:
        (pipeline,) = store.list_pipelines()
        manifests = [
            store.load_manifest(pipeline, info.checkpoint_id).commits
            for info in store.list_checkpoints(pipeline)
        ]
    for commits in manifests:  # a task's message per round it ran: one
        per_task = Counter((round_no, task) for _, round_no, task, _ in commits)
        assert not per_task or max(per_task.values()) == 1, commits
    stages = {stage for commits in manifests for stage, *_ in commits}
    assert stages and all(s.startswith("residuals:") for s in stages), stages

"""A streaming side input is kept by tasks; readers read its files.

Before, the driver collected every new chunk of the side input each round, kept it in its
table (and every checkpoint's driver files) and broadcast all chunks so far to each reading
stage, every round. Now one task per subtask keeps the round's chunks in its own key groups
(``side-rows/<buffer>``); the driver passes the files' handles; each worker reads a file once.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from apache_beam.coders import coders
from apache_beam.coders.coder_impl import create_InputStream
from apache_beam.runners import pipeline_context
from apache_beam.transforms.window import GlobalWindow, IntervalWindow
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue

from sparkbeam.checkpoint import open_staged_writer, open_store, state_layout
from sparkbeam.runner.streaming import side_input_store
from sparkbeam.runner.task import side_input_files, side_input_view
from sparkbeam.runner.task.records import CommitRecord
from sparkbeam.runner.task.side_input_files import (
    Keeping,
    SideInputFiles,
    SideInputHeld,
    files_of,
    keeping_side_input,
    side_input_chunks,
)
from sparkbeam.runner.task.staged_state import StateRound, task_store
from sparkbeam.runner.task.worker_context import register_plan
from tests.checkpoint.test_task_owned_state import Reads

LAYOUT = {state_layout.LAYOUT_KEY: state_layout.LAYOUT_VERSION}
NS = state_layout.side_rows("buf")
ROWS_CODER = coders.WindowedValueCoder(coders.BytesCoder(), coders.IntervalWindowCoder())
_ROWS_CONTEXT = pipeline_context.PipelineContext()
ROWS_CODER_ID = _ROWS_CONTEXT.coders.get_id(ROWS_CODER)
ROWS_COMPONENTS = SimpleNamespace(value=_ROWS_CONTEXT.to_runner_api().SerializeToString())


def _chunk(*values: bytes, end_s: int = 10) -> bytes:
    """A Beam-encoded chunk of ``values`` in the window ``[end_s - 10, end_s)``."""
    window = IntervalWindow(end_s - 10, end_s)
    return b"".join(
        ROWS_CODER.get_impl().encode_nested(WindowedValue(v, end_s - 10, (window,))) for v in values
    )


def _keep(root: str, cid, round_no: int, subtask: int, chunks: list[bytes], committed=None):
    """Subtask ``subtask`` keeps ``chunks`` in round ``round_no`` over checkpoint ``cid``;
    ``committed``: the checkpoint's `SideInputFiles`, with the round's horizon."""
    spec = StateRound(
        pipeline="p", url=root, checkpoint_id=cid, round_no=round_no, parallelism=2,
        max_key_groups=128,
    )  # fmt: skip
    writer = open_staged_writer(root, "p", "side:buf", round_no, subtask, 0, max_key_groups=128)
    if committed is None:
        committed = SideInputFiles(root, "p", NS, (), 0)
    register_plan("rows-plan", ROWS_COMPONENTS.value)
    keeping = Keeping("buf", committed, "rows-plan", ROWS_COMPONENTS, ROWS_CODER_ID)
    (record,) = keeping_side_input(spec, keeping, subtask, chunks, writer)
    return record.message


def _segments(reads: Reads) -> int:
    return sum(p.endswith(".seg") for p in reads.paths)


def test_kept_chunks_are_read_from_their_files_and_a_worker_reads_each_file_once(
    tmp_path, executor_dir, monkeypatch
):
    monkeypatch.setattr(side_input_files, "_CACHE", side_input_files._ReadFiles())
    with open_store(str(tmp_path)) as store:
        root, state = store.storage.root, store.pipeline("p")
        driver_reads = Reads(store.storage, monkeypatch)
        worker_reads = Reads(task_store(root).storage, monkeypatch)
        first = [
            _keep(root, None, 0, sub, [_chunk(b"r0-s%d-%d" % (sub, i)) for i in range(3)])
            for sub in (0, 1)
        ]
        staged = [f for m in first for f in m.files]
        files = SideInputFiles(root, "p", NS, files_of(None, staged, 128), 6)
        expected = [_chunk(b"r0-s%d-%d" % (sub, i)) for sub in (0, 1) for i in range(3)]
        assert side_input_chunks(files) == expected  # the round that kept them reads them
        assert _segments(worker_reads) == 2

        cid = state.checkpoint(fingerprint="f", metadata=LAYOUT, commit_messages=first)
        assert driver_reads.staged() == []  # the commit read no chunk ...
        assert list(state.items(NS)) == []  # ... and the driver's table holds none
        committed = state.task_owned_state(NS)
        assert committed is not None and committed.entries == 6

        second = [_keep(root, cid, 1, 1, [_chunk(b"r1-s1-0")])]
        parts = files_of(committed, [f for m in second for f in m.files], 128)
        files = SideInputFiles(root, "p", NS, parts, committed.entries + 1)
        assert side_input_chunks(files) == [*expected, _chunk(b"r1-s1-0")]  # in round order
        assert _segments(worker_reads) == 3  # the new file only
        assert side_input_chunks(files) == [*expected, _chunk(b"r1-s1-0")]
        assert _segments(worker_reads) == 3  # another task of the same worker: no read


def test_rows_whose_windows_ended_by_the_horizon_are_dropped_by_readers_and_snapshots(
    tmp_path, executor_dir, monkeypatch
):
    """Windows [0, 10), [10, 20), [20, 30), then [30, 40); the horizon 15 s: the first expired.
    Readers leave it out at once; the keeping task whose range it is in (half of its rows
    expired) snapshots its range without it; a chunk already expired is not kept."""
    monkeypatch.setattr(side_input_files, "_CACHE", side_input_files._ReadFiles())
    a, b, c, d = (_chunk(n, end_s=e) for n, e in ((b"a", 10), (b"b", 20), (b"c", 30), (b"d", 40)))
    horizon = 15_000_000
    with open_store(str(tmp_path)) as store:
        root, state = store.storage.root, store.pipeline("p")
        first = [_keep(root, None, 0, 0, [a, b]), _keep(root, None, 0, 1, [c])]
        cid = state.checkpoint(fingerprint="f", metadata=LAYOUT, commit_messages=first)
        committed = state.task_owned_state(NS)
        files = SideInputFiles(root, "p", NS, files_of(committed, (), 128), 3)
        assert side_input_chunks(files) == [a, b, c]
        expiring = dataclasses.replace(files, horizon=horizon)
        assert side_input_chunks(expiring) == [b, c]  # the reader drops it at once
        assert side_input_chunks(files) == [a, b, c]  # a horizon that went back: read anew

        late = _chunk(b"late", end_s=10)
        second = [_keep(root, cid, 1, 0, [d, late], expiring), _keep(root, cid, 1, 1, [], expiring)]
        assert [s.namespace for s in second[0].snapshots] == [NS]  # half its range expired
        assert second[1].snapshots == ()  # nothing of its range did
        state.checkpoint(fingerprint="f", metadata=LAYOUT, commit_messages=second)
        assert state.task_owned_state(NS).entries == 3
        kept = [state_layout.decode_side_row(v, NS) for v in state.read_task_owned(NS).values()]
        assert sorted(chunk for _, chunk, _ in kept) == sorted([b, c, d])
        assert sorted(end for *_, end in kept) == [20_000_000, 30_000_000, 40_000_000]
    assert side_input_files.window_end(GlobalWindow()) == state_layout.END_NEVER


def assert_kept_by_tasks(url: str, monkeypatched: list) -> None:
    """After a streaming run on the store at ``url``: the side-input jobs returned only commit
    records and ends of what they keep (``monkeypatched``: what `record_side_input_jobs`
    saw), the last checkpoint has the side input in a task-owned namespace, and the driver's
    table holds none of it."""
    assert monkeypatched and all(
        isinstance(r, CommitRecord)
        or (isinstance(r, SideInputHeld) and isinstance(r.latest, int | None))
        for r in monkeypatched
    )
    with open_store(url, break_lock=True) as store:
        (pipeline,) = store.list_pipelines()
        latest = store.list_checkpoints(pipeline)[-1]
        manifest = store.load_manifest(pipeline, latest.checkpoint_id)
        kept = [ns for ns in manifest.task_state.namespaces if ns.startswith("side-rows/")]
        assert len(kept) == 1 and manifest.task_state.namespaces[kept[0]].entries >= 1
        state = store.pipeline(pipeline)
        state.restore()
        assert [ns for ns, _, _ in state.items() if ns.startswith("side-input/")] == []
        values = list(state.read_task_owned(kept[0]).values())
        state.close()
    assert b"".join(state_layout.decode_side_row(v, kept[0])[1] for v in values)  # Beam-encoded


def record_side_input_jobs(monkeypatch) -> list:
    """What the driver's side-input jobs return, as a list filled while the test runs."""
    collected: list = []
    real = side_input_store.run_guarded

    def run_guarded(stage_id, action, describe=None):
        got = real(stage_id, action, describe)
        collected.extend(got)
        return got

    monkeypatch.setattr(side_input_store, "run_guarded", run_guarded)
    return collected


def _decoded(coder, chunks: list[bytes]) -> dict:
    """window -> the values of the view's chunks."""
    out: dict = {}
    for chunk in chunks:
        stream = create_InputStream(chunk)
        while stream.size() > 0:
            value = coder.get_impl().decode_from_stream(stream, True)
            out.setdefault(value.windows[0], []).append(value.value)
    return out


def test_a_triggered_side_inputs_view_is_kept_per_window_and_later_firings_replace_it(
    tmp_path, executor_dir, monkeypatch
):
    monkeypatch.setattr(side_input_files, "_CACHE", side_input_files._ReadFiles())
    coder = coders.WindowedValueCoder(coders.VarIntCoder(), coders.IntervalWindowCoder())
    context = pipeline_context.PipelineContext()
    coder_id = context.coders.get_id(coder)
    components = SimpleNamespace(value=context.to_runner_api().SerializeToString())
    register_plan("view-plan", components.value)
    w1, w2 = IntervalWindow(0, 5), IntervalWindow(5, 10)
    ns = state_layout.side_view("buf")

    def pane(index: int) -> PaneInfo:
        return PaneInfo(index == 0, False, PaneInfoTiming.EARLY, index, -1)

    def encoded(*values) -> bytes:
        return b"".join(coder.get_impl().encode_nested(v) for v in values)

    def keep(root, cid, round_no, *values):
        rows = side_input_view.window_keyed("view-plan", components, coder_id, [encoded(*values)])
        spec = StateRound(
            pipeline="p", url=root, checkpoint_id=cid, round_no=round_no, parallelism=1,
            max_key_groups=128,
        )  # fmt: skip
        writer = open_staged_writer(root, "p", "side:buf", round_no, 0, 0, max_key_groups=128)
        (record,) = side_input_view.keeping_view(
            spec, "buf", "view-plan", components, coder_id, 0, rows, writer
        )
        return record.message

    with open_store(str(tmp_path)) as store:
        root, state = store.storage.root, store.pipeline("p")
        fired = [(100, 2, w1), (400, 7, w2), (7, 3, w1)]
        values = (WindowedValue(v, t, (w,), pane(0)) for v, t, w in fired)
        first = keep(root, None, 0, *values)
        files = SideInputFiles(root, "p", ns, files_of(None, first.files, 128), 2, view=True)
        assert _decoded(coder, side_input_chunks(files)) == {w1: [100, 7], w2: [400]}
        cid = state.checkpoint(fingerprint="f", metadata=LAYOUT, commit_messages=[first])
        assert list(state.items(ns)) == []  # the driver holds handles only
        committed = state.task_owned_state(ns)
        assert committed is not None and committed.entries == 2  # a key per window

        second = keep(root, cid, 1, WindowedValue(0, 4, (w1,), pane(1)))  # W1 fires again
        parts = files_of(committed, second.files, 128)
        files = SideInputFiles(root, "p", ns, parts, 2, view=True)
        assert _decoded(coder, side_input_chunks(files)) == {w1: [0], w2: [400]}

"""Pushed-back input is task-owned: the driver knows which stages hold rows by their handles.

The check runs after every committed round of a pipeline with side inputs; it reads no row
(before, the rows were in the driver's table and the check read their namespaces). The rows
are kept by the tasks that held them, in their key groups; the round that finds the side
inputs ready reads them back by key group and drops them from its checkpoint.
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from sparkbeam.checkpoint import open_staged_writer, open_store, state_layout
from sparkbeam.runner.streaming import pushback
from sparkbeam.runner.task import task_range
from sparkbeam.runner.task.records import CommitRecord, WarningRecord
from sparkbeam.runner.task.staged_state import StateRound
from tests.checkpoint.test_task_owned_state import Reads

LAYOUT = {state_layout.LAYOUT_KEY: state_layout.LAYOUT_VERSION}


def _stage(stage_id: str, side_inputs=("si",)):
    return SimpleNamespace(id=stage_id, side_inputs=list(side_inputs))


def _spec(root: str, cid, parallelism: int = 2) -> StateRound:
    return StateRound(
        pipeline="p", url=root, checkpoint_id=cid, round_no=0, parallelism=parallelism,
        max_key_groups=128,
    )  # fmt: skip


def _hold(root: str, subtask: int, rows: list) -> object:
    """One task of a held round: its data rows kept, a carried report passed on."""
    writer = open_staged_writer(root, "p", "hold:held", 0, subtask, 0, max_key_groups=128)
    report = WarningRecord("upstream", "builtins:UserWarning", "carried")  # a report
    out = list(pushback.hold_rows(_spec(root, None), "held", subtask, [*rows, report], writer))
    assert out[:-1] == [report]
    assert isinstance(out[-1], CommitRecord)
    return out[-1].message


def test_held_rows_are_task_owned_found_by_handle_read_back_by_key_group_and_dropped(
    tmp_path, executor_dir, monkeypatch
):
    stages = [_stage("held"), _stage("ready"), _stage("plain", side_inputs=())]
    rows = {sub: [("t", b"element-%d-%d" % (sub, i)) for i in range(5)] for sub in range(2)}
    with open_store(str(tmp_path)) as store:
        root, state = store.storage.root, store.pipeline("p")
        reads = Reads(store.storage, monkeypatch)
        assert pushback.pending(state, stages) == set()
        messages = [_hold(root, sub, rows[sub]) for sub in range(2)]
        cid = state.checkpoint(fingerprint="f", metadata=LAYOUT, commit_messages=messages)
        assert reads.staged() == []  # the commit read no row ...
        assert list(state.items(pushback.namespace("held"))) == []  # ... and holds none
        assert pushback.pending(state, stages) == {"held"}
        back: Counter = Counter()
        for parallelism in (1, 2, 4):  # the ready round reads each row once, at any parallelism
            got = Counter(
                row
                for sub in range(parallelism)
                for row in task_range.read_rows(
                    _spec(root, cid, parallelism), pushback.namespace("held"), sub
                )
            )
            assert got == Counter(r for sub in rows for r in rows[sub])
            back = got
        assert sum(back.values()) == 10
        state.drop_task_owned(pushback.namespace("held"))  # taken whole by the ready round
        assert pushback.pending(state, stages) == set()
        cid = state.checkpoint(fingerprint="f", metadata=LAYOUT)
        assert pushback.namespace("held") not in store.load_manifest("p", cid).task_state.namespaces

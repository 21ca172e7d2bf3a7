"""Which stages have input pushed back: read from their pushback namespaces, not the table.

The check runs after every committed round of a pipeline with side inputs; before, it walked
the driver's whole state table (every side input's chunks too) to find pushback rows."""

from __future__ import annotations

from types import SimpleNamespace

from sparkbeam.checkpoint import open_store, state_layout
from sparkbeam.runner.streaming import pushback


def _stage(stage_id: str, side_inputs=("si",)):
    return SimpleNamespace(id=stage_id, side_inputs=list(side_inputs))


def test_the_pushback_check_reads_only_the_pushback_namespaces(tmp_path):
    with open_store(str(tmp_path)) as store:
        state = store.pipeline("p")
        for i in range(2000):  # a large side input in the driver's table
            state.put(state_layout.side_input("si"), b"%d" % i, b"chunk")
        row = state_layout.encode_row("t", b"element")
        state.put(state_layout.pushback("held"), state_layout.row_key(0, 0, 0), row)
        walked = []
        snapshot = state.table.snapshot

        def counting(*args, **kwargs):
            for entry in snapshot(*args, **kwargs):
                walked.append(entry)
                yield entry

        state.table.snapshot = counting  # the real table, its whole walks counted
        stages = [_stage("held"), _stage("ready"), _stage("plain", side_inputs=())]
        assert pushback.pending(state, stages) == {"held"}
        assert walked == []

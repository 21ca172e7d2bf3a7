"""Streaming side inputs: hold a stage's main input back until its side inputs are ready.

In batch a side input is complete before its consumer runs. In streaming it fills over
rounds, so a consumer that ran at once would see it empty — Beam's ``WriteToText``
finalizes its files through side inputs that only fill when its GroupByKey fires, and
would finalize nothing. As in Beam's runners, a side input is *ready* once data has
arrived for it or its watermark is at +infinity (nothing more can come); until every side
input of a stage is ready, the stage's main input is pushed back: its tasks stage the rows
into the round's checkpoint (namespace ``pushback/<stage>``) instead of processing them,
and a later round feeds them back once the side inputs are ready. While rows are pushed
back the stage holds its output watermark at -infinity, so nothing downstream fires
windows those rows belong to.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from sparkbeam.checkpoint import state_layout
from sparkbeam.runner.streaming import watermarks
from sparkbeam.runner.task.range_staging import staged_writer_for_task
from sparkbeam.runner.task.records import CommitRecord, is_report

PREFIX = state_layout.PUSHBACK_PREFIX
namespace = state_layout.pushback


def ready(stage, side_values: dict, marks: watermarks.RoundWatermarks) -> bool:
    """Every side input of ``stage`` has data, or a watermark at +infinity."""
    return all(
        side_values.get(si.buffer) or marks.buffer_output.get(si.buffer) == watermarks.MAX
        for si in stage.side_inputs
    )


def pending(state, stages) -> set[str]:
    """The ``stages`` (those with side inputs) with rows pushed back in the pipeline's state;
    reads only their pushback namespaces, not the whole table (its side inputs...)."""
    return {s.id for s in stages if s.side_inputs and next(state.items(namespace(s.id)), None)}


def take(state, stage_id: str) -> list[tuple[str, bytes]]:
    """The rows pushed back for ``stage_id``, in order, removed from the state."""
    ns = namespace(stage_id)
    entries = sorted(state.items(ns), key=lambda e: e[1])
    rows = []
    for _, key, value in entries:
        rows.append(state_layout.decode_row(value, ns))
        state.delete(ns, key)
    return rows


def hold_rows(
    url: str, pipeline: str, stage_id: str, round_no: int, max_key_groups: int, rows: Iterable
) -> Iterator:
    """Task side: stage the data rows for the round's checkpoint; carried reports pass on."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    writer = staged_writer_for_task(url, pipeline, f"hold:{stage_id}", round_no, max_key_groups)
    seq = 0
    for row in rows:
        if not is_report(row):  # a data row: (transform, bytes)
            transform, data = row
            key = state_layout.row_key(round_no, partition, seq)
            writer.put(namespace(stage_id), key, state_layout.encode_row(transform, data))
            seq += 1
        else:
            yield row
    yield CommitRecord(f"hold:{stage_id}", writer.finish())

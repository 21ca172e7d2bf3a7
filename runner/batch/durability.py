"""Batch durability with --checkpoint_dir: commit each SDF round, resume after a kill.

What survives a driver kill (seed 000's "completed work is not redeployed"):
- a stage's consumed input, as the completed-work marker ``<stage>:input``;
- its pending residuals and timers (``sdf-residual/<stage>`` state, written by
  the checkpoint handler);
- the output chunks of its committed rounds, staged by the tasks that made
  them (``stage-output/<stage>``) and named by the round's checkpoint — the
  two-phase commit of DESIGN.md: tasks stage, the driver commits exactly the
  successful attempts, a killed round leaves only unnamed garbage.
On restart a stage whose input is consumed skips round 0, its producers are
not run at all, and it continues from its pending residuals.

A job whose last checkpoint is finished is not run again by accident
(``sparkbeam.runner.rounds.compatibility.refuse_finished_rerun``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

from sparkbeam.checkpoint import state_layout

OUTPUT_PREFIX = state_layout.STAGE_OUTPUT_PREFIX
FINISHED = state_layout.FINISHED
_LOG = logging.getLogger(__name__)


input_marker = state_layout.input_marker
output_namespace = state_layout.stage_output


def stage_outputs_durably(
    records: Iterable, url: str, pipeline: str, stage_id: str, round_no: int, max_key_groups: int
) -> Iterator:
    """Task side: pass records through, staging every output chunk; end with the commit message."""
    from sparkbeam.runner.task.range_staging import staged_writer_for_task
    from sparkbeam.runner.task.records import CommitRecord, OutputRecord

    writer = staged_writer_for_task(url, pipeline, stage_id, round_no, max_key_groups)
    namespace = output_namespace(stage_id)
    seq = 0
    for record in records:
        if isinstance(record, OutputRecord):
            key = state_layout.row_key(round_no, writer.partition, seq, round_width=8)
            writer.put(namespace, key, state_layout.encode_row(record.buffer, record.data))
            seq += 1
        yield record
    yield CommitRecord(stage_id, writer.finish())


def restored_outputs(state, stage_id: str) -> list[tuple[str, bytes]]:
    """(buffer, chunk) of every committed output chunk of a stage, in commit order."""
    rows = []
    namespace = output_namespace(stage_id)
    for _, key, value in state.items(namespace):
        rows.append((key, *state_layout.decode_row(value, namespace)))
    rows.sort()
    return [(buffer, data) for _, buffer, data in rows]

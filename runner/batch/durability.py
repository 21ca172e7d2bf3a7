"""Batch durability with --checkpoint_dir: commit each SDF round, resume after a kill.

What survives a driver kill (seed 000's "completed work is not redeployed"):
- a stage's consumed input, as the completed-work marker ``<stage>:input``;
- its pending residuals and timers (``sdf-residual/<stage>`` state, written by
  the checkpoint handler);
- the output chunks of its committed rounds, kept by the tasks that made
  them in their key groups (``stage-output/<stage>``,
  ``runner.task.stage_outputs``) and named by the round's checkpoint — the
  two-phase commit of DESIGN.md: tasks stage, the driver commits exactly the
  successful attempts' handles, a killed round leaves only unnamed garbage.
On restart a stage whose input is consumed skips round 0, its producers are
not run at all, its tasks read its committed chunks back, and it continues
from its pending residuals.

A job whose last checkpoint is finished is not run again by accident
(``sparkbeam.runner.rounds.compatibility.refuse_finished_rerun``).
"""

from __future__ import annotations

from sparkbeam.checkpoint import state_layout

FINISHED = state_layout.FINISHED
input_marker = state_layout.input_marker

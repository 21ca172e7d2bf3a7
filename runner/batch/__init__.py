"""Batch runs: the plan's stages as Spark jobs, SDF stages in rounds until nothing is pending.

``executor`` walks the plan; ``stage_rdd`` builds the RDD of one run of a stage; an SDF stage
runs in the shared round loop (``rounds.loop.RoundLoop``) over ``stage_rounds.StageRounds``
(round 0 over its input, later rounds over its due residuals).

Durability with ``--checkpoint_dir``: each SDF round commits, and a killed run resumes. What
survives a driver kill (seed 000's "completed work is not redeployed"): a stage's consumed
input, as the completed-work marker ``<stage>:input``; its pending residuals and timers
(``sdf-residual/<stage>`` state, written by the checkpoint handler); the output chunks of its
committed rounds, kept by the tasks that made them in their key groups
(``stage-output/<stage>``, ``rounds.task_body``), staged with its residuals in one
writer and named by the round's checkpoint -- the two-phase commit of DESIGN.md: tasks stage,
the driver commits exactly the successful attempts' handles, a killed round leaves only
unnamed garbage. On restart a stage whose input is consumed skips round 0, its producers are
not run at all, its tasks read its committed chunks back (``stage_rdd.reading_outputs``), and
it continues from its pending residuals. A job whose last checkpoint is finished is not run
again by accident (``runner.rounds.compatibility.refuse_before_start``).
"""

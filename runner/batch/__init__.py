"""Batch runs: the plan's stages as Spark jobs, SDF stages in rounds until nothing is pending.

``executor`` walks the plan; ``stage_rdd`` builds the RDD of one run of a stage; an SDF stage
runs in the shared round loop (``rounds.loop.RoundLoop``) over ``stage_rounds.StageRounds``.

With ``--checkpoint_dir`` each SDF round commits (tasks stage, the driver commits exactly the
successful attempts' handles: a killed round leaves only unnamed garbage) and a killed run
resumes: a stage whose input a committed round consumed (marker ``<stage>:input``) skips
round 0 and its producers, its tasks read its committed output chunks back
(``stage-output/<stage>``, ``stage_rdd.reading_outputs``), and it continues from its pending
residuals (``sdf-residual/<stage>``). A finished job is not run again by accident
(``runner.rounds.compatibility.refuse_before_start``).
"""

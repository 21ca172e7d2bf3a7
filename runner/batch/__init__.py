"""Batch runs: the plan's stages as Spark jobs, SDF stages in rounds until nothing is pending.

``executor`` walks the plan; ``stage_rdd`` builds the RDD of one run of a stage; an SDF stage
runs in the shared round loop (``rounds.loop.RoundLoop``) over ``stage_rounds.StageRounds``
(round 0 over its input, later rounds over its due residuals); ``durability`` stages round
outputs in the store and resumes a killed run.
"""

"""Batch runs: the plan's stages as Spark jobs, SDF stages in rounds until nothing is pending.

``executor`` walks the plan and runs each SDF stage's round loop (one job, one
``rounds.ledger.RoundLedger``, one checkpoint per round), ``stage_rounds`` keeps a stage's round
number and feeds its due residuals back, ``durability`` stages round outputs in the store and
resumes a killed run.
"""

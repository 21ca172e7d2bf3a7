"""Batch runs: the plan's stages as Spark jobs, SDF stages in rounds until nothing is pending.

``executor`` walks the plan, ``stage_rounds`` runs one SDF stage in rounds, ``durability``
commits each round to the store and resumes a killed run.
"""

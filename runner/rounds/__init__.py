"""What batch and streaming rounds share: the one round loop and its parts.

A round (``loop.RoundLoop``): ``feed`` pops the due residuals, the side's ``RoundJob`` runs
one Spark job, whose tasks' reports a ``ledger`` absorbs and commits as one checkpoint; then
the loop waits for the next round. ``context``: the run's frozen ``RunContext``; ``edges``:
the plan's edges as Spark operations; ``sink_files``, ``startpoints``: what commits with a
round; ``compatibility``: which checkpoint a changed pipeline may restore.
"""

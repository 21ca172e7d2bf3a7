"""What batch and streaming rounds share on the driver: the one round loop and its parts.

A round, batch or streaming (``loop.RoundLoop``): ``feed`` pops the residuals that are due, the
side's ``RoundJob`` runs one Spark job, the tasks' typed reports
(``sparkbeam.runner.task.records``) are absorbed into a ``ledger`` (``RoundLedger``), which
commits one checkpoint carrying a ``RoundMetadata`` record; then the loop waits for the next
round. ``context`` is the frozen ``RunContext`` every loop and job of a run reads. ``edges``
turns the plan's edges into Spark operations, ``sink_files`` commits sink files with a round's
checkpoint, ``startpoints`` applies startpoints at round barriers, ``compatibility`` decides
which checkpoint a changed pipeline may restore.
"""

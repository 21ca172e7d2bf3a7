"""What batch and streaming rounds share on the driver.

A round, batch or streaming: ``feed`` pops the residuals that are due, one Spark job runs, the
tasks' typed reports (``sparkbeam.runner.task.records``) are absorbed into a ``ledger``
(``RoundLedger``), which commits one checkpoint carrying a ``RoundMetadata`` record.
``edges`` turns the plan's edges into Spark operations, ``sink_files`` commits sink files with a
round's checkpoint, ``startpoints`` applies startpoints at round barriers, ``compatibility``
decides which checkpoint a changed pipeline may restore.
"""

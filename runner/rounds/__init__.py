"""What batch and streaming rounds share on the driver.

``edges`` turns the plan's edges into Spark operations, ``sink_files`` commits sink files with a
round's checkpoint, ``startpoints`` applies startpoints at round barriers, ``compatibility``
decides which checkpoint a changed pipeline may restore.
"""

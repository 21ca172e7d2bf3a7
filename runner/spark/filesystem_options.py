"""The pipeline's filesystem options in every Spark task, through a Spark local property.

The driver sets the encoded values of Beam's filesystem option groups
(``sparkbeam.checkpoint.filesystem_options``) as a local property on each thread that runs jobs
(`use_in_jobs`); Spark sends it with every task, where `apply_in_task` applies it, so it works
on a cluster. The property's name contains ``secret``: Spark's default
``spark.redaction.regex`` hides its value (``--s3_secret_access_key``...) in event logs.
Leaves to others: what the options mean (Beam's filesystems).
"""

from __future__ import annotations

from sparkbeam.checkpoint.filesystem_options import apply, collect, encode

PROPERTY = "sparkbeam.secret.filesystem_options"
"""Spark local property holding the encoded filesystem options."""


def use_in_jobs(sc, encoded: str) -> None:
    """Driver: apply the options here and send them with every job this thread runs."""
    apply(encoded)
    sc.setLocalProperty(PROPERTY, encoded)


def apply_in_driver(options) -> str:
    """Apply a ``PipelineOptions``' filesystem options in this process (the store is opened
    before Spark starts); returns the encoded value for `use_in_jobs`."""
    encoded = encode(collect(options))
    apply(encoded)
    return encoded


def apply_in_task() -> None:
    """Task: apply the options its job carries; outside a Spark task, or in a job without the
    property (Spark Connect's: the DataFrame plane applies them itself), nothing."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    encoded = ctx.getLocalProperty(PROPERTY) if ctx is not None else None
    if encoded is not None:
        apply(encoded)

"""Typed records that cross the Spark task boundary.

A stage's Spark partition yields these, never positional streams: data for an output buffer
(``OutputRecord``) and *reports* for the driver (metrics, warnings, residuals, commit
messages, sink files, startpoints met, what keyed state holds). ``is_report`` is the one test
that tells a report from data, in batch and streaming alike; the driver absorbs reports into
a ``RoundLedger`` (``sparkbeam.runner.rounds.ledger``).
"""

from __future__ import annotations

from typing import NamedTuple

from sparkbeam.sdf.residuals import ResidualRecord
from sparkbeam.sdf.startpoints.applier import StartpointOutcome


class OutputRecord(NamedTuple):
    """A chunk of Beam-encoded windowed values written to one output buffer."""

    buffer: str
    data: bytes


class MetricsRecord(NamedTuple):
    """The consolidated MonitoringInfos of every bundle one task ran."""

    stage: str
    monitoring_infos: tuple[bytes, ...]  # serialized metrics_pb2.MonitoringInfo


class WarningRecord(NamedTuple):
    """A Python warning raised by user or SDK code in a task, re-issued on the driver."""

    stage: str
    category: str  # "module:QualName" of the warning class
    message: str


class CommitRecord(NamedTuple):
    """The commit message of a task's staged checkpoint writes (two-phase commit)."""

    stage: str
    message: object  # sparkbeam.checkpoint.CommitMessage


class SinkFilesRecord(NamedTuple):
    """Files a task staged for exactly-once sinks: renamed only if its attempt is committed."""

    stage: str
    pairs: tuple[tuple[str, str], ...]  # (staged path, final path)


class GroupReport(NamedTuple):
    """What one streaming GroupByKey task tells the driver after its round."""

    buffer: str
    partition: int
    keys: int  # keys with state after the round
    hold_micros: int  # earliest watermark hold of buffered panes (MAX: none)
    next_processing_ms: float | None  # earliest processing-time timer, if any


class KeyedStateReport(NamedTuple):
    """What one streaming stateful task tells the driver after its round."""

    stage: str
    partition: int
    keys: int  # keys with state or timers after the round
    timers: int  # pending timers
    hold_micros: int  # earliest output-timestamp hold of a pending timer (MAX: none)
    next_processing_ms: float | None


class ResidualReport(NamedTuple):
    """What one SDF task's key groups hold of residuals after its round (it keeps them)."""

    stage: str
    partition: int
    pending: int  # residuals kept after the round
    next_fire_ms: int | None  # the earliest residual timer, if any
    hold_micros: int | None  # the earliest residual's watermark hold, if any
    fired: int  # residuals this task fed back this round


REPORT_TYPES: tuple[type, ...] = (
    MetricsRecord,
    WarningRecord,
    CommitRecord,
    SinkFilesRecord,
    ResidualRecord,
    StartpointOutcome,
    GroupReport,
    KeyedStateReport,
    ResidualReport,
)
"""Every report a task may hand the driver: the allow-list ``is_report`` checks."""


def is_report(record) -> bool:
    """A report for the driver (not data): the one predicate, batch and streaming alike."""
    return isinstance(record, REPORT_TYPES)


class ReportKey(NamedTuple):
    """The shuffle key of a carried report (data keys are bytes); ``spread`` (the sending
    partition) spreads reports over the receiving tasks."""

    spread: int


def is_report_key(key) -> bool:
    """A shuffled pair's key that carries a report rather than a data element."""
    return isinstance(key, ReportKey)

"""Typed records that cross the Spark task boundary.

A stage's Spark partition yields these, never positional streams: data for
an output buffer, the bundle metrics of the task, (for SDF stages) the
residuals the task could not finish, and the files it staged for sinks.
"""

from __future__ import annotations

from typing import NamedTuple


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

"""The round ledger: what one round's task reports add up to, and its metadata record.

``RoundLedger.absorb`` sorts a round's typed reports (``sparkbeam.runner.task.records``) once:
warnings are re-issued, commit messages, sink files and startpoint outcomes wait for the
round's checkpoint, residuals and residual reports go to their stage's keeper (``feed``),
metrics to the result. ``RoundMetadata`` is the record each round's checkpoint carries (its
manifest's metadata keys).

Leaves to others: running the job (the batch and streaming loops), writing the checkpoint
(``PipelineStore.checkpoint``), deleting consumed startpoints (``rounds.startpoints``).
"""

from __future__ import annotations

import importlib
import warnings
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from apache_beam.portability.api import metrics_pb2

from sparkbeam.checkpoint.state_layout import FINISHED
from sparkbeam.runner.rounds import sink_files
from sparkbeam.runner.rounds.startpoints import commit_round
from sparkbeam.runner.task.records import (
    CommitRecord,
    GroupReport,
    KeyedStateReport,
    MetricsRecord,
    ResidualReport,
    SinkFilesRecord,
    WarningRecord,
)
from sparkbeam.sdf import ResidualRecord
from sparkbeam.sdf.startpoints.applier import StartpointOutcome


@dataclass
class RoundLedger:
    """Every report of one round, sorted by what the driver does with it."""

    commits: list = field(default_factory=list)  # CommitMessages for the checkpoint
    sink_files: list[tuple[str, str]] = field(default_factory=list)  # (staged, final)
    outcomes: list[StartpointOutcome] = field(default_factory=list)
    residuals: dict[str, list[ResidualRecord]] = field(default_factory=lambda: defaultdict(list))
    residual_reports: dict[str, list[ResidualReport]] = field(
        default_factory=lambda: defaultdict(list)
    )  # SDF tasks that keep their residuals: what each range holds after the round
    metrics: dict[str, list] = field(default_factory=lambda: defaultdict(list))  # MonitoringInfo
    groups: list[GroupReport] = field(default_factory=list)
    keyed: list[KeyedStateReport] = field(default_factory=list)
    commit_stages: list[str] = field(default_factory=list)  # the stage of each commit message

    def absorb(self, reports: Iterable[Any]) -> RoundLedger:
        """Take a round's reports (re-issuing its warnings on the driver); returns self."""
        warned = []
        for rec in reports:
            if isinstance(rec, CommitRecord):
                self.commits.append(rec.message)
                self.commit_stages.append(rec.stage)
            elif isinstance(rec, ResidualRecord):
                self.residuals[rec.stage].append(rec)
            elif isinstance(rec, ResidualReport):
                self.residual_reports[rec.stage].append(rec)
            elif isinstance(rec, SinkFilesRecord):
                self.sink_files.extend(rec.pairs)
            elif isinstance(rec, StartpointOutcome):
                self.outcomes.append(rec)
            elif isinstance(rec, MetricsRecord):
                self.metrics[rec.stage].extend(
                    metrics_pb2.MonitoringInfo.FromString(b) for b in rec.monitoring_infos
                )
            elif isinstance(rec, GroupReport):
                self.groups.append(rec)
            elif isinstance(rec, KeyedStateReport):
                self.keyed.append(rec)
            elif isinstance(rec, WarningRecord):
                warned.append(rec)
        reissue_warnings(warned)
        return self

    def residual_count(self) -> int:
        return sum(len(v) for v in self.residuals.values())

    def commit(
        self,
        state,
        session,
        metadata: RoundMetadata,
        *,
        fingerprint: str,
        parallelism: int,
        plan_metadata: Mapping[str, Any],
    ) -> int:
        """The one commit path of a round, batch and streaming alike; returns the checkpoint id.

        Step 1. The round's sink files go into the state this checkpoint commits (published
        after it, or on restore if the driver dies in between).
        Step 2. One checkpoint: the tasks' commit messages, the round's metadata, the
        startpoints it consumed (deleted once it has committed) and ``plan_metadata``
        (what a restore checks, ``RestoreGuard.metadata``)."""
        sink_files.record_pending(state, self.sink_files)
        meta = metadata.to_dict()
        return commit_round(
            session,
            self.outcomes,
            lambda consumed: state.checkpoint(
                fingerprint=fingerprint,
                parallelism=parallelism,
                metadata={**meta, **consumed, **plan_metadata},
                commit_messages=list(self.commits),
            ),
        )


@dataclass
class RoundMetadata:
    """What a round's checkpoint records about the round (the manifest's metadata): batch sets
    ``stage`` and ``watermark_hold_micros``, streaming the group and stateful fields."""

    round_no: int
    pending_residuals: int
    next_timer_ms: float | None
    stage: str | None = None  # batch: the SDF stage whose round this was
    watermark_hold_micros: int | None = None  # batch: the stage's residual hold
    group_holds: dict[str, int] | None = None  # streaming: GroupByKey -> hold (micros)
    group_keys: dict[str, int] = field(default_factory=dict)  # GroupByKey -> keys with state
    group_watermarks: dict[str, int] = field(default_factory=dict)  # GroupByKey -> input wm
    stateful: dict[str, dict] = field(default_factory=dict)  # stage -> keys/timers/hold/wm
    watermark_micros: int | None = None  # streaming: the sources' watermark
    finished: bool = False  # streaming: nothing left to do after this round
    test_stream: dict | None = None  # streaming: the TestStream's position (``test_stream``)
    residuals: dict[str, dict] | None = None  # SDF stage -> its residuals' summary (``feed``)

    def to_dict(self) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "round": self.round_no,
            "pending_residuals": self.pending_residuals,
            "next_timer_ms": self.next_timer_ms,
        }
        if self.group_holds is None:
            meta.update(stage=self.stage, watermark_hold_micros=self.watermark_hold_micros)
        else:
            meta.update(
                group_holds=self.group_holds,
                group_keys=self.group_keys,
                group_watermarks=self.group_watermarks,
                stateful=self.stateful,
                watermark_micros=self.watermark_micros,
            )
            if self.test_stream is not None:
                meta["test_stream"] = self.test_stream
            if self.finished:
                meta[FINISHED] = True
        if self.residuals is not None:
            meta["residuals"] = self.residuals
        return meta

    @classmethod
    def from_dict(cls, meta: Mapping[str, Any]) -> RoundMetadata:
        """The record of a restored manifest (``round_no`` -1 if it names no round)."""
        streaming = "group_holds" in meta
        return cls(
            round_no=int(meta.get("round", -1)),
            pending_residuals=int(meta.get("pending_residuals", 0)),
            next_timer_ms=meta.get("next_timer_ms"),
            stage=meta.get("stage"),
            watermark_hold_micros=meta.get("watermark_hold_micros"),
            group_holds=dict(meta["group_holds"]) if streaming else None,
            group_keys=dict(meta.get("group_keys", {})),
            group_watermarks=dict(meta.get("group_watermarks", {})),
            stateful=dict(meta.get("stateful", {})),
            watermark_micros=meta.get("watermark_micros"),
            finished=bool(meta.get(FINISHED)),
            test_stream=meta.get("test_stream"),
            residuals=meta.get("residuals"),
        )


def reissue_warnings(records: Iterable[WarningRecord]) -> None:
    """Re-issue each distinct worker warning on the driver, where users see it."""
    for record in dict.fromkeys(records):
        module, _, name = record.category.partition(":")
        try:
            category = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            category = RuntimeWarning
        warnings.warn(f"[{record.stage}] {record.message}", category, stacklevel=3)

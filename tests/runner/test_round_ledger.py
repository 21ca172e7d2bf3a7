"""The round ledger, its metadata record, the one report predicate and key ownership."""

from __future__ import annotations

import warnings

import pytest
from apache_beam.portability.api import metrics_pb2

from sparkbeam.checkpoint import key_group, key_group_range
from sparkbeam.runner.rounds.ledger import FINISHED, RoundLedger, RoundMetadata
from sparkbeam.runner.task.grouping import partition_for_key
from sparkbeam.runner.task.records import (
    CommitRecord,
    GroupReport,
    KeyedStateReport,
    MetricsRecord,
    OutputRecord,
    ReportKey,
    SinkFilesRecord,
    WarningRecord,
    is_report,
    is_report_key,
)
from sparkbeam.sdf import ResidualRecord


def _residual(stage: str) -> ResidualRecord:
    return ResidualRecord(stage, "read", b"elem", 0.0, 0.0, 0)


def test_is_report_tells_typed_reports_from_every_data_shape():
    assert is_report(CommitRecord("s", None))
    assert is_report(GroupReport("b", 0, 1, 0, None))
    assert is_report(KeyedStateReport("s", 0, 1, 0, 0, None))
    # Data: output chunks, raw chunks and (transform, element) rows, even of a report's length.
    assert not is_report(OutputRecord("b", b"x"))
    assert not is_report(b"chunk")
    assert not is_report(("read", b"element"))
    assert not is_report(("s", ("a", "b")))


def test_a_report_key_is_not_a_data_key_and_lands_by_its_spread():
    assert is_report_key(ReportKey(5)) and not is_report_key(b"key")
    assert partition_for_key(ReportKey(5), 3, 128) == 2


@pytest.mark.parametrize("parallelism", [1, 3, 7])
def test_a_key_is_owned_by_the_subtask_whose_key_groups_a_restore_reads(parallelism):
    for i in range(200):
        key = f"user-{i}".encode()
        owner = partition_for_key(key, parallelism, 128)
        assert key_group(key, 128) in key_group_range(owner, parallelism, 128)


def test_the_ledger_sorts_a_rounds_reports_and_reissues_warnings():
    info = metrics_pb2.MonitoringInfo(urn="beam:metric:element_count:v1").SerializeToString()
    reports = [
        CommitRecord("hold:s", "m1"),
        _residual("s"),
        _residual("s"),
        SinkFilesRecord("s", (("a.staged", "a"),)),
        MetricsRecord("s", (info,)),
        GroupReport("b", 0, 2, 5, 7.0),
        WarningRecord("s", "builtins:UserWarning", "careful"),
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ledger = RoundLedger().absorb(reports)
    assert [str(w.message) for w in caught] == ["[s] careful"]
    assert ledger.commits == ["m1"] and ledger.commit_stages == ["hold:s"]
    assert ledger.residual_count() == 2 and list(ledger.residuals) == ["s"]
    assert ledger.sink_files == [("a.staged", "a")]
    assert len(ledger.metrics["s"]) == 1 and ledger.groups[0].keys == 2


def test_batch_round_metadata_keeps_its_manifest_keys():
    meta = RoundMetadata(3, 2, 10.0, stage="s1", watermark_hold_micros=5)
    assert meta.to_dict() == {
        "stage": "s1",
        "round": 3,
        "pending_residuals": 2,
        "next_timer_ms": 10.0,
        "watermark_hold_micros": 5,
    }
    assert RoundMetadata.from_dict(meta.to_dict()) == meta


def test_streaming_round_metadata_round_trips_and_marks_a_finished_run():
    meta = RoundMetadata(
        0, 0, None, group_holds={"g": 1}, group_keys={"g": 2}, group_watermarks={"g": 3},
        stateful={"s": {"keys": 1}}, watermark_micros=9, finished=True,
    )  # fmt: skip
    d = meta.to_dict()
    assert d[FINISHED] is True and d["group_keys"] == {"g": 2} and d["round"] == 0
    assert RoundMetadata.from_dict(d) == meta
    assert RoundMetadata.from_dict({}).round_no == -1

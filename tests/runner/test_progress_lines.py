"""The lines an operator reads while a job runs: the watermark as -inf, +inf or an ISO time; a
batch run's line every few seconds naming the running Spark stage, its tasks and the elements
moved so far."""

from __future__ import annotations

import logging
import time

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils import timestamp

from sparkbeam.runner import progress
from tests.conftest import spark_test_options


@pytest.mark.parametrize(
    "micros, shown",
    [
        (timestamp.MIN_TIMESTAMP.micros, "-inf"),
        (timestamp.MAX_TIMESTAMP.micros, "+inf"),
        (GlobalWindow().max_timestamp().micros, "+inf"),
        (1764165600123456, "2025-11-26T14:00:00.123456Z"),
        (None, "-"),
    ],
)
def test_the_watermark_reads_as_infinity_or_an_iso_time(micros, shown):
    assert progress._watermark(micros) == shown


def _slow(x):
    time.sleep(1.5)
    return x


@pytest.mark.spark
def test_a_batch_run_prints_a_progress_line_while_it_runs(spark, monkeypatch, caplog, tmp_path):
    monkeypatch.setattr(progress, "BATCH_EVERY_S", 0.5)
    caplog.set_level(logging.INFO, logger="sparkbeam")
    out = str(tmp_path / "slow")
    with beam.Pipeline(options=PipelineOptions(spark_test_options("--parallelism=2"))) as p:
        slow = p | beam.Create([1, 2]) | beam.Reshuffle() | beam.Map(_slow)
        _ = slow | beam.Map(str) | beam.io.WriteToText(out)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("running for")]
    assert any(" tasks " in line for line in lines), lines
    # The elements the finished tasks moved between stages (the 2 read, reshuffled, mapped):
    counted = [
        int(line.rsplit("; ", 1)[1].split()[0].replace(",", ""))
        for line in lines
        if "so far" in line
    ]
    assert counted and max(counted) >= 2, lines
    started = [r.getMessage() for r in caplog.records if r.getMessage().startswith("running on")]
    assert started and "application " in started[0] and "checkpoint store none" in started[0]
    assert started[0].endswith(f"; output {out}"), started[0]

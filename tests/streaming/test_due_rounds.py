"""With default flags, a record produced into an idle streaming pipeline is visible about one
round after its source polls: rounds start when a timer is due, not on a 1 s beat (issue 45)."""

from __future__ import annotations

import random
import statistics
import time

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.io import WriteToFilesOnCheckpoint
from tests.conftest import spark_test_options
from tests.streaming.tail_source import tail, visible, write

pytestmark = [pytest.mark.spark, pytest.mark.slow]

POLL_S = 0.1  # the source's resume delay: it looks for new records this often
RECORDS = 5


def _visible_after(out: str, line: str, produced: float, limit_s: float = 60.0) -> float:
    while line not in visible(out):
        assert time.monotonic() - produced < limit_s, f"{line!r} never became visible"
        time.sleep(0.005)
    return time.monotonic() - produced


def _first_loop(result, limit_s: float = 120.0):
    deadline = time.monotonic() + limit_s
    while not getattr(result.executor, "loops", None):
        assert time.monotonic() < deadline, "the streaming job never started its round loop"
        time.sleep(0.1)
    return result.executor.loops[0]


def test_a_record_into_an_idle_pipeline_is_visible_within_a_round_and_half_a_second(
    spark, tmp_path
):
    data, out = str(tmp_path / "data"), str(tmp_path / "out")
    write(data, "a", 0, stop=10**6)
    options = PipelineOptions(
        spark_test_options("--streaming", f"--checkpoint_dir={tmp_path / 'ckpt'}")
    )  # the runner's default flags: no --checkpoint_interval_s
    p = beam.Pipeline(options=options)
    _ = tail(p, data, ["a"], delay_s=POLL_S) | WriteToFilesOnCheckpoint(out + "/out")
    result = p.run()
    try:
        loop = _first_loop(result)
        while len(loop.round_times) < 10:  # idle: the source polls an empty partition
            time.sleep(0.1)
        latencies = []
        for i in range(RECORDS):
            time.sleep(random.uniform(0.2, 0.6))  # arrive anywhere in a round's cycle
            produced = time.monotonic()
            write(data, "a", i + 1)
            latencies.append(_visible_after(out, f"a {i}", produced))
        rounds = list(loop.round_times)
    finally:
        result.cancel()
    round_p50 = statistics.median(r.job_s + r.commit_s for r in rounds[-50:])
    assert max(latencies) <= round_p50 + POLL_S + 0.5, (latencies, round_p50)

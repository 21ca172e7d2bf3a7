"""What the in-process streaming Kafka tests share: their options and the wait for an exact
output."""

from __future__ import annotations

import time
from collections import Counter

from apache_beam.options.pipeline_options import PipelineOptions

from tests.conftest import spark_test_options
from tests.io.kafka.kafka_pipeline import visible


def streaming_options(tmp_path) -> PipelineOptions:
    """``--streaming`` on the shared test session, a store under ``tmp_path``, short rounds."""
    return PipelineOptions(
        spark_test_options(
            "--streaming", f"--checkpoint_dir={tmp_path / 'ckpt'}", "--checkpoint_interval_s=0.05"
        )
    )


def wait_for_exactly(out_dir: str, expected: list[str], run, timeout_s: float = 120) -> None:
    """Until the visible lines are ``expected``, each once; fails at once on a line that is
    not expected or shows twice, and at the timeout naming what is missing and the job's state."""
    deadline = time.monotonic() + timeout_s
    while (seen := visible(out_dir)) != Counter(expected):
        assert not set(seen) - set(expected) and max(seen.values(), default=1) == 1, seen
        assert time.monotonic() < deadline, (sorted(set(expected) - set(seen)), run.state)
        time.sleep(0.2)

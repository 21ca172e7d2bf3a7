"""Key groups of a streaming job: more than 128 tasks, and a store that keeps its count.

A keyed stage's task owns whole key groups, so a new store gets key groups derived from the
parallelism (Flink's default max parallelism: a power of two, at least 1.5x it, at least 128).
Before, every store had 128 and ``--parallelism=200`` failed inside a Spark stage. A restored
pipeline keeps its checkpoints' key groups whatever the flags say; a parallelism above them
runs the keyed stages at that many tasks (one log line), and the output stays exact.
"""

from __future__ import annotations

import glob
import logging
import time

import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.runners.runner import PipelineState
from apache_beam.transforms import userstate

from sparkbeam.checkpoint import open_store
from sparkbeam.io import WriteToFilesOnCheckpoint
from tests.streaming.streaming_pipelines import expected_counts, windowed_counts
from tests.streaming.test_streaming import _options

pytestmark = pytest.mark.spark


def _key_groups(ckpt) -> set[int]:
    """The key groups every checkpoint of the store's one pipeline records."""
    with open_store(str(ckpt), read_only=True) as store:
        (pipeline,) = store.list_pipelines()
        return {c.max_key_groups for c in store.list_checkpoints(pipeline)}


class _CountPerKey(beam.DoFn):
    """Stateful: emits (key, how many elements of that key it has seen, this one included)."""

    SEEN = userstate.ReadModifyWriteStateSpec("seen", VarIntCoder())

    def process(self, kv, seen=beam.DoFn.StateParam(SEEN)):
        count = (seen.read() or 0) + 1
        seen.write(count)
        yield kv[0], count


@pytest.mark.slow  # 200 tasks in one round: about 10 s on 2 busy cores once Spark is warm
def test_parallelism_200_runs_a_keyed_streaming_job_exactly(spark, tmp_path):
    """One round of a stateful DoFn whose keyed shuffle has 200 tasks (no ``assert_that``: its
    own GroupByKey would add rounds of 200 tasks)."""
    data = [(f"k{i % 7}", i) for i in range(40)]
    with beam.Pipeline(options=_options(tmp_path, "--parallelism=200")) as p:
        _ = (
            p
            | beam.Create(data, reshuffle=False)
            | beam.ParDo(_CountPerKey())
            | WriteToFilesOnCheckpoint(str(tmp_path / "out" / "counts"), format_fn=repr)
        )
    per_key = {f"k{k}": len(range(k, 40, 7)) for k in range(7)}
    assert sorted(_lines(tmp_path)) == sorted(
        repr((k, c)) for k, n in per_key.items() for c in range(1, n + 1)
    )
    assert _key_groups(tmp_path / "ckpt") == {512}  # 1.5 x 200 rounded up to a power of two


def _lines(tmp_path) -> list[str]:
    lines = []
    for path in glob.glob(str(tmp_path / "out" / "counts-*")):
        with open(path) as f:
            lines += f.read().splitlines()
    return lines


def _write_counts(tmp_path, options, sources):
    p = beam.Pipeline(options=options)
    _ = windowed_counts(p, sources, per_round=5) | WriteToFilesOnCheckpoint(
        str(tmp_path / "out" / "counts")
    )
    return p.run()


def test_restore_keeps_the_store_key_groups_and_stays_exact(spark, tmp_path, caplog):
    """A store of 4 key groups, cancelled mid-way at parallelism 2, resumed with
    --parallelism=6 --max_key_groups=8: it keeps 4, runs 4 keyed tasks, loses nothing."""
    sources = [("a", 40), ("b", 25)]
    first = _write_counts(
        tmp_path, _options(tmp_path, "--parallelism=2", "--max_key_groups=4"), sources
    )
    (loop,) = first.executor.loops
    deadline = time.monotonic() + 120
    while loop.rounds_run < 3 and time.monotonic() < deadline:
        assert first.wait_until_finish(duration=100) == PipelineState.RUNNING
    assert first.cancel() == PipelineState.CANCELLED
    caplog.set_level(logging.WARNING, logger="sparkbeam.runner.streaming.pipeline")
    again = _options(tmp_path, "--parallelism=6", "--max_key_groups=8")
    assert _write_counts(tmp_path, again, sources).wait_until_finish() == PipelineState.DONE
    assert _key_groups(tmp_path / "ckpt") == {4}
    assert "state has 4 key groups, fewer than the parallelism 6" in caplog.text
    assert sorted(_lines(tmp_path)) == expected_counts(sources)  # each window once, none lost

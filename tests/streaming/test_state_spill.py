"""A keyed streaming job whose state is 4x the workers' memory budget runs exactly.

``--task_state_memory_mb=1`` and about 4 MB of user state per task: each round's task holds
its key-group range in the executor's RocksDB (``held_state``), extends it with the segments
committed since, and the output is exact. Before, a worker held every range it read as a dict
in memory (and read one larger than its cache whole every round)."""

from __future__ import annotations

import glob
import os
import time

import apache_beam as beam
import pytest
from apache_beam.coders import BytesCoder
from apache_beam.transforms import userstate

from sparkbeam.checkpoint import open_store
from sparkbeam.io import WriteToFilesOnCheckpoint
from sparkbeam.runner.task import shared_reads
from tests.streaming.streaming_pipelines import EventTimeOffsets
from tests.streaming.test_streaming import _options

pytestmark = pytest.mark.spark

KEYS = 400
PAD = 20_000  # bytes of state per key: 8 MB in all, 4 MB per task at --parallelism=2


class _PaddedCount(beam.DoFn):
    """Stateful: (key, elements of the key so far), keeping PAD bytes of state per key."""

    STATE = userstate.ReadModifyWriteStateSpec("padded", BytesCoder())

    def process(self, kv, state=beam.DoFn.StateParam(STATE)):
        blob = state.read()
        count = (int(blob[:8]) if blob else 0) + 1
        state.write(b"%08d" % count + bytes(PAD))
        yield kv[0], count


def _counts(options, tmp_path, count_fn, keys: int, n: int, per_round: int) -> list[str]:
    """Run ``n`` elements, ``per_round`` a round, over ``keys`` keys through the stateful
    ``count_fn``; the lines it wrote exactly once."""
    with beam.Pipeline(options=options) as p:
        _ = (
            p
            | beam.Create([("a", n)])
            | beam.ParDo(EventTimeOffsets(per_round=per_round, delay_s=0.01))
            | beam.Map(lambda kv: (f"k{kv[1] % keys}", kv[1]))
            | beam.ParDo(count_fn)
            | WriteToFilesOnCheckpoint(str(tmp_path / "out" / "counts"), format_fn=repr)
        )
    lines = []
    for path in glob.glob(str(tmp_path / "out" / "counts-*")):
        with open(path) as f:
            lines += f.read().splitlines()
    return lines


def _executor_dir(spark) -> str:
    """Where this session's Python workers keep what they share (their Spark local dir)."""
    return spark.sparkContext.parallelize([0], 1).map(lambda _: shared_reads.shared_dir()).first()


def test_state_four_times_the_budget_is_held_on_the_executors_disk_and_exact(spark, tmp_path):
    started = time.time()
    n = 2 * KEYS  # two elements per key, in four rounds
    options = _options(tmp_path, "--parallelism=2", "--task_state_memory_mb=1")
    lines = _counts(options, tmp_path, _PaddedCount(), KEYS, n, per_round=KEYS // 2)
    assert sorted(lines) == sorted(repr((f"k{k}", c)) for k in range(KEYS) for c in (1, 2))
    claims = [  # each a range a worker held on disk past the budget, and what it held
        path
        for path in glob.glob(os.path.join(_executor_dir(spark), "spilled", "*", "*.identity"))
        if os.path.getmtime(path) >= started
    ]
    assert claims


class _Count(beam.DoFn):
    """Stateful: (key, elements of the key so far)."""

    STATE = userstate.ReadModifyWriteStateSpec("count", BytesCoder())

    def process(self, kv, state=beam.DoFn.StateParam(STATE)):
        count = int(state.read() or b"0") + 1
        state.write(b"%d" % count)
        yield kv[0], count


def test_a_grown_range_is_snapshotted_in_the_background_and_the_output_is_exact(spark, tmp_path):
    """A range whose tail passes 16 segments is snapshotted by a thread of the worker, off
    the round (`background_snapshots`), and a later round commits it; the output is exact."""
    keys, rounds = 20, 24  # every key changes in every round, in both tasks' ranges
    options = _options(tmp_path, "--parallelism=2")
    lines = _counts(options, tmp_path, _Count(), keys, keys * rounds, per_round=keys)
    expected = [repr((f"k{k}", c)) for k in range(keys) for c in range(1, rounds + 1)]
    assert sorted(lines) == sorted(expected)
    store = open_store(str(tmp_path / "ckpt"), read_only=True)
    (pipeline,) = store.list_pipelines()
    bases = [
        f.name
        for c in store.list_checkpoints(pipeline)
        for ns in store.load_manifest(pipeline, c.checkpoint_id).task_state.namespaces.values()
        for r in ns.ranges
        for f in r.base
    ]
    assert any("-late-" in name for name in bases), bases

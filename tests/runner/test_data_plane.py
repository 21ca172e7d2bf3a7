"""The data planes (``runner.plane``): the DataFrame plane moves rows where the RDD plane does.

The DataFrame plane decides each row's partition in Python and lets Spark's hash partitioning
move it; these tests hold that to Spark's own hash and to the RDD plane's results.
"""

from __future__ import annotations

import functools

import pytest
from pyspark.sql import functions as F

from sparkbeam.runner.plane import plane_for
from sparkbeam.runner.plane.frames import FramePlane
from sparkbeam.runner.plane.rdd import RddPlane
from sparkbeam.runner.plane.spark_hash import hash_int, target_values

pytestmark = pytest.mark.spark


def test_hash_int_is_sparks_hash(spark):
    values = [*range(-50, 50), 2**31 - 1, -(2**31), 123456789]
    rows = (
        spark.createDataFrame([(v,) for v in values], "v int")
        .select("v", F.hash("v").alias("h"))
        .collect()
    )
    assert {r.v: r.h for r in rows} == {v: hash_int(v) for v in values}


@pytest.mark.parametrize("partitions", [1, 3, 7])
def test_frames_partition_by_places_each_key_where_the_partitioner_says(spark, partitions):
    plane = FramePlane(spark, connect=False)
    pairs = [(k, f"v{k}") for k in range(40)]
    placed = (
        plane.parallelize(pairs, 2)
        .partitionBy(partitions, _identity)
        .mapPartitionsWithIndex(_with_index)
        .collect()
    )
    assert sorted(placed) == sorted((k % partitions, k, v) for k, v in pairs)
    assert len(target_values(partitions)) == partitions


def test_frames_index_survives_a_union_and_reaches_empty_partitions(spark):
    """A union renumbers Spark's partitions; the index stays the partitionBy's, and a partition
    with no data still runs (a stateful task fires its timers there)."""
    plane = FramePlane(spark, connect=False)
    sides = [
        plane.parallelize([(0, "a"), (3, "b")], 2)
        .partitionBy(5, _identity)
        .mapPartitionsWithIndex(_counted)
        for _ in range(2)
    ]
    got = sorted(plane.union(sides).collect())
    assert got == sorted([(0, 1), (1, 0), (2, 0), (3, 1), (4, 0)] * 2)


def _counted(index, pairs):
    yield index, sum(1 for _ in pairs)


def _identity(key):
    return key


def _with_index(index, pairs):
    for key, value in pairs:
        yield index, key, value


def _pipeline(plane):
    """Sources, fused narrow steps, a shuffle, a union, a cache and a collect."""
    left = plane.parallelize(list(range(30)), 3).map(lambda x: (x % 4, x))
    right = plane.parallelize([(9, -1)], 1)
    shuffled = plane.union([left, right]).partitionBy(4).mapPartitions(_summed)
    cached = plane.persist(shuffled, "summed")
    both = plane.union([cached.filter(lambda kv: kv[0] != 9), cached.values().map(lambda v: (v,))])
    try:
        return sorted(both.collect(), key=repr)
    finally:
        cached.unpersist()


def _summed(pairs):
    sums: dict = {}
    for key, value in pairs:
        sums[key] = sums.get(key, 0) + value
    return iter(sorted(sums.items()))


def test_frames_and_rdd_planes_compute_the_same(spark):
    frames, rdds = _pipeline(FramePlane(spark, connect=False)), _pipeline(RddPlane(spark))
    assert frames == rdds
    assert (3, 0 + 3 + 7 + 11 + 15 + 19 + 23 + 27) in frames  # keys 3 mod 4 summed


def test_unknown_plane_is_a_clear_error(spark):
    with pytest.raises(ValueError, match="--data_plane 'arrows' is not one of rdd, frames"):
        plane_for(spark, "arrows")


def test_broadcast_values_reach_tasks_on_both_planes(spark):
    for plane in (FramePlane(spark, connect=False), RddPlane(spark)):
        table = plane.broadcast({"a": 1})
        got = plane.parallelize(["a", "a"], 2).map(functools.partial(_lookup, table)).collect()
        assert got == [1, 1], plane.name


def _lookup(table, key):
    return table.value[key]


def test_frames_union_of_one_keeps_its_functions_in_one_python_pass(spark):
    """A union of one dataset is that dataset: its functions and the next ones run in one
    ``mapInArrow`` (a closed chain would cost another Python pass and Arrow round trip)."""
    plane = FramePlane(spark, connect=False)
    doubled = plane.parallelize(list(range(6)), 2).map(_double)
    out = plane.union([doubled]).map(_increment)
    plan = out.frame()._jdf.queryExecution().analyzed().toString()
    assert plan.count("MapInArrow") == 1, plan
    assert sorted(out.collect()) == [2 * x + 1 for x in range(6)]


def _double(x):
    return 2 * x


def _increment(x):
    return x + 1


SPREAD_WITHOUT_HASH_SEED = """
import os
os.environ.pop("PYTHONHASHSEED", None)
from sparkbeam.runner.plane.frames import _Placement, spread_hash
from sparkbeam.runner.task.records import ReportKey
place = _Placement(spread_hash, (10, 11, 12))
print([place((key, b"")) for key in (0, 1, 5, ReportKey(4), -3)])
"""


def test_a_reshuffle_places_its_rows_without_pythons_hash_seed(monkeypatch):
    """A Connect server on a standalone master starts executors without PYTHONHASHSEED
    (classic PySpark sets it): the reshuffle's default partitioner must not need it
    (pyspark's portable_hash raised PYTHON_HASH_SEED_NOT_SET there)."""
    import subprocess
    import sys

    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONHASHSEED"}
    done = subprocess.run(
        [sys.executable, "-c", SPREAD_WITHOUT_HASH_SEED],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    from pyspark.rdd import portable_hash

    monkeypatch.setenv("PYTHONHASHSEED", "0")  # portable_hash demands it; ints ignore it
    targets = (10, 11, 12)
    expected = [targets[portable_hash(k) % 3] for k in (0, 1, 5, (4,), -3)]  # the same spread
    assert done.stdout.strip() == str(expected)


@pytest.mark.parametrize("plane_class", [RddPlane, FramePlane], ids=["rdd", "frames"])
def test_as_subtasks_gives_each_subtask_one_task_and_spreads_fewer_partitions(spark, plane_class):
    """An SDF stage with a store runs one task per subtask (its residuals' key groups): rows
    of one partition are spread over all of them, none is lost, and no input still runs each."""
    plane = plane_class(spark) if plane_class is RddPlane else plane_class(spark, connect=False)
    rows = [f"r{i}" for i in range(7)]
    spread = plane.as_subtasks(plane.parallelize(rows, 1), 3).mapPartitionsWithIndex(_listed)
    got = spread.collect()
    assert sorted(i for i, _ in got) == [0, 1, 2]
    assert sorted(r for _, part in got for r in part) == rows
    assert sorted(len(part) for _, part in got) == [2, 2, 3]
    empty = plane.as_subtasks(None, 3).mapPartitionsWithIndex(_listed).collect()
    assert sorted(empty) == [(0, []), (1, []), (2, [])]


def test_frames_as_subtasks_takes_a_partitioned_dataset_of_its_width_as_it_is(spark):
    plane = FramePlane(spark, connect=False)
    shuffled = plane.parallelize([(k, k) for k in range(6)], 2).partitionBy(3, _identity)
    assert plane.as_subtasks(shuffled, 3) is shuffled  # the fusion break shuffled it already
    assert plane.as_subtasks(shuffled, 2) is not shuffled


def _listed(index, rows):
    return iter([(index, list(rows))])

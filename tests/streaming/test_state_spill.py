"""A keyed streaming job whose state is 4x the workers' memory budget runs exactly.

``--task_state_memory_mb=1`` and about 4 MB of user state per task: each round's task holds
its key-group range in the executor's RocksDB (``held_state``), extends it with the segments
committed since, and the output is exact. Before, a worker held every range it read as a dict
in memory (and read one larger than its cache whole every round)."""

from __future__ import annotations

import glob
import marshal
import os
import shutil
import time

import apache_beam as beam
import pytest
from apache_beam.coders import BytesCoder
from apache_beam.transforms import userstate

from sparkbeam.checkpoint import open_store
from sparkbeam.io import WriteToFilesOnCheckpoint
from sparkbeam.runner.task import held_state, shared_reads
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


def _counts(
    options, tmp_path, count_fn, keys: int, n: int, per_round: int, before=lambda kv: kv
) -> list[str]:
    """Run ``n`` elements, ``per_round`` a round, over ``keys`` keys through the stateful
    ``count_fn`` (each element through ``before`` first, in the stage ahead of it); the
    lines it wrote exactly once."""
    with beam.Pipeline(options=options) as p:
        _ = (
            p
            | beam.Create([("a", n)])
            | beam.ParDo(EventTimeOffsets(per_round=per_round, delay_s=0.01))
            | beam.Map(before)
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
    claims = _claims(_executor_dir(spark), started)
    assert claims  # ranges a worker held on disk past the budget, each with what it holds
    for records, (*_, count, size) in claims:
        assert (count, size) == (len(records), sum(len(k) + len(v) for k, v in records.items()))


def _claims(executor_dir: str, since: float) -> list[tuple[dict, tuple]]:
    """(records, claim) of each database a round changed since ``since`` that claims what it
    holds (read-only: a worker may hold it)."""
    from rocksdict import AccessType, Options, Rdict

    found = []
    for path in glob.glob(os.path.join(executor_dir, "spilled", "*", "*", "CURRENT")):
        path = os.path.dirname(path)
        if max(os.path.getmtime(f) for f in glob.glob(os.path.join(path, "*"))) < since:
            continue
        db = Rdict(path, Options(raw_mode=True), access_type=AccessType.read_only())
        claims = db.get_column_family(held_state._CLAIMS)
        claim = claims.get(held_state._CLAIM)
        if claim is not None:
            found.append((dict(db.items()), marshal.loads(claim)))
        claims.close()
        db.close()
    return found


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


def _held_ranges(since: float) -> list[str]:
    """The executor's database directories of the ranges held on its disk that hold records
    (tables or a write-ahead log) and that a round changed since ``since`` (not those of
    earlier tests), largest first."""
    found = []
    for path in glob.glob(os.path.join(shared_reads.shared_dir(), "spilled", "*", "*", "")):
        files = glob.glob(os.path.join(path, "*"))
        data = sum(os.path.getsize(f) for f in files if f.endswith((".sst", ".log")))
        if data and max(os.path.getmtime(f) for f in files) >= since:
            found.append((data, path.rstrip(os.sep)))
    return [path for _, path in sorted(found, reverse=True)]


def _damage(kind: str, since: float) -> int:
    """Damage the ranges held on this executor's disk as a lost disk or a /tmp cleaner
    would, leaving what lies beside them; how many were damaged."""
    paths = _held_ranges(since)
    if kind == "swap":  # each range's directory replaced by the other's
        a, b = paths[:2]
        shutil.move(a, a + ".moved")
        shutil.move(b, a)
        shutil.move(a + ".moved", b)
        return 2
    for path in paths:
        tables = sorted(glob.glob(os.path.join(path, "*.sst")))
        if kind == "delete":
            shutil.rmtree(path)
        elif kind == "truncate":  # half its tables gone
            for table in tables[: max(1, len(tables) // 2)]:
                os.remove(table)
        else:  # rot: a byte flipped in every 4 KB of its records' tables (its claim's,
            # a few hundred bytes, read on open, stay sound), as a failing disk does
            for table in [t for t in tables if os.path.getsize(t) > 16 << 10]:
                with open(table, "r+b") as f:
                    blob = bytearray(f.read())
                    blob[100::4096] = bytes(b ^ 0xFF for b in blob[100::4096])
                    f.seek(0)
                    f.write(blob)
    return len(paths)


class _DamageOnce:
    """At element ``at``, once (a retried task does not repeat it): `_damage` the ranges,
    and note how many in ``marker``."""

    def __init__(self, kind: str, at: int, since: float, marker: str) -> None:
        self.kind, self.at, self.since, self.marker = kind, at, since, marker

    def __call__(self, kv):
        if kv[1] == self.at and not os.path.exists(self.marker):
            damaged = _damage(self.kind, self.since)
            with open(self.marker, "w") as f:
                f.write(str(damaged))
        return kv


class _PaddedCountDamaging(_PaddedCount):
    """`_PaddedCount` that deletes the ranges held on disk while its task holds one open."""

    def __init__(self, damage: _DamageOnce) -> None:
        self.damage = damage

    def process(self, kv, state=beam.DoFn.StateParam(_PaddedCount.STATE)):
        self.damage(kv)
        yield from super().process(kv, state)


@pytest.mark.parametrize("kind", ["delete", "truncate", "swap", "rot", "delete mid-round"])
def test_a_range_whose_directory_is_damaged_is_read_again_from_the_store(spark, tmp_path, kind):
    """Between rounds (in the stage ahead) or while a task holds it, the ranges' database
    directories are deleted, cut, swapped or their tables damaged, what lies beside them
    left: the next read trusts none of them (a read that meets damage fails its task and
    removes the database) and replays the range from the store; the output is exact."""
    n = 2 * KEYS  # two elements per key in four rounds: the second needs the first's state
    marker = str(tmp_path / "damaged")
    damage = _DamageOnce(kind.split()[0], KEYS + KEYS // 4, time.time(), marker)
    options = _options(tmp_path, "--parallelism=2", "--task_state_memory_mb=1")
    if kind.endswith("mid-round"):
        lines = _counts(options, tmp_path, _PaddedCountDamaging(damage), KEYS, n, KEYS // 2)
    else:
        lines = _counts(options, tmp_path, _PaddedCount(), KEYS, n, KEYS // 2, before=damage)
    with open(marker) as f:
        assert int(f.read()) >= 2  # both tasks' ranges were on disk, and damaged
    assert sorted(lines) == sorted(repr((f"k{k}", c)) for k in range(KEYS) for c in (1, 2))

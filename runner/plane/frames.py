"""The DataFrame data plane: every dataset a DataFrame of pickled records in Arrow batches.

Classic Spark and Spark Connect alike: nothing here touches a SparkContext. A dataset is a
DataFrame of ``k`` (int: where a shuffle sends the row) and ``b`` (one pickled record, as the
RDD plane moves), plus the Python functions still to apply. Consecutive ``mapPartitions`` fuse
into one ``mapInArrow``; a shuffle, union, cache or collect closes the chain. ``partitionBy``
computes each row's partition in Python (the key group's subtask) and puts in ``k`` a value
Spark's hash sends exactly there (``spark_hash``). After a ``partitionBy`` a later union in the
same Spark stage renumbers partitions, so each partition carries a marker row (empty ``b``)
whose ``k`` names it, even with no data (a stateful task still fires its timers).

Leaves to others: what the functions do (``rounds``, ``batch``, ``streaming``), the session.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import operator
import pickle
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.types import BinaryType, IntegerType, StructField, StructType

from sparkbeam.runner.plane import release, round_robin
from sparkbeam.runner.plane.rdd import RddPlane
from sparkbeam.runner.plane.shipped import ArtifactBroadcaster
from sparkbeam.runner.plane.spark_hash import target_values
from sparkbeam.runner.spark.session_conf import is_local_master, is_loopback

# A StructType, not DDL text: a process with a classic and a Connect session parses DDL
# through whichever JVM is active; a StructType needs no parser.
SCHEMA = StructType([StructField("k", IntegerType()), StructField("b", BinaryType())])
_ARROW_SCHEMA = pa.schema([("k", pa.int32()), ("b", pa.binary())])
_BATCH_ROWS = 4096
_BATCH_BYTES = 16 << 20  # well inside Arrow's 2 GB per binary column


class Frames:
    """A dataset of the DataFrame plane, with the RDD methods sparkbeam's rounds use."""

    def __init__(self, plane: FramePlane, df, chain: tuple = (), targets=None) -> None:
        self.plane, self.df, self.chain = plane, df, chain
        self.targets = targets  # after a partitionBy: the ``k`` of each partition's rows
        self._persisted = False

    # --- narrow: fused into the next mapInArrow ---------------------------------------

    def mapPartitions(self, fn: Callable[[Iterator], Iterable]) -> Frames:
        return Frames(self.plane, self.df, (*self.chain, (False, fn)), self.targets)

    def mapPartitionsWithIndex(self, fn: Callable[[int, Iterator], Iterable]) -> Frames:
        return Frames(self.plane, self.df, (*self.chain, (True, fn)), self.targets)

    def map(self, fn: Callable) -> Frames:
        return self.mapPartitions(functools.partial(map, fn))

    def filter(self, fn: Callable) -> Frames:
        return self.mapPartitions(functools.partial(filter, fn))

    def values(self) -> Frames:
        return self.map(operator.itemgetter(1))

    # --- wide, cached, collected ------------------------------------------------------

    def partitionBy(self, partitions: int, partitioner: Callable | None = None) -> Frames:
        """(key, value) pairs to partition ``partitioner(key) % partitions``, as RDDs do
        (default: `spread_hash`)."""
        targets = target_values(partitions)
        place = _Placement(partitioner or spread_hash, targets)
        markers = self.plane.spark.createDataFrame([(k, b"") for k in targets], SCHEMA)
        moved = self.frame(place).unionAll(markers).repartition(partitions, "k")
        return Frames(self.plane, moved, targets=targets)

    def coalesce(self, partitions: int) -> Frames:
        """At most ``partitions`` partitions, without a shuffle (as ``RDD.coalesce``)."""
        return Frames(self.plane, self.frame().coalesce(max(1, partitions)))

    def persist(self, level=None) -> Frames:
        """Computed once, kept on the executors. Over Spark Connect a local checkpoint (released
        with its last DataFrame), not a cache: the server runs a cached plan in a cloned
        session, which started new Python workers and stayed on the server's heap."""
        from pyspark import StorageLevel

        level = level or StorageLevel.MEMORY_AND_DISK
        if self.plane.connect:
            return Frames(self.plane, local_checkpoint(self.frame(), level))
        cached = Frames(self.plane, self.frame().persist(level))
        cached._persisted = True
        return cached

    def unpersist(self, blocking: bool = False) -> None:
        if self._persisted:
            self.df.unpersist(blocking)

    def collect(self) -> list:
        table = self.frame().select("b").toArrow()
        return [pickle.loads(b) for b in table.column("b").to_pylist()]

    def frame(self, placement: _Placement | None = None):
        """The DataFrame with the pending functions applied (one ``mapInArrow``)."""
        if not self.chain and placement is None and self.targets is None:
            return self.df
        run = _Chain(self.chain, placement, self.targets, self.plane.filesystem_options)
        return self.df.mapInArrow(run, SCHEMA)


def local_checkpoint(df, level):
    """``df.localCheckpoint``, bound to ``df``'s own Connect session (made this thread's active
    one for the call): pyspark binds it to the thread's active session, else the process's
    first, and with two sessions the next plan named a DataFrame its session did not have."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    active = getattr(ConnectSession, "_active_session", None)  # thread-local, pyspark 4.x
    if active is None:
        return df.localCheckpoint(False, level)
    before = getattr(active, "session", None)
    active.session = df.sparkSession
    try:
        return df.localCheckpoint(False, level)
    finally:
        active.session = before


class FramePlane:
    """Makes the sources, unions and broadcasts of the DataFrame plane."""

    name = "frames"

    def __init__(self, spark, connect: bool) -> None:
        self.spark, self.connect = spark, connect
        self.filesystem_options = "{}"  # carried by every function (Connect has no local props)
        # Job labels, pools, local properties, broadcasts, the default parallelism and whether
        # tasks run on the driver's host: the SparkContext's on classic Spark (the RDD plane's).
        self.context = context = _ConnectContext(spark) if connect else RddPlane(spark)
        self.local_master = context.local_master
        self.default_parallelism = context.default_parallelism
        self.broadcast = context.broadcast
        self.use_scheduler_pool = context.use_scheduler_pool
        self.describe_job = context.describe_job
        self.call_site = context.call_site

    def parallelize(self, rows: list, partitions: int) -> Frames:
        data = [(0, pickle.dumps(r, pickle.HIGHEST_PROTOCOL)) for r in rows]
        df = self.spark.createDataFrame(data, SCHEMA)
        return Frames(self, df.coalesce(max(1, partitions)))

    def empty(self) -> Frames:
        return Frames(self, self.spark.createDataFrame([], SCHEMA))

    def union(self, datasets: list) -> Frames:
        """A union of one is that dataset, its pending functions kept for the next fusion (a
        closed chain would be a ``mapInArrow`` of its own: another Python pass and Arrow trip)."""
        if not datasets:
            return self.empty()
        if len(datasets) == 1:
            return datasets[0]
        frames = [d.frame() for d in datasets]
        return Frames(self, functools.reduce(lambda a, b: a.unionAll(b), frames))

    def as_subtasks(self, dataset: Frames | None, partitions: int) -> Frames:
        """``dataset`` (None: no rows) as exactly ``partitions`` partitions, partition ``p``
        being subtask ``p``: a partitioned dataset of as many as it is, other rows spread round
        robin by a shuffle (a DataFrame's partition count is not known before it is planned)."""
        if dataset is not None and dataset.targets and len(dataset.targets) == partitions:
            return dataset  # partitioned (a fusion break's Reshuffle): marked already
        rows = self.empty() if dataset is None else dataset
        return rows.mapPartitionsWithIndex(round_robin).partitionBy(partitions).values()

    release = staticmethod(release)  # once its round or job is done (`plane.release`)

    def persist(self, dataset: Frames, label: str) -> Frames:
        return dataset.persist()

    def use_in_jobs(self, encoded: str) -> None:
        self.filesystem_options = encoded
        self.context.use_in_jobs(encoded)


class _ConnectContext:
    """What the RDD plane does with the SparkContext, over Spark Connect, which has none: no
    local properties, job groups or call sites; a broadcast is a session artifact or travels
    inside the functions (`ArtifactBroadcaster`)."""

    def __init__(self, spark) -> None:
        self.spark = spark
        self.broadcast = ArtifactBroadcaster(spark)
        # Tasks run on the driver's host, in a Python with its packages (``batch.driver_stages``),
        # when the server runs a local master and listens on this host.
        self.local_master = is_loopback(spark.client.host) and is_local_master(
            spark.conf.get("spark.master", None)
        )

    def default_parallelism(self) -> int:
        from sparkbeam.runner.spark.session import default_parallelism

        return default_parallelism(self.spark)

    def use_in_jobs(self, encoded: str) -> None:
        from sparkbeam.checkpoint.filesystem_options import apply

        apply(encoded)  # the driver's own store access; tasks get them from ``_Chain``

    def use_scheduler_pool(self) -> None:
        pass

    def describe_job(self, group: str, description: str) -> None:
        pass

    def call_site(self, label: str):
        return contextlib.nullcontext()


# --- task side: picklable, run inside mapInArrow ---------------------------------------


def spread_hash(key) -> int:
    """pyspark's ``portable_hash`` of the keys a Reshuffle spreads by (ints, and tuples of
    them: `ReportKey`), without its demand for ``PYTHONHASHSEED`` (a Connect server's cluster
    executors lack it); a str or bytes key goes through crc32, the same in every process."""
    if key is None:
        return 0
    if isinstance(key, tuple):  # portable_hash's tuple mix, over our own element hashes
        h = 0x345678
        for item in key:
            h ^= spread_hash(item)
            h *= 1000003
            h &= sys.maxsize
        h ^= len(key)
        return -2 if h == -1 else int(h)
    if isinstance(key, str):
        key = key.encode()
    if isinstance(key, (bytes, bytearray)):
        return zlib.crc32(key)
    return hash(key)


@dataclass(frozen=True)
class _Placement:
    """Where a (key, value) pair goes: the ``k`` value Spark's hash sends to its partition."""

    partitioner: Callable
    targets: tuple[int, ...]

    def __call__(self, pair) -> int:
        return self.targets[self.partitioner(pair[0]) % len(self.targets)]


class _Chain:
    """The body of one ``mapInArrow``: unpickle, apply the fused functions, pickle."""

    def __init__(self, chain: tuple, placement, targets, filesystem_options: str):
        self.chain, self.placement, self.targets = chain, placement, targets
        self.filesystem_options = filesystem_options

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        from sparkbeam.checkpoint.filesystem_options import apply
        from sparkbeam.runner.spark.daemon import settle_worker

        settle_worker()
        apply(self.filesystem_options)
        if self.targets is None:
            index = TaskContext.get().partitionId()  # type: ignore[union-attr]  # in a task
        else:  # the marker's ``k`` names the partition (see the module docstring)
            index, batches = _marked_index(batches, self.targets)
        items: Iterable = _records(batches)
        for with_index, fn in self.chain:
            items = fn(index, items) if with_index else fn(items)
        return _batches(items, self.placement)


def _marked_index(batches: Iterator[pa.RecordBatch], targets: tuple) -> tuple[int, Iterator]:
    """The partition index a partitioned frame's rows name; the batches, none consumed."""
    seen = []
    for batch in batches:
        seen.append(batch)
        if batch.num_rows:
            index = targets.index(batch.column(0)[0].as_py())
            return index, itertools.chain(seen, batches)
    raise RuntimeError("a partitioned frame's partition lost its marker row; sparkbeam bug")


def _records(batches: Iterator[pa.RecordBatch]) -> Iterator:
    for batch in batches:
        for blob in batch.column(1).to_pylist():
            if blob:  # not a partition's marker
                yield pickle.loads(blob)


def _batches(items: Iterable, placement: _Placement | None) -> Iterator[pa.RecordBatch]:
    keys: list[int] = []
    blobs: list[bytes] = []
    size = 0
    for item in items:
        blob = pickle.dumps(item, pickle.HIGHEST_PROTOCOL)
        keys.append(placement(item) if placement is not None else 0)
        blobs.append(blob)
        size += len(blob)
        if len(blobs) >= _BATCH_ROWS or size >= _BATCH_BYTES:
            yield _batch(keys, blobs)
            keys, blobs, size = [], [], 0
    if blobs:
        yield _batch(keys, blobs)


def _batch(keys: list[int], blobs: list[bytes]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array(keys, pa.int32()), pa.array(blobs, pa.binary())], schema=_ARROW_SCHEMA
    )

"""The RDD data plane: datasets are PySpark RDDs of pickled records; job groups and call sites
are local properties of the SparkContext, which Spark Connect lacks (``frames`` runs there).
"""

from __future__ import annotations

from pyspark import StorageLevel

from sparkbeam.runner.plane import NO_SIDE_INPUTS, release, round_robin
from sparkbeam.runner.spark import labels, session_conf
from sparkbeam.runner.spark.filesystem_options import use_in_jobs


class RddPlane:
    """Makes the sources, unions and broadcasts of the RDD plane."""

    name = "rdd"

    def __init__(self, spark) -> None:
        self.sc = spark.sparkContext
        # Tasks run on the driver's host, in its Python (``batch.driver_stages``).
        self.local_master = session_conf.is_local_master(self.sc.master)

    def default_parallelism(self) -> int:
        return self.sc.defaultParallelism

    def parallelize(self, rows: list, partitions: int):
        return self.sc.parallelize(rows, max(1, partitions))

    def empty(self):
        return self.sc.emptyRDD()

    def union(self, datasets: list):
        if not datasets:
            return self.empty()
        return datasets[0] if len(datasets) == 1 else self.sc.union(datasets)

    def as_subtasks(self, dataset, partitions: int):
        """``dataset`` (None: no rows) as exactly ``partitions`` partitions, partition ``p``
        being subtask ``p`` of a stage whose tasks keep state of their key groups: fewer are
        spread round robin (one would put every element in subtask 0), more coalesced."""
        if dataset is None:
            return self.sc.parallelize([], partitions)
        n = dataset.getNumPartitions()
        if n < partitions:
            keyed = dataset.mapPartitionsWithIndex(round_robin)
            return keyed.partitionBy(partitions, int).values()  # no PYTHONHASHSEED needed
        return dataset.coalesce(partitions) if n > partitions else dataset

    def broadcast(self, value):
        if isinstance(value, dict) and not value:
            return NO_SIDE_INPUTS
        return self.sc.broadcast(value)

    release = staticmethod(release)  # once its round or job is done (`plane.release`)

    def persist(self, dataset, label: str):
        labels.name_rdd(dataset, label)
        return dataset.persist(StorageLevel.MEMORY_AND_DISK)

    # --- what this thread's jobs carry: local properties of the SparkContext ----------

    def use_in_jobs(self, encoded: str) -> None:
        use_in_jobs(self.sc, encoded)

    def use_scheduler_pool(self) -> None:
        """This thread's jobs in ``session_conf.POOL`` under the FAIR scheduler (else none)."""
        if self.sc.getConf().get("spark.scheduler.mode", "FIFO") == "FAIR":
            self.sc.setLocalProperty("spark.scheduler.pool", session_conf.POOL)

    def describe_job(self, group: str, description: str) -> None:
        labels.describe_job(self.sc, group, description)

    def call_site(self, label: str):
        return labels.call_site(self.sc, label)

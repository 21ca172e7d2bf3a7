"""A batch GroupByKey partitions at any --parallelism, also above the store's key groups.

Batch shuffles restore no state, so they need not follow the store's key-group count (128 by
default); a streaming pipeline's do (its GroupByKey state is read back per key group). Checked
on the batch executor's own partitioner: a job of 150+ tasks costs minutes on two cores.
"""

from __future__ import annotations

from collections import Counter

import apache_beam as beam
import pytest

from sparkbeam.checkpoint.keygroups import DEFAULT_MAX_KEY_GROUPS
from sparkbeam.runner.batch.executor import PlanExecutor
from sparkbeam.runner.runner import portable_proto
from sparkbeam.translation import translate

pytestmark = pytest.mark.spark


def test_batch_keys_spread_over_more_partitions_than_key_groups(spark):
    p = beam.Pipeline()
    _ = p | beam.Create([(1, 2)]) | beam.GroupByKey()
    plan = translate(portable_proto(p, p.options))
    parallelism = DEFAULT_MAX_KEY_GROUPS + 22
    executor = PlanExecutor(spark, plan, parallelism)
    try:
        keys = [str(i).encode() for i in range(30_000)]
        owners = Counter(executor.edges.partition(k) for k in keys)
    finally:
        executor._cleanup()
    assert set(owners) == set(range(parallelism))  # every partition gets keys
    assert max(owners.values()) < 2 * min(owners.values())  # and none twice another's share

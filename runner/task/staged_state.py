"""Task side of streaming state: read a subtask's key groups, stage its changes.

A streaming stage with state (GroupByKey buffers, later user state) keeps no
state in executors between rounds: each round's task reads the key groups it
owns from the previous round's committed checkpoint and stages its changes for
the round's checkpoint (two-phase commit: only the attempt whose report reaches
the driver is committed). Each worker process keeps one read-only store per
URL, whose segment cache means a changelog segment is fetched and checked
once per process, not once per round.
"""

from __future__ import annotations

import threading

from sparkbeam.checkpoint import key_group_range, open_staged_writer, open_store, state_layout
from sparkbeam.checkpoint.layout import pipeline_dir
from sparkbeam.checkpoint.reader import replay
from sparkbeam.runner.spark.filesystem_options import apply_in_task

_LOCK = threading.Lock()
_STORES: dict[str, object] = {}


def _store(url: str):
    apply_in_task()
    with _LOCK:
        store = _STORES.get(url)
        if store is None:
            store = open_store(url, read_only=True, materialization_interval_s=None)
            _STORES[url] = store
        return store


def read_task_state(
    url: str,
    pipeline: str,
    checkpoint_id: int,
    subtask: int,
    parallelism: int,
    namespace: str,
) -> dict[bytes, bytes]:
    """{key: value} of ``namespace`` in the key groups ``subtask`` owns at ``parallelism``."""
    store = _store(url)
    manifest = store.load_manifest(pipeline, checkpoint_id)
    groups = key_group_range(subtask, parallelism, manifest.max_key_groups)
    state: dict[bytes, bytes] = {}

    def put(ns: str, key: bytes, value: bytes, kg: int) -> None:
        if ns == namespace:
            state[key] = value

    def delete(ns: str, key: bytes, kg: int) -> None:
        if ns == namespace:
            state.pop(key, None)

    replay(
        store.storage, pipeline_dir(pipeline), manifest, put, delete, groups, store._segment_cache
    )
    where = f"checkpoint {checkpoint_id} of pipeline {pipeline!r} in store {url!r}"
    for value in state.values():
        state_layout.check_value(value, namespace, where)
    return state


def staged_writer_for_task(url: str, pipeline: str, stage: str, round_no: int, max_key_groups: int):
    """A staged writer named by this Spark task's partition and attempt."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("staged_writer_for_task runs inside a Spark task only")
    apply_in_task()
    return open_staged_writer(
        url,
        pipeline,
        stage,
        round_no,
        ctx.partitionId(),
        ctx.attemptNumber(),
        max_key_groups=max_key_groups,
    )

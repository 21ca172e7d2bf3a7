"""Worker-side shuffles: GroupByKey, key partitioning and reshuffle on Spark.

Spark moves the bytes (``partitionBy`` on the key's key group, ``partition_for_key``); Beam's
``GroupingBuffer`` groups by encoded key and runs the batch trigger driver, so every window
fn, trigger and timestamp combiner behaves as in Beam's FnApiRunner.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import Any

from apache_beam.coders.coder_impl import create_InputStream, create_OutputStream
from apache_beam.runners.portability.fn_api_runner.execution import GroupingBuffer

from sparkbeam.checkpoint import key_group, subtask_for_key_group
from sparkbeam.runner.task.records import is_report_key
from sparkbeam.runner.task.worker_context import plan_context

CHUNK_BYTES = 1 << 20


def partition_for_key(key, parallelism: int, max_key_groups: int) -> int:
    """The task that owns ``key``: its key group's subtask, so shuffles place a key where a
    restore (at any parallelism) puts its state. A carried report (``ReportKey``) goes anywhere."""
    if is_report_key(key):
        return key.spread % parallelism
    return subtask_for_key_group(key_group(key, max_key_groups), parallelism, max_key_groups)


def partitioner(parallelism: int, max_key_groups: int):
    """``partition_for_key`` for a shuffle into ``parallelism`` subtasks (picklable)."""
    return functools.partial(
        partition_for_key, parallelism=parallelism, max_key_groups=max_key_groups
    )


def split_elements(blob: bytes, coder_impl) -> Iterator[tuple[Any, bytes]]:
    """Yield (decoded value, encoded bytes) for each element of a chunk."""
    stream = create_InputStream(blob)
    total = len(blob)
    while stream.size() > 0:
        start = total - stream.size()
        value = coder_impl.decode_from_stream(stream, True)
        yield value, blob[start : total - stream.size()]


def keyed_elements(
    blobs: Iterable[bytes], plan_key: str, coder_id: str
) -> Iterator[tuple[bytes, bytes]]:
    """(encoded key, encoded element) for each windowed KV element."""
    coder = plan_context(plan_key).coders[coder_id]
    coder_impl = coder.get_impl()
    key_impl = coder.wrapped_value_coder.key_coder().get_impl()
    for blob in blobs:
        for windowed, encoded in split_elements(blob, coder_impl):
            yield key_impl.encode(windowed.value[0]), encoded


def chunk(elements: Iterable[bytes], limit: int = CHUNK_BYTES) -> Iterator[bytes]:
    """Concatenate encoded elements into chunks of about ``limit`` bytes."""
    parts: list[bytes] = []
    size = 0
    for e in elements:
        parts.append(e)
        size += len(e)
        if size >= limit:
            yield b"".join(parts)
            parts, size = [], 0
    if parts:
        yield b"".join(parts)


def group_partition(pairs: Iterable[tuple[bytes, bytes]], plan_key: str, edge) -> Iterator[bytes]:
    """Group one shuffled partition by key and window; yield output chunks."""
    context = plan_context(plan_key)
    windowing = context.windowing_strategies[edge.windowing_strategy]
    buffer = GroupingBuffer(
        context.coders[edge.write_coder], context.coders[edge.read_coder], windowing
    )
    for data in chunk(element for _, element in pairs):
        buffer.append(data)
    for part in buffer.partition(1):
        for data in part:
            if data:
                yield data


def reshuffle_elements(
    index: int, blobs: Iterable[bytes], plan_key: str, coder_id: str
) -> Iterator[tuple[int, bytes]]:
    """Number elements round-robin (offset by the partition index) so that
    ``partitionBy`` spreads them evenly — SDF restrictions especially."""
    coder_impl = plan_context(plan_key).coders[coder_id].get_impl()
    n = index
    for blob in blobs:
        for _, encoded in split_elements(blob, coder_impl):
            yield n, encoded
            n += 1


def reencode(
    blobs: Iterable[bytes], plan_key: str, from_coder: str, to_coder: str
) -> Iterator[bytes]:
    """Transcode chunks between two coders of the same PCollection."""
    if from_coder == to_coder:
        yield from blobs
        return
    context = plan_context(plan_key)
    src = context.coders[from_coder].get_impl()
    dst = context.coders[to_coder].get_impl()
    for blob in blobs:
        out = create_OutputStream()
        for value in src.decode_all(blob):
            dst.encode_to_stream(value, out, True)
        yield out.get()

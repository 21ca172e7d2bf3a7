"""Side inputs read together: every buffer a batch wave needs (``batch.build_order``) in one
Spark job, not one each (a Map with ten ``AsSingleton`` inputs paid ten): a union of the
buffers' datasets, each chunk tagged with its buffer. Streaming rounds read side inputs from
the checkpoint store instead (``streaming.side_input_store``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable


def read_together(plane, reads: dict, collect: Callable) -> dict[str, list[bytes]]:
    """Buffer -> its encoded chunks, in order; ``reads``: buffer -> its dataset;
    ``collect(dataset)`` runs the one job (the caller guards it and names its stages)."""
    if not reads:
        return {}
    tagged = plane.union([data.map(functools.partial(_tagged, b)) for b, data in reads.items()])
    values: dict[str, list[bytes]] = {b: [] for b in reads}
    for buffer, chunk in collect(tagged):  # a union keeps each buffer's chunks in order
        values[buffer].append(chunk)
    return values


def _tagged(buffer: str, chunk: bytes) -> tuple[str, bytes]:
    return buffer, chunk

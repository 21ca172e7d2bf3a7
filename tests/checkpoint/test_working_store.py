"""A run without ``--checkpoint_dir`` leaks nothing: residuals put then deleted leave no bytes.

A batch run without a store keeps its pending residuals in the driver's memory
(``rounds.feed.DriverResiduals``); a polling SDF puts and deletes one per poll for as long as it
runs. Before, every change went through the store such a run opens (`open_working_store`) and
its driver's changelog, flushed into in-memory storage that no checkpoint or retention ever
cleaned: 30,000 residuals of 1 KB, put and deleted, left 25 MB held with 0 live entries.
"""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from sparkbeam.checkpoint import open_working_store
from sparkbeam.runner.rounds.feed import DriverResiduals
from sparkbeam.sdf.residuals import ResidualRecord

RESIDUALS = 30_000
BATCH = 1_000


def _held_bytes(storage) -> int:
    """Bytes the in-memory storage holds, over every file it has."""
    return sum(len(storage.read(path)) for path in storage.list())


def test_put_delete_loop_without_a_store_leaves_nothing():
    store = open_working_store()
    try:
        before = _held_bytes(store.storage)  # the lock file
        state = store.pipeline("p0")
        handler = DriverResiduals("s1").handler  # what a run without a store keeps them in
        _put_and_delete(handler, RESIDUALS)
        assert handler.fired == RESIDUALS and handler.pending() == 0 and len(state) == 0
        assert handler.state.values == {}
        assert _held_bytes(store.storage) == before, "deleted residuals left bytes behind"
        assert state.live_files() == set(), "the next checkpoint would name changelog segments"
        # Nor on the driver's heap (the timers kept every fed residual's key): 5 MB more of
        # residuals, put and deleted, leave less than 256 KB allocated.
        gc.collect()
        tracemalloc.start()
        try:
            allocated = tracemalloc.get_traced_memory()[0]
            _put_and_delete(handler, 5 * BATCH)
            gc.collect()
            kept = tracemalloc.get_traced_memory()[0] - allocated
        finally:
            tracemalloc.stop()
        assert kept < 256 << 10, f"{kept} bytes still allocated for 5,000 deleted residuals"
    finally:
        store.close()


def _put_and_delete(handler, n: int) -> None:
    """``n`` residuals of 1 KB, due at once, put and then fed (deleted), a batch at a time."""
    for b in range(n // BATCH):
        handler.add(
            ResidualRecord("s1", "t", b"%d:%d:" % (b, i) + bytes(1024), 0.0, 0.0, 0)
            for i in range(BATCH)
        )
        assert len(handler.pop_due(float("inf"), limit=BATCH)) == BATCH


def test_a_working_store_refuses_a_checkpoint():
    """It keeps no changelog, so a checkpoint would miss the driver's changes: refused."""
    store = open_working_store()
    try:
        state = store.pipeline("p0")
        state.put("ns", b"k", b"v")
        with pytest.raises(ValueError, match=r"keeps no changelog.*--checkpoint_dir"):
            state.checkpoint(fingerprint="f")
    finally:
        store.close()

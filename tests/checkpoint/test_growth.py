"""Nothing in a store grows with the number of rounds.

500 rounds through the runner's commit path -- staged writers per (stage, round, partition,
attempt), then ``PipelineStore.checkpoint`` with retention and time-based materialization --
with a speculative losing attempt every 10th round and a failed round (staged, never committed,
the pipeline restores and redoes it) every 50th. The number of files and directories in the
store must stay under a bound that does not depend on the number of rounds. The store's clock
advances one second a round (a streaming job at one round a second), so materialization
happens every ``interval`` rounds however fast this machine is.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import pytest

from sparkbeam.checkpoint import commit as commit_module
from sparkbeam.checkpoint import open_store

ROUNDS = 500
STAGES = ("read", "group")
PARTITIONS = 2


@pytest.fixture
def root(tmp_path):
    """A store root on tmpfs if there is one (fsync there is free), else under tmp_path."""
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else str(tmp_path)
    path = tempfile.mkdtemp(prefix="sparkbeam-growth-", dir=base)
    yield os.path.join(path, "store")
    shutil.rmtree(path, ignore_errors=True)


class _Clock:
    """The store's ``time`` module, with a monotonic clock the test advances."""

    def __init__(self) -> None:
        self.now = 0.0
        self.time = time.time

    def monotonic(self) -> float:
        return self.now


def _entries(root: str) -> int:
    """Files plus directories under ``root``."""
    return sum(len(dirs) + len(files) for _, dirs, files in os.walk(root))


def _stage(store, n: int, attempts=(0,)) -> list:
    """One round's task attempts; returns the commit message of each partition's first."""
    chosen = []
    for stage in STAGES:
        for p in range(PARTITIONS):
            msgs = []
            for attempt in attempts:
                w = store.staged_writer("p", stage, n, p, attempt)
                w.put("state", b"%s-%d" % (stage.encode(), (n * 7 + p) % 40), b"%d" % n)
                w.mark_completed(f"{stage}-{p}")
                msgs.append(w.finish())
            chosen.append(msgs[0])
    return chosen


# The bound: two materializations and the changelog of two intervals (the newest checkpoint and
# its fallback), plus the losing attempts of up to SWEEP_EVERY rounds -- about 10 entries a
# round of changelog. Without removing empty round directories and swept attempts, 500 rounds
# leave more than 1,000.
@pytest.mark.parametrize(
    "interval_s, bound", [(0.0, 60), (10.0, 280)], ids=["every-round", "every-10-rounds"]
)
def test_files_and_directories_stay_bounded_over_500_rounds(root, interval_s, bound, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(commit_module, "time", clock)
    counts = []
    with open_store(root, materialization_interval_s=interval_s, materialization_files=2) as store:
        st = store.pipeline("p")
        for n in range(1, ROUNDS + 1):
            clock.now += 1.0
            if n % 50 == 25:  # the round fails after its tasks staged: restore, redo it
                _stage(store, n)
                st.close()
                st = store.pipeline("p")
                st.restore(fingerprint="f")
            msgs = _stage(store, n, attempts=(0, 1) if n % 10 == 3 else (0,))
            st.put("driver", b"round", b"%d" % n)
            st.checkpoint(fingerprint="f", parallelism=PARTITIONS, commit_messages=msgs)
            counts.append(_entries(root))
        assert st.get("driver", b"round") == b"%d" % ROUNDS
    assert max(counts[100:]) <= bound, (max(counts[100:]), counts[-10:])
    staged = os.path.join(root, "pipelines", "p", "staged")
    rounds = [r for _, dirs, _ in os.walk(staged) for r in dirs if r.startswith("r")]
    assert len(rounds) < 40, sorted(rounds)  # no directory per round left behind

"""Fixtures of the task-side state tests (reads kept by a worker, ranges spilled to disk)."""

from __future__ import annotations

import pytest

from sparkbeam.runner.task import staged_state


@pytest.fixture
def replays(monkeypatch):
    """Checkpoint ids of the whole-state replays of task reads (the real function runs); no
    read kept in this process before the test."""
    calls = []
    real = staged_state.replay_whole

    def counting(*args, **kwargs):
        calls.append(args[2].checkpoint_id)
        return real(*args, **kwargs)

    monkeypatch.setattr(staged_state, "replay_whole", counting)
    monkeypatch.setattr(staged_state, "_READS", type(staged_state._READS)())
    return calls

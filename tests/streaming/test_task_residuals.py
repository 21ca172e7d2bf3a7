"""SDF residuals are kept by the tasks that own their key groups, not by the driver.

A deferring SDF's residuals are keyed state of ``sdf-residual/<stage>`` in the key groups of
the task that made them (``runner.task.residual_state``). The driver's commit takes the files
and counts the tasks name, reading none; what it learns is each range's count, earliest timer
and hold, summed in the checkpoint's metadata -- which must match what the store holds.
"""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from sparkbeam.checkpoint import key_group_range, state_layout
from sparkbeam.checkpoint.filesystem import LocalStorage
from sparkbeam.checkpoint.keygroups import (
    default_max_key_groups,
    key_group,
    subtask_for_key_group,
)
from sparkbeam.checkpoint.pipeline import PipelineStore
from sparkbeam.runner.task.staged_state import StateRound
from sparkbeam.runner.task.task_range import TaskRange
from tests.streaming.streaming_pipelines import expected_counts, windowed_counts
from tests.streaming.test_streaming import _options


def _residuals(subtask: int, parallelism: int, m: int, stored: dict) -> TaskRange:
    """A task's range of residuals over ``stored`` (no store: as of no checkpoint)."""
    spec = StateRound(
        pipeline="p", url="memory://unused", checkpoint_id=None, round_no=0,
        parallelism=parallelism, max_key_groups=m,
    )  # fmt: skip
    return TaskRange(spec, subtask, state_layout.sdf_residual("s"), stored)


@pytest.mark.parametrize("parallelism", [1, 2, 3, 7, 200])
def test_a_new_residual_key_lands_in_the_key_groups_of_its_task(parallelism):
    m = default_max_key_groups(parallelism)
    for subtask in {0, parallelism // 2, parallelism - 1}:
        groups = key_group_range(subtask, parallelism, m)
        state = _residuals(subtask, parallelism, m, {})
        keys = [state.new_key(b"element-%d" % i) for i in range(50)]
        assert len(set(keys)) == 50
        assert all(key_group(k, m) in groups for k in keys)
        assert all(k.startswith(b"element-%d\x00" % i) for i, k in enumerate(keys))


def test_a_residual_put_and_fed_in_one_round_stages_nothing():
    state = _residuals(0, 1, 128, {b"old": b"v"})
    key = state.new_key(b"e")
    state.put(key, b"x")
    state.delete(key)
    state.delete(b"old")
    assert state.changes == {b"old": None}
    assert list(state.items()) == []


@pytest.mark.spark
def test_the_driver_commits_residual_handles_and_summaries_only(spark, tmp_path, monkeypatch):
    """Every commit of a 2-task streaming job: no residual in the driver's table, no staged
    file read on the driver, and the metadata's residual count is what the store holds."""
    reads: list[str] = []
    real_read = LocalStorage.read

    def counted_read(self, path, *args, **kwargs):
        reads.append(path)
        return real_read(self, path, *args, **kwargs)

    commits: list[tuple[set, int | None, int, list]] = []
    per_subtask: list[list[int]] = []  # residuals each of the 2 subtasks keeps, per commit
    real_checkpoint = PipelineStore.checkpoint

    def checkpoint(self, **kwargs):
        before = len(reads)
        cid = real_checkpoint(self, **kwargs)
        staged = [p for p in reads[before:] if "/staged/" in p]
        residual_ns = [ns for ns in self.namespaces() if ns.startswith("sdf-residual/")]
        driver_ns = {ns for ns, _, _ in self.items()}
        summary = (kwargs.get("metadata") or {}).get("residuals") or {}
        keys = [k for ns in residual_ns for k in self.read_task_owned(ns)]  # after the commit
        kept = len(keys)
        m = self.max_key_groups
        owners = [subtask_for_key_group(key_group(k, m), 2, m) for k in keys]
        per_subtask.append([owners.count(0), owners.count(1)])
        pending = sum(s["pending"] for s in summary.values())
        commits.append((driver_ns, pending, kept, staged))
        return cid

    monkeypatch.setattr(LocalStorage, "read", counted_read)
    monkeypatch.setattr(PipelineStore, "checkpoint", checkpoint)
    sources = [("a", 60), ("b", 35)]
    with beam.Pipeline(options=_options(tmp_path, "--parallelism=2")) as p:
        assert_that(windowed_counts(p, sources), equal_to(expected_counts(sources)))
    assert len(commits) >= 6
    # The fusion break spreads the two sources over both subtasks; each keeps its residual.
    both = [counts for counts in per_subtask if sum(counts) == 2]
    assert both and all(counts == [1, 1] for counts in both)
    assert any(pending for _, pending, _, _ in commits)  # residuals were pending
    for driver_ns, pending, kept, staged in commits:
        assert not any(ns.startswith(state_layout.SDF_RESIDUAL_PREFIX) for ns in driver_ns)
        assert staged == []  # the commit read none of the tasks' files
        assert pending == kept  # the tasks' summaries count exactly what the store holds
    assert commits[-1][1] == 0

"""One round engine: one plan key for batch and streaming, one place for a batch round number.

- Workers cache bundle processors by plan key, so the key follows the plan's code: a changed
  DoFn body gets a new one, the same plan the same one.
- A batch SDF stage's round number lives in its checkpoint's ``RoundMetadata``; a store written
  before (which also kept it as the ``<stage>:round`` source position) still resumes:
  ``tests/fixtures/batch_v0_store`` is such a store, killed with residuals pending
  (``tests/fixtures/make_batch_store.py``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import apache_beam as beam
import pytest

from sparkbeam.checkpoint import MemoryStorage, open_store, state_layout
from sparkbeam.runner.batch.stage_rdd import StageRdds
from sparkbeam.runner.batch.stage_rounds import StageRounds
from sparkbeam.runner.rounds.context import RunContext
from sparkbeam.runner.runner import portable_proto
from sparkbeam.runner.task.bundle_splits import SplitPolicy
from sparkbeam.runner.task.worker_context import plan_key
from sparkbeam.sdf.testing.run import committed_rounds
from sparkbeam.translation import translate
from tests.sdf.sdfs import ChunkedWithDelay

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "batch_v0_store"
KILLED_CHECKPOINT = 2  # the fixture's last checkpoint: round 1, residuals pending
EXPECTED = sorted(f"{n},{i}" for n, size in (("a", 12), ("b", 9), ("c", 15)) for i in range(size))


def _plan(fn):
    p = beam.Pipeline()
    _ = p | beam.Create([1, 2]) | "Body" >> beam.Map(fn)
    return translate(portable_proto(p, p.options))


def test_plan_key_follows_the_dofn_code():
    plus_one, plus_two = _plan(lambda x: x + 1), _plan(lambda x: x + 2)
    assert plus_one.fingerprint == plus_two.fingerprint  # the same shape ...
    assert plan_key(plus_one) != plan_key(plus_two)  # ... but other code: other processors
    assert plan_key(_plan(abs)) == plan_key(_plan(abs))  # the same plan, translated again


def _sdf_job(spark, store, state, restored_metadata):
    p = beam.Pipeline()
    _ = p | beam.Create([("a", 3)]) | beam.ParDo(ChunkedWithDelay(per_call=1, delay_s=0.1))
    plan = translate(portable_proto(p, p.options))
    stage = next(s for s in plan.stages if s.is_sdf_process)
    ctx = RunContext.create(spark, plan, store, None, 1)
    rdds = StageRdds(ctx, 0.0, SplitPolicy())
    return stage, StageRounds(ctx, rdds, stage, None, state, None, restored_metadata)


@pytest.mark.spark
def test_batch_round_number_comes_from_metadata_then_the_old_source_position(spark):
    store = open_store(MemoryStorage(), materialization_interval_s=None)
    state = store.pipeline("pipeline-0")
    stage, _ = _sdf_job(spark, store, state, None)

    def restored(metadata):
        return _sdf_job(spark, store, state, metadata)[1].restored_round()

    assert restored({"stage": stage.id, "round": 4}) == 4
    assert restored({}) == -1  # nothing committed
    state.set_source_position(state_layout.stage_round_position(stage.id), b"7")  # a 0.x store
    assert restored({}) == 7
    assert restored({"stage": "stage-other", "round": 2}) == 7
    assert restored({"stage": stage.id, "round": 9}) == 9


def _rerun(out: Path, ckpt: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "tests" / "sdf" / "resumable_pipeline.py"), str(out)]
    return subprocess.run(
        [*cmd, f"--checkpoint_dir={ckpt}"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.spark
@pytest.mark.slow
def test_batch_store_written_before_the_round_loop_resumes_exactly(tmp_path):
    ckpt, out = tmp_path / "ckpt", tmp_path / "out.txt"
    shutil.copytree(FIXTURE, ckpt)
    killed = committed_rounds(str(ckpt))
    assert killed[-1]["pending_residuals"] > 0  # the fixture was killed mid-job

    done = _rerun(out, ckpt)
    assert done.returncode == 0, done.stderr[-4000:]
    assert sorted(out.read_text().split()) == EXPECTED  # nothing lost, nothing twice
    assert "resumed 1 stage(s) from their checkpoint" in done.stderr
    # The numbering continued after the killed run's last round (read from its metadata):
    # one new checkpoint per new round, so a round's number minus its checkpoint id stays put.
    store = open_store(str(ckpt), read_only=True)
    (pipeline,) = store.list_pipelines()
    ids = [c.checkpoint_id for c in store.list_checkpoints(pipeline)]
    metas = {i: store.load_manifest(pipeline, i).metadata for i in ids}
    assert metas[ids[-1]].get("finished") and ids[-1] > KILLED_CHECKPOINT
    offsets = {m["round"] - i for i, m in metas.items() if "round" in m}
    assert offsets == {killed[-1]["round"] - KILLED_CHECKPOINT}, metas

    # A new run keeps its round numbers in the metadata only, not as source positions.
    fresh = tmp_path / "fresh"
    assert _rerun(tmp_path / "fresh.txt", fresh).returncode == 0
    store = open_store(str(fresh), read_only=True)
    (pipeline,) = store.list_pipelines()
    manifests = [
        store.load_manifest(pipeline, c.checkpoint_id) for c in store.list_checkpoints(pipeline)
    ]
    assert max(m.metadata.get("round", -1) for m in manifests) >= 1
    assert not [k for m in manifests for k in m.source_positions if k.endswith(":round")]

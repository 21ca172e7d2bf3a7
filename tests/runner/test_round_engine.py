"""One round engine: one plan key for batch and streaming, one place for a batch round number.

- Workers cache bundle processors by plan key, so the key follows the plan's code: a changed
  DoFn body gets a new one, the same plan the same one.
- A batch SDF stage's round number lives in its checkpoint's ``RoundMetadata``; a store written
  before (which also kept it as the ``<stage>:round`` source position) is of an older state
  layout, refused (``tests/checkpoint/test_old_layouts_refused.py``).
"""

from __future__ import annotations

import apache_beam as beam
import pytest

from sparkbeam.checkpoint import MemoryStorage, open_store
from sparkbeam.runner.batch.stage_rdd import StageRdds
from sparkbeam.runner.batch.stage_rounds import StageRounds
from sparkbeam.runner.rounds.context import RunContext
from sparkbeam.runner.runner import portable_proto
from sparkbeam.runner.task.bundle_splits import SplitPolicy
from sparkbeam.runner.task.worker_context import plan_key
from sparkbeam.translation import translate
from tests.sdf.sdfs import ChunkedWithDelay


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
def test_batch_round_number_comes_from_the_metadata_of_its_stages_round(spark):
    store = open_store(MemoryStorage(), materialization_interval_s=None)
    state = store.pipeline("pipeline-0")
    stage, _ = _sdf_job(spark, store, state, None)

    def restored(metadata):
        return _sdf_job(spark, store, state, metadata)[1].restored_round()

    assert restored({"stage": stage.id, "round": 4}) == 4
    assert restored({}) == -1  # nothing committed
    assert restored({"stage": "stage-other", "round": 2}) == -1  # another stage's round
    assert restored({"stage": stage.id, "round": 9}) == 9

"""Pipeline shapes of real translated pipelines, and which changes a restore accepts."""

from __future__ import annotations

import json

import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.transforms import window
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec

from sparkbeam.checkpoint.manifest import Manifest
from sparkbeam.runner.errors import IncompatiblePipelineError
from sparkbeam.runner.rounds.compatibility import RestoreGuard
from sparkbeam.translation import translate
from sparkbeam.translation.compatibility import compare, incompatible
from sparkbeam.translation.shape import PipelineShape, pipeline_shapes
from tests.translation.test_translate import _CountTo, _proto


class _CountPerUser(beam.DoFn):
    COUNT = ReadModifyWriteStateSpec("count", VarIntCoder())

    def process(self, kv, count=beam.DoFn.StateParam(COUNT)):
        count.write((count.read() or 0) + 1)
        yield kv


def _to_kv(x):
    return str(x), 1


def _to_kv_changed(x):  # a different body, same types
    return str(x * 2), 1


def _plan(key=str, fn=_to_kv, stateful=True, window_s=10, log_counts=False, log_groups=False):
    p = beam.Pipeline()
    kvs = (
        p
        | "Sizes" >> beam.Create([3, 4])
        | "Read" >> beam.ParDo(_CountTo())
        | "ToKV" >> beam.Map(fn).with_output_types(tuple[key, int])
    )
    if stateful:
        counted = kvs | "CountPerUser" >> beam.ParDo(_CountPerUser())
    grouped = (
        kvs
        | "Window" >> beam.WindowInto(window.FixedWindows(window_s))
        | "Group" >> (beam.GroupByKey())
    )
    if log_groups:
        _ = grouped | "LogGroups" >> beam.Map(print)
    if stateful and log_counts:  # added last: the ids Beam gives earlier parts stay the same
        _ = counted | "LogCounts" >> beam.Map(print)
    return translate(_proto(p))


def _shape(**kw) -> PipelineShape:
    (shape,) = pipeline_shapes(_plan(**kw)).values()
    return shape


def test_shape_names_state_bearing_stages_and_round_trips_json():
    shape = _shape()
    kinds = {(s.kind, s.transform) for s in shape.stages}
    assert kinds == {("sdf", "Read"), ("stateful", "CountPerUser")}
    (stateful,) = [s for s in shape.stages if s.kind == "stateful"]
    assert stateful.state == (("CountPerUser/count", "read_modify_write(coder=int)"),)
    (group,) = shape.groups
    assert group.transform == "Group" and "KV<str,int>" in group.input_coder
    assert dict(group.windowing)["window_fn"].startswith("FixedWindows(size { seconds: 10 }")
    again = PipelineShape.from_json(json.loads(json.dumps(shape.to_json())))
    assert again == shape and again.fingerprint == shape.fingerprint


def test_changed_dofn_body_is_compatible():
    old, new = _shape(), _shape(fn=_to_kv_changed)
    assert old.fingerprint == new.fingerprint
    assert compare(old, new) == []


def test_added_stateless_transform_fused_into_a_stage_is_compatible():
    assert compare(_shape(), _shape(log_counts=True)) == []


def test_added_stage_that_renumbers_a_stateful_stage_is_incompatible():
    # Stage ids follow the topological order (ties by name); the state is kept by stage id.
    texts = [d.what for d in incompatible(compare(_shape(), _shape(log_groups=True)))]
    assert texts and all(" moved from stage-" in t for t in texts), texts


def test_changed_group_by_key_coder_is_incompatible_and_named():
    differences = incompatible(compare(_shape(), _shape(key=bytes)))
    texts = [d.what for d in differences]
    assert any(
        t.startswith("coder of GroupByKey 'Group' input changed from")
        and "KV<str,int>" in t
        and "KV<bytes,int>" in t
        for t in texts
    ), texts
    assert any("input coder of stateful stage 'CountPerUser'" in t for t in texts), texts


def test_removed_stateful_stage_is_incompatible():
    old = _shape()
    (stateful,) = [s for s in old.stages if s.kind == "stateful"]
    texts = [d.what for d in incompatible(compare(old, _shape(stateful=False)))]
    assert f"stateful stage 'CountPerUser' ({stateful.id}) was removed" in texts


def test_changed_windowing_of_a_group_is_incompatible():
    texts = [d.what for d in incompatible(compare(_shape(), _shape(window_s=20)))]
    assert any(t.startswith("windowing of GroupByKey 'Group' changed: window_fn") for t in texts)


def _manifest(plan, metadata, fingerprint=None) -> Manifest:
    return Manifest(
        pipeline_id=plan.pipelines[0].id,
        checkpoint_id=7,
        created=0.0,
        fingerprint=plan.fingerprint if fingerprint is None else fingerprint,
        parallelism=2,
        max_key_groups=128,
        metadata=metadata,
    )


def test_guard_refuses_with_the_differences_and_how_to_start_fresh():
    old = _plan()
    stored = RestoreGuard(old).metadata(old.pipelines[0].id)
    RestoreGuard(_plan(fn=_to_kv_changed)).check(_manifest(old, stored), "/ckpt")
    with pytest.raises(
        IncompatiblePipelineError,
        match=r"(?s)Checkpoint 7 of pipeline 'pipeline-0' in '/ckpt'.*"
        r"coder of GroupByKey 'Group' input changed.*new --checkpoint_dir.*"
        r"'/ckpt/pipelines/pipeline-0'",
    ):
        RestoreGuard(_plan(key=bytes)).check(_manifest(old, stored), "/ckpt")


def test_guard_refuses_a_checkpoint_without_a_shape_record():
    plan = _plan()  # the runner records one in every checkpoint; none: not the runner's
    with pytest.raises(IncompatiblePipelineError, match="it records no pipeline shape"):
        RestoreGuard(plan).check(_manifest(plan, {}), "/ckpt")

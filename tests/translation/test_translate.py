"""Translation: Beam's phases, the SDF fusion break, independent pipelines, errors."""

from __future__ import annotations

import pickle

import apache_beam as beam
import pytest
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import environments
from apache_beam.transforms.core import RestrictionProvider

from sparkbeam.translation import EdgeKind, translate


def _proto(p: beam.Pipeline):
    return p.to_runner_api(default_environment=environments.EmbeddedPythonEnvironment.default())


class _Offsets(RestrictionProvider):
    def initial_restriction(self, element):
        return OffsetRange(0, element)

    def create_tracker(self, restriction):
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, element, restriction):
        return restriction.size()


class _CountTo(beam.DoFn):
    def process(self, element, tracker=beam.DoFn.RestrictionParam(_Offsets())):
        pos = tracker.current_restriction().start
        while tracker.try_claim(pos):
            yield pos
            pos += 1


def test_sdf_process_stage_is_the_root_after_a_reshuffle():
    p = beam.Pipeline()
    _ = p | beam.Create([3, 4]) | beam.ParDo(_CountTo()) | beam.Map(str)
    plan = translate(_proto(p))
    sdf_stages = [s for s in plan.stages if s.is_sdf_process]
    assert len(sdf_stages) == 1
    (stage,) = sdf_stages
    assert [plan.edge(b).kind for b in stage.input_buffers] == [EdgeKind.RESHUFFLE]
    # The split stage before the break writes that reshuffle buffer.
    writers = [s for s in plan.stages if set(s.output_buffers) & set(stage.input_buffers)]
    assert writers and all(
        any("SplitAndSizeRestriction" in t for t in w.transforms) for w in writers
    )


@pytest.mark.parametrize("is_drain", [False, True], ids=["run", "drain"])
def test_sdf_with_a_side_input_reads_it_in_its_process_stage_not_in_the_reshuffle(is_drain):
    """expand_sdf gives the Reshuffle it inserts the SDF's side inputs too (issue 43, 5): the
    buffer write shuffles the main input alone, and the process stage after the break reads the
    side input (as does the split stage before it, which runs the same DoFn). A drain puts
    TruncateAndSizeRestriction between the Reshuffle and the process transform."""
    p = beam.Pipeline()
    side = p | "Side" >> beam.Create([100])
    _ = p | beam.Create([3]) | beam.ParDo(_CountTo(), beam.pvalue.AsSingleton(side))
    plan = translate(_proto(p), is_drain=is_drain)
    (stage,) = [s for s in plan.stages if s.is_sdf_process]
    assert [plan.edge(b).kind for b in stage.input_buffers] == [EdgeKind.RESHUFFLE]
    (side_buffer,) = {si.buffer for si in stage.side_inputs}
    (writer,) = [s for s in plan.stages if set(s.output_buffers) & set(stage.input_buffers)]
    assert writer.id != stage.id and {si.buffer for si in writer.side_inputs} == {side_buffer}
    (side_writer,) = [s for s in plan.stages if side_buffer in s.output_buffers]
    order = [s.id for s in plan.stages]
    assert order.index(side_writer.id) < order.index(stage.id)


def test_a_reshuffle_of_two_data_inputs_is_refused_by_name():
    p = beam.Pipeline()
    _ = p | "Other" >> beam.Create([2])
    _ = p | beam.Create([1]) | "Shuffle" >> beam.Reshuffle()
    proto = _proto(p)
    (shuffle,) = [t for t in proto.components.transforms.values() if t.unique_name == "Shuffle"]
    (other_out,) = [
        pc
        for t in proto.components.transforms.values()
        if t.unique_name == "Other/Map(decode)"
        for pc in t.outputs.values()
    ]
    shuffle.inputs["second"] = other_out
    with pytest.raises(NotImplementedError, match=r"'Shuffle' needs a Reshuffle of 2 inputs"):
        translate(proto)


def test_independent_pipelines_are_connected_components():
    p = beam.Pipeline()
    a = p | "A" >> beam.Create([1]) | "GA" >> beam.Map(lambda x: (x, x)) | "G" >> beam.GroupByKey()
    side = p | "Side" >> beam.Create([2])
    _ = a | "UseSide" >> beam.Map(lambda kv, s: kv, beam.pvalue.AsList(side))
    _ = p | "B" >> beam.Create(["b"]) | "MB" >> beam.Map(str.upper)
    plan = translate(_proto(p))
    assert len(plan.pipelines) == 2
    sizes = sorted(len(pp.stages) for pp in plan.pipelines)
    assert sizes[0] == 1 and sizes[1] >= 3  # B alone; A + side + GBK together
    assert {s.pipeline for s in plan.stages} == {pp.id for pp in plan.pipelines}


def test_plan_is_plain_picklable_data_and_prints():
    p = beam.Pipeline()
    _ = p | beam.Create([1, 2]) | beam.Map(lambda x: (x, 1)) | beam.CombinePerKey(sum)
    plan = translate(_proto(p))
    assert pickle.loads(pickle.dumps(plan)).stages == plan.stages
    text = plan.describe()
    assert "group:" in text and "CombinePerKey" in text


def test_teststream_outputs_become_runner_fed_buffers_of_one_pipeline():
    p = beam.Pipeline()
    events = p | "MyEvents" >> TestStream(output_tags={"a", "b"}).add_elements([1], tag="a")
    _ = events["a"] | "A" >> beam.Map(str)
    _ = events["b"] | "B" >> beam.Map(str)
    plan = translate(_proto(p))
    (source,) = plan.test_streams
    assert source.transform == "MyEvents"
    assert [tag for tag, _ in source.outputs] == ["a", "b"]
    kinds = {plan.edge(b).kind for _, b in source.outputs}
    assert kinds == {EdgeKind.TEST_STREAM}
    readers = [s for s in plan.stages if set(s.input_buffers) & {b for _, b in source.outputs}]
    assert len(readers) == 2  # one per output tag, each fused with its consumer
    assert len(plan.pipelines) == 1  # both outputs share the TestStream's events and clock


def test_streaming_keeps_earliest_output_combines_unlifted():
    """In streaming a pre-combine would merge a late element's timestamp into its accumulator's
    and lose the pane's hold (tests/streaming/test_late_data_holds.py); batch lifts them all."""

    def plan(streaming: bool, combiner):
        p = beam.Pipeline()
        _ = (
            p
            | beam.Create([("k", 1)])
            | beam.WindowInto(beam.window.FixedWindows(10), timestamp_combiner=combiner)
            | "Sum" >> beam.CombinePerKey(sum)
        )
        names = [n for s in translate(_proto(p), streaming=streaming).stages for n in s.transforms]
        return any("Precombine" in n for n in names)

    earliest = beam.window.TimestampCombiner.OUTPUT_AT_EARLIEST
    assert plan(False, earliest)
    assert not plan(True, earliest)
    assert plan(True, beam.window.TimestampCombiner.OUTPUT_AT_LATEST)


def test_translation_never_imports_pyspark():
    import subprocess
    import sys

    code = (
        "import sys, sparkbeam.translation as t; "
        "assert not any(m.startswith('pyspark') for m in sys.modules), 'pyspark imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)

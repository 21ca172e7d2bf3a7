"""The planning phases: Beam's own fusion phases plus those sparkbeam adds.

Each phase is a pure function ``(stages, context) -> stages`` as in Beam's
``fn_api_runner.translations``. sparkbeam adds ``expand_test_stream``, ``expand_text_reads``,
``lift_combiners_keeping_holds`` and ``expand_reshuffle``, which turns a runner-known Reshuffle
(including the one ``expand_sdf`` inserts before an SDF's process stage) into a buffer write
and a read, as ``expand_gbk`` does for GroupByKey: a Spark repartition, the fusion break.
"""

from __future__ import annotations

from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.portability.fn_api_runner import translations as t

from sparkbeam.translation.buffer_reads import buffer_stage
from sparkbeam.translation.errors import UnsupportedFeatureError
from sparkbeam.translation.plan import EdgeKind
from sparkbeam.translation.test_stream import TEST_STREAM_URN, expand_test_stream
from sparkbeam.translation.text_reads import TEXT_READ_URN, expand_text_reads

FLATTEN_URN = common_urns.primitives.FLATTEN.urn
GBK_URN = common_urns.primitives.GROUP_BY_KEY.urn
RESHUFFLE_URN = common_urns.composites.RESHUFFLE.urn
COMBINE_PER_KEY_URN = common_urns.composites.COMBINE_PER_KEY.urn

KNOWN_RUNNER_URNS = frozenset([FLATTEN_URN, GBK_URN, RESHUFFLE_URN, TEST_STREAM_URN, TEXT_READ_URN])
"""Transforms the runner executes itself (Impulse is handled by impulse_to_input)."""

SDF_PROCESS_URN = common_urns.sdf_components.PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS.urn
SDF_PARDO_URNS = frozenset(
    [SDF_PROCESS_URN, common_urns.sdf_components.TRUNCATE_SIZED_RESTRICTION.urn]
)
"""The consumers of expand_sdf's Reshuffle; their payload is the SDF's ParDoPayload."""


def expand_reshuffle(stages, context):
    """Transforms each runner-known Reshuffle into a buffer write of its data input (not the
    side inputs ``expand_sdf`` names on it: ``_data_input``) followed by a read."""
    for stage in stages:
        if len(stage.transforms) != 1 or stage.transforms[0].spec.urn != RESHUFFLE_URN:
            yield stage
            continue
        transform = stage.transforms[0]
        inputs = _data_input(transform, context)
        for pcoll_id in list(inputs.values()) + list(transform.outputs.values()):
            context.length_prefix_pcoll_coders(pcoll_id)
        name = transform.unique_name
        buffer_id = t.create_buffer_id(name, kind=EdgeKind.RESHUFFLE.value)
        write = buffer_stage(name + "/Write", {}, buffer_id, frozenset(), stage.must_follow, inputs)
        yield write
        yield buffer_stage(
            name + "/Read",
            transform.outputs,
            buffer_id,
            stage.downstream_side_inputs,
            t.union(frozenset([write]), stage.must_follow),
        )


def _data_input(transform, context) -> dict:
    """The Reshuffle's one data input, as ``{tag: pcollection}``: the one ``expand_sdf``
    inserts also names the SDF's side inputs, which its consumer reads, not the shuffle."""
    (output,) = transform.outputs.values()
    side_tags: set[str] = set()
    for consumer in context.components.transforms.values():
        if output in consumer.inputs.values() and consumer.spec.urn in SDF_PARDO_URNS:
            payload = beam_runner_api_pb2.ParDoPayload.FromString(consumer.spec.payload)
            side_tags.update(payload.side_inputs)
    data = {tag: pcoll for tag, pcoll in transform.inputs.items() if tag not in side_tags}
    if len(data) != 1:
        raise UnsupportedFeatureError(
            transform.unique_name,
            f"a Reshuffle of {len(data)} inputs ({sorted(data)})",
            "Flatten the inputs before the Reshuffle.",
        )
    return data


def lift_combiners_keeping_holds(stages, context):
    """Beam's ``lift_combiners``, except for combines whose output time is the earliest input's.

    In streaming a late element holds nothing, so the pane's timestamp is the earliest of the
    elements that were not late; a pre-combine merges its elements' timestamps into their
    minimum, maybe a late one's, and the pane would come out at the end of the window. Those
    combines run unlifted (GroupByKey, then the combine).
    """
    for stage in stages:
        transform = t.only_transform(stage.transforms)
        if transform.spec.urn == COMBINE_PER_KEY_URN and _output_at_earliest(transform, context):
            for sub in transform.subtransforms:
                yield t.Stage(
                    sub,
                    [context.components.transforms[sub]],
                    downstream_side_inputs=stage.downstream_side_inputs,
                    must_follow=stage.must_follow,
                    parent=stage.name,
                    environment=stage.environment,
                )
        else:
            yield from t.lift_combiners([stage], context)


def _output_at_earliest(transform, context) -> bool:
    components = context.components
    (pcoll,) = transform.inputs.values()
    windowing = components.windowing_strategies[
        components.pcollections[pcoll].windowing_strategy_id
    ]
    return windowing.output_time == beam_runner_api_pb2.OutputTime.EARLIEST_IN_PANE


def standard_phases(streaming: bool = False) -> list:
    """The named phases, in order. ``streaming`` keeps the watermark holds of combines with an
    earliest-input output time; batch has no late data, so every combine may lift."""
    return [
        t.annotate_downstream_side_inputs,
        # A stateful DoFn starts its own stage: the runner partitions its input by key.
        t.annotate_stateful_dofns_as_roots,
        t.fix_side_input_pcoll_coders,
        t.pack_combiners,
        lift_combiners_keeping_holds if streaming else t.lift_combiners,
        t.expand_sdf,
        t.expand_gbk,
        expand_reshuffle,
        expand_test_stream,
        expand_text_reads,
        t.sink_flattens,
        t.greedily_fuse,
        t.read_to_impulse,
        t.impulse_to_input,
        t.sort_stages,
        t.add_impulse_to_dangling_transforms,
        t.setup_timer_mapping,
        t.populate_data_channel_coders,
    ]

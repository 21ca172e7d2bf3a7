"""TestStream: the runner, not an SDK worker, emits its events.

Only a runner can play a ``TestStream``'s events (elements, watermark and processing-time
advances), at round boundaries. ``expand_test_stream`` replaces the TestStream stage by one
buffer read per output (``teststream:<pcollection>``), as ``expand_gbk`` does for GroupByKey,
so its consumers fuse as usual; ``test_stream_sources`` records its events for the runner.
"""

from __future__ import annotations

from dataclasses import dataclass

from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2

from sparkbeam.translation.buffer_reads import buffer_of, buffer_stage
from sparkbeam.translation.plan import BufferId, EdgeKind

TEST_STREAM_URN = common_urns.primitives.TEST_STREAM.urn


@dataclass(frozen=True)
class TestStreamSource:
    """One TestStream of the plan: its serialized events and the buffer of each output tag."""

    __test__ = False  # not a pytest test class

    transform: str  # the user's name of the TestStream
    payload: bytes  # serialized beam_runner_api_pb2.TestStreamPayload
    outputs: tuple[tuple[str, BufferId], ...]  # (output tag, buffer)


def expand_test_stream(stages, context):
    """Each TestStream stage becomes one read stage per output; consumers fuse with them."""
    for stage in stages:
        if len(stage.transforms) != 1 or stage.transforms[0].spec.urn != TEST_STREAM_URN:
            yield stage
            continue
        transform = stage.transforms[0]
        for tag, pcoll in sorted(transform.outputs.items()):
            context.length_prefix_pcoll_coders(pcoll)
            name = f"{transform.unique_name}/Read/{tag}"
            yield buffer_stage(
                name,
                {tag: pcoll},
                buffer_of(EdgeKind.TEST_STREAM, pcoll).encode("utf-8"),
                stage.downstream_side_inputs,
                stage.must_follow,
            )


def test_stream_sources(components: beam_runner_api_pb2.Components) -> tuple[TestStreamSource, ...]:
    """Every TestStream in ``components`` (the pipeline before fusion), in a stable order."""
    sources = []
    for tid, transform in sorted(components.transforms.items()):
        if transform.spec.urn != TEST_STREAM_URN:
            continue
        outputs = tuple(
            (tag, buffer_of(EdgeKind.TEST_STREAM, pc))
            for tag, pc in sorted(transform.outputs.items())
        )
        sources.append(
            TestStreamSource(transform.unique_name or tid, transform.spec.payload, outputs)
        )
    return tuple(sources)


test_stream_sources.__test__ = False  # type: ignore[attr-defined]  # not a pytest test

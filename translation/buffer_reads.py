"""A stage that only reads (or writes) a buffer the runner moves: its consumers fuse with it.

The phases that replace a transform by a runner-fed buffer (a Reshuffle's two sides, each
TestStream output, a runner-read ``ReadFromText``) all yield such stages, as Beam's
``expand_gbk`` does for GroupByKey.
"""

from __future__ import annotations

from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.portability.fn_api_runner import translations as t
from apache_beam.runners.worker import bundle_processor

from sparkbeam.translation.plan import BufferId, EdgeKind


def buffer_of(kind: EdgeKind, name: str) -> BufferId:
    """Beam's ``kind:name`` id of the buffer of a runner-fed edge."""
    return BufferId(t.create_buffer_id(name, kind=kind.value).decode("utf-8"))


def buffer_stage(
    name: str, outputs: dict, buffer: bytes, downstream_side_inputs, must_follow, inputs=None
) -> t.Stage:
    """A stage of one data-input transform ``name`` reading ``buffer`` into ``outputs``, or,
    given ``inputs``, of one data-output transform writing them to it."""
    urn = bundle_processor.DATA_OUTPUT_URN if inputs else bundle_processor.DATA_INPUT_URN
    return t.Stage(
        name,
        [
            beam_runner_api_pb2.PTransform(
                unique_name=name,
                inputs=inputs,
                outputs=outputs,
                spec=beam_runner_api_pb2.FunctionSpec(urn=urn, payload=buffer),
            )
        ],
        downstream_side_inputs=downstream_side_inputs,
        must_follow=must_follow,
    )

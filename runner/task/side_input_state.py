"""Serving materialized side inputs to the SDK through the Fn API state protocol.

Owns: writing a stage's side-input chunks (collected, or read from a streaming side input's
files, ``side_input_files``) into the in-process ``StateServicer`` under the state keys the SDK
reads. Leaves collecting them and running the stage (``bundle_executor``) to others.
"""

from __future__ import annotations

import struct
from typing import Any

from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2
from apache_beam.runners.portability.fn_api_runner.execution import WindowGroupingBuffer

from sparkbeam.runner.task.side_input_files import side_input_chunks
from sparkbeam.translation.plan import StagePlan


def load_side_inputs(state, context, stage: StagePlan, side_inputs: dict) -> None:
    """Put one stage's materialized side inputs into ``state`` (as FnApiRunner does)."""
    for si in stage.side_inputs:
        chunks = side_input_chunks(side_inputs.get(si.buffer))  # streaming: maybe files
        access = beam_runner_api_pb2.FunctionSpec(urn=si.access_pattern_urn)
        grouped = WindowGroupingBuffer(access, context.coders[si.coder])
        for data in chunks:
            grouped.append(data)
        if si.access_pattern_urn == common_urns.side_inputs.ITERABLE.urn:
            for _, window, data, _ in grouped.encoded_items():
                state.append_raw(_state_key(si, "iterable_side_input", window), data)
        elif si.access_pattern_urn == common_urns.side_inputs.MULTIMAP.urn:
            for key, window, data, count in grouped.encoded_items():
                state.append_raw(_state_key(si, "multimap_side_input", window, key=key), data)
                state.append_raw(_state_key(si, "multimap_keys_side_input", window), key)
                state.append_raw(
                    _state_key(si, "multimap_keys_values_side_input", window),
                    key + struct.pack(">i", count) + data,
                )
        else:
            raise NotImplementedError(f"side input access pattern {si.access_pattern_urn!r}")


def _state_key(si, kind: str, window: bytes, **key: bytes) -> beam_fn_api_pb2.StateKey:
    """Side input ``si``'s state key of ``kind`` (a ``StateKey`` field) in ``window``."""
    side_input = {"transform_id": si.transform, "side_input_id": si.tag, "window": window, **key}
    fields: dict[str, Any] = {kind: side_input}
    return beam_fn_api_pb2.StateKey(**fields)

"""Task side of startpoints: rewrite the restrictions entering an SDF process stage.

`StartpointApplier` decodes each ``((element, (restriction, watermark_estimator_state)), size)``
entering a ``ProcessSizedElementsAndRestrictions`` stage (initial restrictions and re-fed
residuals alike) with the stage's own data-input coder, asks the DoFn's restriction provider for
the restriction a startpoint implies, recomputes the size and re-encodes. Every element that
meets a startpoint yields a `StartpointOutcome`, applied or not, so that only applied
startpoints are deleted. Leaves to others: which startpoints apply (`session`), the hooks
(`restrictions`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from apache_beam.coders.coder_impl import create_InputStream, create_OutputStream
from apache_beam.internal import pickler
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2
from apache_beam.runners import common, pipeline_context
from apache_beam.runners.worker.bundle_processor import DATA_INPUT_URN

from sparkbeam.checkpoint.startpoints import Startpoint
from sparkbeam.sdf.startpoints.errors import StartpointApplyError
from sparkbeam.sdf.startpoints.restrictions import (
    element_key,
    estimator_state_for_startpoint,
    restriction_for_startpoint,
)

SDF_PROCESS_URN = common_urns.sdf_components.PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS.urn
_PROCESS_SUFFIX = "/Process"


@dataclass(frozen=True)
class SdfSource:
    """An SDF process stage as startpoints see it: the user's transform and how to decode input."""

    stage: str
    source: str
    """The user's SDF transform name (``ReadOffsets``), what ``--transform`` names."""
    input_transform: str
    """The stage's data-input transform: rows (and re-fed residuals) arrive tagged with it."""
    input_coder: str
    """Windowed coder id of that input, with the real element and restriction coders."""
    pardo_payload: bytes


def sdf_source(stage: Any) -> SdfSource | None:
    """The SDF source of a plan stage (``StagePlan``), None if it is no SDF process stage."""
    descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(stage.descriptor)
    transforms = descriptor.transforms
    for tid, proto in transforms.items():
        if proto.spec.urn != SDF_PROCESS_URN:
            continue
        read = _data_input_feeding(transforms, proto)
        port = beam_fn_api_pb2.RemoteGrpcPort.FromString(transforms[read].spec.payload)
        name = proto.unique_name or tid
        return SdfSource(
            stage=stage.id,
            source=name.removesuffix(_PROCESS_SUFFIX),
            input_transform=read,
            input_coder=port.coder_id,
            pardo_payload=proto.spec.payload,
        )
    return None


def _data_input_feeding(transforms, proto) -> str:
    """Walk back from the process transform's main input (through Truncate) to the data input."""
    payload = beam_runner_api_pb2.ParDoPayload.FromString(proto.spec.payload)
    others = set(payload.side_inputs) | set(payload.timer_family_specs)
    (pcoll,) = [p for tag, p in proto.inputs.items() if tag not in others]
    while True:
        producer = next(
            (tid for tid, t in transforms.items() if pcoll in t.outputs.values()), None
        )  # fmt: skip
        if producer is None:
            raise ValueError(f"No data input feeds SDF transform {proto.unique_name!r}")
        if transforms[producer].spec.urn == DATA_INPUT_URN:
            return producer
        pcoll = next(iter(transforms[producer].inputs.values()))


def restriction_provider(source: SdfSource) -> Any:
    """The DoFn's RestrictionProvider, unpickled the way Beam's bundle_processor does it."""
    return _signature(source).get_restriction_provider()


def _signature(source: SdfSource) -> Any:
    payload = beam_runner_api_pb2.ParDoPayload.FromString(source.pardo_payload)
    return common.DoFnSignature(pickler.loads(payload.do_fn.payload)[0])


@dataclass(frozen=True)
class StartpointAssignment:
    """The startpoints one SDF process stage may apply in one round; shipped to its tasks."""

    stage: str
    source: str
    by_key: tuple[tuple[str, Startpoint], ...] = ()
    """Per-element startpoints, by element key."""
    default: Startpoint | None = None
    """The transform-level startpoint, for elements without their own, while its fan-out is open."""

    store_url: str = ""
    """The store's URL, for the delete command a failed application names."""

    def __bool__(self) -> bool:
        return bool(self.by_key) or self.default is not None


@dataclass(frozen=True)
class StartpointOutcome:
    """Task -> driver: an element met a startpoint; ``applied``: its restriction took it."""

    stage: str
    source: str
    element_key: str
    token: str
    applied: bool


class StartpointApplier:
    """Applies one stage's `StartpointAssignment` to its encoded input; collects outcomes."""

    def __init__(self, stage: Any, components: bytes, assignment: StartpointAssignment) -> None:
        source = sdf_source(stage)
        if source is None:
            raise ValueError(f"Stage {stage.id!r} has no SDF process transform")
        self.source = source
        self.assignment = assignment
        self.by_key = dict(assignment.by_key)
        signature = _signature(source)
        self.provider = signature.get_restriction_provider()
        # The DoFn's WatermarkEstimatorProvider (Beam's default one when it declares none).
        self.estimators = signature.get_watermark_estimator_provider()
        context = pipeline_context.PipelineContext(
            beam_runner_api_pb2.Components.FromString(components)
        )
        self.coder = context.coders[source.input_coder].get_impl()
        self.outcomes: list[StartpointOutcome] = []

    def element_key_of(self, encoded: bytes) -> str:
        """The startpoint key of one encoded process-stage element (also used on the driver)."""
        wv = self.coder.decode_from_stream(create_InputStream(encoded), True)
        return element_key(self.provider, wv.value[0][0])

    def apply_chunk(self, data: bytes) -> bytes:
        """A chunk of concatenated encoded elements in, the rewritten chunk out."""
        stream = create_InputStream(data)
        values, changed = [], False
        while stream.size() > 0:
            wv = self.coder.decode_from_stream(stream, True)
            new, outcome = self._apply(wv)
            if outcome is not None:
                self.outcomes.append(outcome)
            changed = changed or new is not wv
            values.append(new)
        if not changed:
            return data
        out = create_OutputStream()
        for wv in values:
            self.coder.encode_to_stream(wv, out, True)
        return out.get()

    def apply_rows(self, rows: Iterable[tuple[str, bytes]]) -> Iterator[tuple[str, bytes]]:
        """The stage's (transform, chunk) input rows, rewritten; outcomes land in ``outcomes``."""
        read = self.source.input_transform
        for transform, data in rows:
            yield transform, (self.apply_chunk(data) if transform == read else data)

    def _apply(self, wv: Any) -> tuple[Any, StartpointOutcome | None]:
        (element, (restriction, estimator_state)), _ = wv.value
        key = element_key(self.provider, element)
        sp = self.by_key.get(key, self.assignment.default)
        if sp is None:
            return wv, None
        try:
            new, state, size = self._restriction(element, restriction, estimator_state, sp)
        except Exception as e:  # noqa: BLE001 - named, with the command that deletes it
            raise StartpointApplyError(sp, self.assignment.store_url, key, e) from e
        outcome = StartpointOutcome(
            self.source.stage, self.source.source, key, sp.token, new is not None
        )
        if new is None:
            return wv, outcome
        return wv.with_value(((element, (new, state)), size)), outcome

    def _restriction(self, element, restriction, estimator_state, sp) -> tuple[Any, Any, float]:
        """The new restriction (None: no data there yet), its estimator state and size."""
        new = restriction_for_startpoint(
            self.provider, self.source.source, element, restriction, sp
        )  # fmt: skip
        if new is None:
            return None, estimator_state, 0.0
        size = float(self.provider.restriction_size(element, new))
        state = estimator_state_for_startpoint(
            self.provider, self.estimators, element, new, estimator_state, sp
        )  # fmt: skip
        return new, state, size

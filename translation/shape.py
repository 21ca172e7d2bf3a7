"""The state-bearing shape of each independent pipeline: what a checkpoint depends on.

A checkpoint keeps SDF residuals and committed round outputs (by stage id and buffer),
GroupByKey buffers (by edge), side-input values (by buffer) and stateful stages' user state and
timers. A restore is safe when the new plan keeps the same state under the same ids in the same
coders; DoFn code and stateless stages do not matter. `PipelineShape` records that as JSON-able
data, coders and windowing described from their protos (never from pickled user code), for a
manifest and `sparkbeam.translation.compatibility`. No Spark import.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from apache_beam.portability import common_urns, python_urns
from apache_beam.portability.api import (
    beam_fn_api_pb2,
    beam_runner_api_pb2,
    standard_window_fns_pb2,
)
from apache_beam.runners.portability.fn_api_runner import translations as t
from google.protobuf import text_format

from sparkbeam.translation.phases import SDF_PROCESS_URN
from sparkbeam.translation.plan import EdgeKind, ExecutionPlan, PipelineId, StagePlan

SHAPE_VERSION = 1
_SHORT_CODERS = {
    common_urns.coders.KV.urn: "KV",
    common_urns.coders.STRING_UTF8.urn: "str",
    common_urns.coders.VARINT.urn: "int",
    common_urns.coders.BYTES.urn: "bytes",
    common_urns.coders.DOUBLE.urn: "float",
    common_urns.coders.BOOL.urn: "bool",
    common_urns.coders.ITERABLE.urn: "Iterable",
    common_urns.coders.LENGTH_PREFIX.urn: "LengthPrefix",
    common_urns.coders.WINDOWED_VALUE.urn: "WindowedValue",
    common_urns.coders.PARAM_WINDOWED_VALUE.urn: "ParamWindowedValue",
    common_urns.coders.GLOBAL_WINDOW.urn: "GlobalWindow",
    common_urns.coders.INTERVAL_WINDOW.urn: "IntervalWindow",
    common_urns.coders.TIMER.urn: "Timer",
    common_urns.coders.ROW.urn: "Row",
    common_urns.coders.NULLABLE.urn: "Nullable",
}
_WINDOW_PAYLOADS: dict[str, tuple[str, Any]] = {
    common_urns.fixed_windows.urn: ("FixedWindows", standard_window_fns_pb2.FixedWindowsPayload),
    common_urns.sliding_windows.urn: (
        "SlidingWindows",
        standard_window_fns_pb2.SlidingWindowsPayload,
    ),
    common_urns.session_windows.urn: ("Sessions", standard_window_fns_pb2.SessionWindowsPayload),
    common_urns.global_windows.urn: ("GlobalWindows", None),
}


@dataclass(frozen=True)
class StageShape:
    """A stage whose state a checkpoint keeps: an SDF process stage or a stateful stage."""

    id: str
    kind: str  # "sdf" or "stateful"
    transform: str  # the user-visible transform that owns the state
    input_coders: tuple[str, ...]  # residuals / keyed input are encoded with these
    output_coders: tuple[tuple[str, str], ...] = ()  # (buffer, coder) of committed outputs
    state: tuple[tuple[str, str], ...] = ()  # (transform/state id, spec with coders)
    timers: tuple[tuple[str, str], ...] = ()  # (transform/family, domain and coder)


@dataclass(frozen=True)
class GroupShape:
    """A GroupByKey edge: streaming keeps its buffered values between rounds."""

    buffer: str
    transform: str
    input_coder: str
    output_coder: str
    windowing: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class SideInputShape:
    """A side input: streaming keeps the values it collected, keyed by its buffer."""

    transform: str
    tag: str
    buffer: str
    coder: str


@dataclass(frozen=True)
class PipelineShape:
    """Everything of one independent pipeline that its checkpoints depend on."""

    pipeline: str
    stages: tuple[StageShape, ...] = ()
    groups: tuple[GroupShape, ...] = ()
    side_inputs: tuple[SideInputShape, ...] = ()

    def to_json(self) -> dict:
        return {"version": SHAPE_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, d: dict) -> PipelineShape:
        if d.get("version") != SHAPE_VERSION:
            raise ValueError(f"pipeline shape version {d.get('version')!r} is not supported")

        def tuples(value: Any) -> Any:  # JSON made the shape's tuples lists
            if isinstance(value, dict):
                return {k: tuples(v) for k, v in value.items()}
            return tuple(map(tuples, value)) if isinstance(value, list) else value

        return cls(
            pipeline=str(d["pipeline"]),
            stages=tuple(StageShape(**tuples(s)) for s in d["stages"]),
            groups=tuple(GroupShape(**tuples(g)) for g in d["groups"]),
            side_inputs=tuple(SideInputShape(**s) for s in d["side_inputs"]),
        )

    @property
    def fingerprint(self) -> str:
        """Equal fingerprints mean equal shapes: the fast path of a restore."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def pipeline_shapes(plan: ExecutionPlan) -> dict[PipelineId, PipelineShape]:
    """The shape of every independent pipeline of ``plan``."""
    components = beam_runner_api_pb2.Components.FromString(plan.components)
    describe = _Describer(components)
    result = {}
    for pipeline in plan.pipelines:
        stages = [plan.stage(sid) for sid in pipeline.stages]
        groups = {
            b: plan.edge(b)
            for s in stages
            for b in s.input_buffers + s.output_buffers
            if plan.edge(b).kind == EdgeKind.GROUP
        }
        result[pipeline.id] = PipelineShape(
            pipeline=pipeline.id,
            stages=tuple(
                shape for s in stages if (shape := _stage_shape(plan, s, describe)) is not None
            ),
            groups=tuple(
                GroupShape(
                    buffer=e.id,
                    transform=_transform_name(components, e.id),
                    input_coder=describe.coder(e.write_coder),
                    output_coder=describe.coder(e.read_coder),
                    windowing=describe.windowing(e.windowing_strategy),
                )
                for e in sorted(groups.values(), key=lambda e: e.id)
            ),
            side_inputs=tuple(
                SideInputShape(si.transform, si.tag, si.buffer, describe.coder(si.coder))
                for s in stages
                for si in s.side_inputs
            ),
        )
    return result


def _transform_name(components: beam_runner_api_pb2.Components, buffer: str) -> str:
    """The user-visible name of a GroupByKey edge's transform (buffers name it by id)."""
    name = t.split_buffer_id(buffer.encode())[1]
    transform = components.transforms.get(name)
    return transform.unique_name if transform is not None and transform.unique_name else name


def _stage_shape(plan: ExecutionPlan, stage: StagePlan, describe: _Describer) -> StageShape | None:
    if not (stage.is_sdf_process or stage.stateful):
        return None
    descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(stage.descriptor)
    owner, state, timers = "", [], []
    for transform in descriptor.transforms.values():
        if transform.spec.urn == SDF_PROCESS_URN:
            owner = owner or transform.unique_name.rsplit("/", 1)[0]
        elif transform.spec.urn in t.PAR_DO_URNS:
            payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
            if payload.state_specs or payload.timer_family_specs:
                owner = owner or transform.unique_name
            for sid, spec in sorted(payload.state_specs.items()):
                state.append((f"{transform.unique_name}/{sid}", describe.state(spec)))
            for family, tspec in sorted(payload.timer_family_specs.items()):
                domain = beam_runner_api_pb2.TimeDomain.Enum.Name(tspec.time_domain)
                coder = describe.coder(tspec.timer_family_coder_id)
                timers.append((f"{transform.unique_name}/{family}", f"{domain} {coder}"))
    outputs: tuple[tuple[str, str], ...] = ()
    if stage.is_sdf_process:  # batch keeps the outputs of committed rounds
        outputs = tuple(
            sorted({(b, describe.coder(plan.edge(b).write_coder)) for b in stage.output_buffers})
        )
    return StageShape(
        id=stage.id,
        kind="sdf" if stage.is_sdf_process else "stateful",
        transform=owner or ", ".join(stage.transforms),
        input_coders=tuple(describe.coder(c) for _, c in stage.input_coders),
        output_coders=outputs,
        state=tuple(state),
        timers=tuple(timers),
    )


class _Describer:
    """Readable, deterministic descriptions of coders and windowing strategies."""

    def __init__(self, components: beam_runner_api_pb2.Components) -> None:
        self.components = components

    def coder(self, coder_id: str) -> str:
        if not coder_id:
            return "-"
        coder = self.components.coders.get(coder_id)
        if coder is None:
            return f"unknown({coder_id})"
        urn, payload = coder.spec.urn, coder.spec.payload
        if urn == python_urns.PICKLED_CODER:
            # The payload is "<ClassName>$<pickle>"; pickles are not stable, the name is.
            name = "pickled:" + payload.split(b"$", 1)[0].decode("utf-8", "replace")
        else:
            name = _SHORT_CODERS.get(urn) or urn.removeprefix("beam:coder:").removesuffix(":v1")
            if payload:
                name += "#" + hashlib.sha256(payload).hexdigest()[:8]
        parts = [self.coder(c) for c in coder.component_coder_ids]
        return f"{name}<{','.join(parts)}>" if parts else name

    def state(self, spec: beam_runner_api_pb2.StateSpec) -> str:
        kind = spec.WhichOneof("spec") or "unknown"
        body = getattr(spec, kind, None) if kind != "unknown" else None
        coders = []
        if body is not None:
            for field, value in body.ListFields():
                if field.name.endswith("coder_id"):
                    role = field.name.removesuffix("coder_id").rstrip("_") or "coder"
                    coders.append(f"{role}={self.coder(value)}")
        return f"{kind.removesuffix('_spec')}({', '.join(coders)})"

    def windowing(self, strategy_id: str) -> tuple[tuple[str, str], ...]:
        if not strategy_id:
            return ()
        ws = self.components.windowing_strategies[strategy_id]
        enum = beam_runner_api_pb2
        return (
            ("window_fn", self._window_fn(ws.window_fn)),
            ("window_coder", self.coder(ws.window_coder_id)),
            ("trigger", text_format.MessageToString(ws.trigger, as_one_line=True)),
            ("accumulation_mode", enum.AccumulationMode.Enum.Name(ws.accumulation_mode)),
            ("allowed_lateness_ms", str(ws.allowed_lateness)),
            ("output_time", enum.OutputTime.Enum.Name(ws.output_time)),
            ("closing_behavior", enum.ClosingBehavior.Enum.Name(ws.closing_behavior)),
            ("on_time_behavior", enum.OnTimeBehavior.Enum.Name(ws.on_time_behavior)),
            ("merge_status", enum.MergeStatus.Enum.Name(ws.merge_status)),
        )

    def _window_fn(self, fn: beam_runner_api_pb2.FunctionSpec) -> str:
        known = _WINDOW_PAYLOADS.get(fn.urn)
        if known is None:  # a custom (pickled) WindowFn: its class is all we can name
            return fn.urn
        name, payload_type = known
        if payload_type is None:
            return name
        payload = payload_type.FromString(fn.payload)
        return f"{name}({text_format.MessageToString(payload, as_one_line=True)})"

"""Pipeline proto -> ExecutionPlan.

Runs the planning phases (``phases``), then reads the fused stages into plain data: one
``StagePlan`` per executable stage with its ProcessBundleDescriptor, one ``Edge`` per buffer
between stages, and the independent pipelines (connected components). No Spark here: the
runner decides how edges become shuffles.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib

from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2, endpoints_pb2
from apache_beam.runners.pipeline_utils import (
    merge_common_environments,
    merge_superset_dep_environments,
    validate_pipeline_graph,
)
from apache_beam.runners.portability.fn_api_runner import translations as t
from apache_beam.runners.portability.fn_api_runner.execution import SAFE_WINDOW_FNS
from apache_beam.runners.worker import bundle_processor

from sparkbeam.translation.edge_coders import same_coder, same_grouped_coders
from sparkbeam.translation.phases import KNOWN_RUNNER_URNS, SDF_PROCESS_URN, standard_phases
from sparkbeam.translation.plan import (
    IMPULSE_BUFFER,
    BufferId,
    Edge,
    EdgeKind,
    ExecutionPlan,
    PipelineId,
    PipelinePlan,
    SideInput,
    StageId,
    StagePlan,
    TimerFamily,
)
from sparkbeam.translation.requirements import check_requirements
from sparkbeam.translation.test_stream import test_stream_sources
from sparkbeam.translation.text_reads import TEXT_LINES_INPUT_URN, mark_text_reads
from sparkbeam.translation.window_into import mark_window_into

_FAKE_ENDPOINT = endpoints_pb2.ApiServiceDescriptor(url="in-process")


def translate(
    pipeline: beam_runner_api_pb2.Pipeline, *, is_drain: bool = False, streaming: bool = False
) -> ExecutionPlan:
    """Plan a portable pipeline for execution; raises for unsupported features. ``streaming``
    (implied by a TestStream) plans for late data; a batch plan reads plain text files itself."""
    pipeline = copy.deepcopy(pipeline)
    validate_pipeline_graph(pipeline)
    check_requirements(pipeline)
    pipeline = merge_common_environments(merge_superset_dep_environments(pipeline))
    sources = test_stream_sources(pipeline.components)
    streaming = streaming or bool(sources)
    text_reads = () if streaming else mark_text_reads(pipeline)
    context, stages = t.create_and_optimize_stages(
        pipeline,
        phases=standard_phases(streaming),
        known_runner_urns=KNOWN_RUNNER_URNS,
        is_drain=is_drain,
    )
    ordered = _stable_order(stages)
    return _PlanBuilder(context).build(ordered, tuple(pipeline.requirements), sources, text_reads)


def _stable_order(stages: list) -> list:
    """A topological order that is the same in every process (Kahn's, ties broken by name):
    Beam's ``sort_stages`` walks a frozenset, and a restore needs stable stage ids."""
    import heapq

    def buffers(stage, urn):
        return {
            tr.spec.payload
            for tr in stage.transforms
            if tr.spec.urn == urn and tr.spec.payload != t.IMPULSE_BUFFER
        }

    writers: dict[bytes, list] = {}
    for st in stages:
        for b in buffers(st, bundle_processor.DATA_OUTPUT_URN):
            writers.setdefault(b, []).append(st)
    deps: dict[int, set[int]] = {id(st): set() for st in stages}
    by_id = {id(st): st for st in stages}
    for st in stages:
        reads = buffers(st, bundle_processor.DATA_INPUT_URN)
        reads |= {t.create_buffer_id(pc) for pc in st.side_inputs()}
        for b in reads:
            deps[id(st)] |= {id(w) for w in writers.get(b, []) if w is not st}
        deps[id(st)] |= {id(m) for m in st.must_follow if id(m) in by_id and m is not st}
    users: dict[int, set[int]] = {k: set() for k in deps}
    for k, ds in deps.items():
        for d in ds:
            users[d].add(k)
    ready = [(by_id[k].name, k) for k, ds in deps.items() if not ds]
    heapq.heapify(ready)
    ordered = []
    while ready:
        _, k = heapq.heappop(ready)
        ordered.append(by_id[k])
        for u in users[k]:
            deps[u].discard(k)
            if not deps[u]:
                heapq.heappush(ready, (by_id[u].name, u))
    if len(ordered) != len(stages):
        raise ValueError("The fused stages form a cycle; this is a bug in sparkbeam's planner.")
    return ordered


class _PlanBuilder:
    """Reads Beam's fused stages into the plan's dataclasses."""

    def __init__(self, context: t.TransformContext) -> None:
        self.context = context
        self.components = context.components
        self.edges: dict[BufferId, Edge] = {}
        self.sdk_coders: dict[tuple[BufferId, str], str] = {}  # (buffer, side) -> SDK coder

    def safe(self, coder_id: str) -> str:
        return self.context.safe_coders.get(coder_id, coder_id)

    def build(self, stages: list, requirements: tuple, test_streams, text_reads) -> ExecutionPlan:
        plans = [self._stage(i, s) for i, s in enumerate(stages)]
        self._settle_reshuffle_coders()
        # The outputs of one TestStream share its clock and events: one pipeline.
        joined = [tuple(b for _, b in ts.outputs) for ts in test_streams]
        pipelines = _connected_components(plans, joined)
        pipeline_of = {sid: p.id for p in pipelines for sid in p.stages}
        plans = [dataclasses.replace(s, pipeline=pipeline_of[s.id]) for s in plans]
        components = self.components.SerializeToString(deterministic=True)
        return ExecutionPlan(
            stages=tuple(plans),
            edges=tuple(self.edges.values()),
            pipelines=tuple(pipelines),
            components=components,
            requirements=requirements,
            fingerprint=_fingerprint(plans),
            test_streams=tuple(test_streams),
            text_reads=tuple(text_reads),
        )

    def _stage(self, index: int, stage: t.Stage) -> StagePlan:
        stage_id = StageId(f"stage-{index}")
        inputs, outputs, input_coders = [], [], []
        side_inputs, names = [], []
        timers: list[TimerFamily] = []
        is_sdf = False
        transforms = {}
        for transform in stage.transforms:
            transform = copy.deepcopy(transform)
            urn = transform.spec.urn
            if urn == bundle_processor.DATA_INPUT_URN:
                pcoll = t.only_element(transform.outputs.values())
                buffer, coder = self._edge_for(transform.spec.payload, pcoll, "read")
                inputs.append((transform.unique_name, buffer))
                input_coders.append((transform.unique_name, self.safe(coder)))
                if self.edges[buffer].kind == EdgeKind.TEXT:
                    names.append(transform.unique_name)  # the user's Read, for labels
                    transform.spec.urn = TEXT_LINES_INPUT_URN
                transform.spec.payload = _grpc_port(coder)
            elif urn == bundle_processor.DATA_OUTPUT_URN:
                pcoll = t.only_element(transform.inputs.values())
                buffer, coder = self._edge_for(transform.spec.payload, pcoll, "write")
                outputs.append((transform.unique_name, buffer))
                transform.spec.payload = _grpc_port(coder)
            else:
                names.append(transform.unique_name)
                mark_window_into(transform)
                is_sdf = is_sdf or urn == SDF_PROCESS_URN
                if urn in t.PAR_DO_URNS:
                    payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
                    side_inputs.extend(self._side_inputs(transform, payload))
                    timers.extend(
                        TimerFamily(transform.unique_name, family, spec.time_domain,
                                    self.safe(spec.timer_family_coder_id))
                        for family, spec in payload.timer_family_specs.items()
                    )  # fmt: skip
            transforms[transform.unique_name] = transform
        descriptor = beam_fn_api_pb2.ProcessBundleDescriptor(
            id=stage_id,
            transforms=transforms,
            pcollections=_referenced_pcollections(self.components, transforms.values()),
            coders=dict(self.components.coders.items()),
            windowing_strategies=dict(self.components.windowing_strategies.items()),
            environments=dict(self.components.environments.items()),
            timer_api_service_descriptor=_FAKE_ENDPOINT,
        )
        stateful = stage.is_stateful()
        return StagePlan(
            id=stage_id,
            name=stage.name,
            pipeline=PipelineId(""),
            descriptor=descriptor.SerializeToString(deterministic=True),
            inputs=tuple(inputs),
            outputs=tuple(outputs),
            input_coders=tuple(input_coders),
            side_inputs=tuple(side_inputs),
            timers=tuple(timers),
            stateful=stateful,
            is_sdf_process=is_sdf,
            transforms=tuple(names),
        )

    def _edge_for(self, payload: bytes, pcoll: str, side: str) -> tuple[BufferId, str]:
        """The buffer a data input (``side`` "read") or output ("write") names, noting the
        SDK coder of that side on its edge; and that coder."""
        coder = self.context.data_channel_coders[pcoll]
        if payload == t.IMPULSE_BUFFER:
            self.edges.setdefault(IMPULSE_BUFFER, Edge(IMPULSE_BUFFER, EdgeKind.IMPULSE, pcoll))
            return IMPULSE_BUFFER, coder
        buffer = BufferId(payload.decode("utf-8"))
        edge = self._edge(buffer, pcoll)
        self.sdk_coders[buffer, side] = coder
        edge = dataclasses.replace(edge, **{f"{side}_coder": self.safe(coder)})
        if side == "read" and edge.kind == EdgeKind.TEST_STREAM:
            # The runner writes what the SDK decodes.
            edge = dataclasses.replace(edge, write_coder=coder)
        self.edges[buffer] = edge
        return buffer, coder

    def _settle_reshuffle_coders(self) -> None:
        """One coder per Reshuffle edge where both sides agree, else the SDK's two coders,
        which the runner transcodes between (see ``edge_coders``)."""
        coders = self.components.coders
        for buffer, edge in list(self.edges.items()):
            write = self.sdk_coders.get((buffer, "write"))
            read = self.sdk_coders.get((buffer, "read"))
            if edge.kind != EdgeKind.RESHUFFLE or write is None or read is None:
                continue
            if same_coder(coders, write, read):
                self.edges[buffer] = dataclasses.replace(edge, read_coder=edge.write_coder)
            else:
                self.edges[buffer] = dataclasses.replace(edge, write_coder=write, read_coder=read)

    def _edge(self, buffer: BufferId, pcoll: str) -> Edge:
        if buffer in self.edges:
            return self.edges[buffer]
        kind_name, name = t.split_buffer_id(buffer.encode("utf-8"))
        kind = EdgeKind(kind_name)
        if kind != EdgeKind.GROUP:
            return Edge(buffer, kind, pcoll)
        gbk = self.components.transforms[name]
        in_pcoll = t.only_element(gbk.inputs.values())
        out_pcoll = t.only_element(gbk.outputs.values())
        strategy_id = self.components.pcollections[in_pcoll].windowing_strategy_id
        strategy = self.components.windowing_strategies[strategy_id]
        standard = strategy.window_fn.urn in SAFE_WINDOW_FNS
        write = self.context.data_channel_coders[in_pcoll]
        read = self.context.data_channel_coders[out_pcoll]
        # Bytes pass through in the safe coders only if both sides encode alike.
        if standard and same_grouped_coders(self.components.coders, write, read):
            write, read = self.safe(write), self.safe(read)
        return Edge(
            buffer,
            kind,
            in_pcoll,
            write_coder=write,
            read_coder=read,
            windowing_strategy=strategy_id,
        )

    def _side_inputs(self, transform, payload) -> list[SideInput]:
        result = []
        for tag, spec in payload.side_inputs.items():
            pcoll = transform.inputs[tag]
            buffer = BufferId(t.create_buffer_id(pcoll).decode("utf-8"))
            coder = self.context.data_channel_coders.get(pcoll)
            if coder is None:
                self.context.add_data_channel_coder(pcoll)
                coder = self.context.data_channel_coders[pcoll]
            result.append(
                SideInput(
                    transform=transform.unique_name,
                    tag=tag,
                    buffer=buffer,
                    access_pattern_urn=spec.access_pattern.urn,
                    coder=self.safe(coder),
                    triggered=self._triggered(pcoll),
                )
            )
        return result

    def _triggered(self, pcoll: str) -> bool:
        """The PCollection's windowing strategy names a trigger other than the default one."""
        strategy_id = self.components.pcollections[pcoll].windowing_strategy_id
        trigger = self.components.windowing_strategies[strategy_id].trigger
        return trigger.WhichOneof("trigger") not in (None, "default")


def _referenced_pcollections(components, transforms) -> dict:
    """Only the PCollections a stage's transforms read or write (side inputs included): every
    Spark task carries its stage's descriptor, and the whole pipeline's can be ~50 KB."""
    ids = {pc for tr in transforms for pcs in (tr.inputs, tr.outputs) for pc in pcs.values()}
    return {pc: components.pcollections[pc] for pc in sorted(ids)}


def _grpc_port(coder_id: str) -> bytes:
    port = beam_fn_api_pb2.RemoteGrpcPort(coder_id=coder_id)
    port.api_service_descriptor.CopyFrom(_FAKE_ENDPOINT)
    return port.SerializeToString()


def _connected_components(
    stages: list[StagePlan], joined: list[tuple[BufferId, ...]]
) -> list[PipelinePlan]:
    """Stages sharing any buffer (main or side input) belong to one pipeline; so do the
    readers of the buffers of one ``joined`` group (a TestStream's outputs)."""
    parent = {s.id: s.id for s in stages}

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    touching: dict[BufferId, list[StageId]] = {}
    for s in stages:
        buffers = set(s.input_buffers) | set(s.output_buffers) | {si.buffer for si in s.side_inputs}
        buffers.discard(IMPULSE_BUFFER)
        for b in buffers:
            touching.setdefault(b, []).append(s.id)
            for i, group in enumerate(joined):
                if b in group:
                    touching.setdefault(BufferId(f"joined-{i}"), []).append(s.id)
    for ids in touching.values():
        for other in ids[1:]:
            parent[find(other)] = find(ids[0])
    groups: dict[StageId, list[StageId]] = {}
    for s in stages:
        groups.setdefault(find(s.id), []).append(s.id)
    return [
        PipelinePlan(PipelineId(f"pipeline-{i}"), tuple(members))
        for i, members in enumerate(groups.values())
    ]


def _fingerprint(stages: list[StagePlan]) -> str:
    """Hash of the graph shape: stages, their transforms and their edges."""
    h = hashlib.sha256()
    for s in stages:
        h.update(repr((s.id, s.transforms, s.input_buffers, s.output_buffers)).encode())
    return h.hexdigest()[:16]

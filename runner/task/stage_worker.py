"""An in-process SDK worker for one stage: Beam's ``SdkWorker`` over in-memory channels.

As in Beam's embedded worker, a bundle's input is written to an in-memory data channel, or
pulled from the task's rows as the bundle processor reads it (``StreamedInputChannel``), and
its outputs and timers are read back when it ends; state goes through the state API
(``user_state``). A ProcessBundleResponse field this runner does not handle raises, by name
(``check_handled``). The loop over bundles is ``bundle_executor``'s.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

from apache_beam.options.value_provider import RuntimeValueProvider
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.portability.fn_api_runner import worker_handlers
from apache_beam.runners.worker import data_plane, sdk_worker
from apache_beam.runners.worker.bundle_processor import DATA_INPUT_URN
from apache_beam.runners.worker.statecache import StateCache

from sparkbeam.runner.task import text_lines, window_into  # noqa: F401  (register their URNs)
from sparkbeam.runner.task.bundle_splits import SplitOutcome
from sparkbeam.runner.task.user_state import UserStateServicer
from sparkbeam.translation.plan import StagePlan

_TRUNCATE_URN = common_urns.sdf_components.TRUNCATE_SIZED_RESTRICTION.urn


class UserCodeError(RuntimeError):
    """Raised in the task; the driver turns it into StageFailedError."""


# ``monitoring_data`` repeats ``monitoring_infos`` keyed by short ids; the latter is read.
HANDLED_RESPONSE_FIELDS = frozenset(
    {"residual_roots", "monitoring_infos", "monitoring_data", "requires_finalization"}
)


def check_handled(response: beam_fn_api_pb2.ProcessBundleResponse) -> None:
    """Raise, naming the field, if the SDK set a response field this runner would drop (e.g.
    ``elements``: lost output)."""
    unhandled = [f.name for f, _ in response.ListFields() if f.name not in HANDLED_RESPONSE_FIELDS]
    if unhandled:
        raise NotImplementedError(
            f"The SDK set ProcessBundleResponse field(s) {', '.join(unhandled)}, which sparkbeam "
            "does not handle (its output would be lost). Use the apache-beam version sparkbeam "
            "pins (pyproject.toml) or report it."
        )


@dataclass
class BundleOutput:
    response: beam_fn_api_pb2.ProcessBundleResponse
    data: dict[str, list[bytes]] = field(default_factory=dict)
    timers: dict[tuple[str, str], list[bytes]] = field(default_factory=dict)
    split: SplitOutcome = field(default_factory=SplitOutcome)


# Beam's DoFn invoker keeps globally windowed side-input arguments for the life of its bundle
# processor unless this is set (apache/beam#28776); processors are reused across bundles while
# a task's side inputs change, so processors of stages with side inputs are made with it.
_NO_ARGS_CACHE = "disable_global_windowed_args_caching"


@contextlib.contextmanager
def _side_inputs_read_per_bundle():
    """Invokers made meanwhile (the SDK makes processors in bundles) read their side inputs
    in each bundle (the experiment is read when an invoker is made)."""
    previous = RuntimeValueProvider.experiments
    RuntimeValueProvider.experiments = set(previous or ()) | {_NO_ARGS_CACHE}
    try:
        yield
    finally:
        RuntimeValueProvider.experiments = previous


class StageWorker:
    """An in-process SDK worker for one stage, reused across tasks of a process."""

    def __init__(self, plan_key: str, stage: StagePlan) -> None:
        self.stage = stage
        self.descriptor = beam_fn_api_pb2.ProcessBundleDescriptor.FromString(stage.descriptor)
        self.descriptor.id = f"{plan_key}/{stage.id}"
        self.state = UserStateServicer()
        self.sdk_side = StreamedInputChannel()
        self.data = self.sdk_side.inverse()  # the runner's side: bundle outputs arrive here
        handler = sdk_worker.GlobalCachingStateHandler(StateCache(0), self.state)
        self.worker = sdk_worker.SdkWorker(
            sdk_worker.BundleProcessorCache(
                worker_handlers.FNAPI_RUNNER_CAPABILITIES,
                worker_handlers.SingletonStateHandlerFactory(handler),
                data_plane.InMemoryDataChannelFactory(self.data.inverse()),
                {self.descriptor.id: self.descriptor},
            )
        )
        self._ids = itertools.count()

    def reset_state(self) -> None:
        """Forget the previous task's user state and side inputs (same worker process)."""
        # Re-initialise in place: the SDK's state handler holds this object.
        UserStateServicer.__init__(self.state)

    def process_bundle(
        self,
        inputs: dict[str, list[bytes]] | Iterator[tuple[str, bytes]],
        fired_timers: dict[tuple[str, str], list[bytes]],
        splitter=None,  # (bundle_id, inputs) -> BundleSplitter, for SDF stages
    ) -> BundleOutput:
        """One bundle over ``inputs``: chunks by data-input transform, or (transform, chunk)
        rows the bundle pulls as it goes (not held in memory)."""
        bundle_id = f"{self.descriptor.id}/bundle-{next(self._ids)}"
        for timer in self.stage.timers:
            out = self.data.output_timer_stream(bundle_id, timer.transform, timer.family)
            for data in fired_timers.get((timer.transform, timer.family), ()):
                out.write(data)
            out.close()
        written = inputs if isinstance(inputs, dict) else {}
        if not isinstance(inputs, dict):
            self.sdk_side.stream(bundle_id, inputs)
        for transform, _ in self.stage.inputs:
            out = self.data.output_stream(bundle_id, transform)
            for data in written.get(transform, ()):
                out.write(data)
            out.close()
        splits = splitter(bundle_id, written) if splitter and written else None
        fresh = _side_inputs_read_per_bundle() if self.stage.side_inputs else None
        with splits or contextlib.nullcontext(), fresh or contextlib.nullcontext():
            response = self.worker.do_instruction(
                beam_fn_api_pb2.InstructionRequest(
                    instruction_id=bundle_id,
                    process_bundle=beam_fn_api_pb2.ProcessBundleRequest(
                        process_bundle_descriptor_id=self.descriptor.id
                    ),
                )
            )
        result = BundleOutput(response.process_bundle)
        for element in self.data.input_elements(bundle_id, []):
            if isinstance(element, beam_fn_api_pb2.Elements.Data):
                if element.data:
                    result.data.setdefault(element.transform_id, []).append(element.data)
            elif element.timers:
                key = (element.transform_id, element.timer_family_id)
                result.timers.setdefault(key, []).append(element.timers)
        if response.error:
            raise UserCodeError(response.error)
        check_handled(response.process_bundle)
        if splits is not None:
            result.split = splits.outcome()
        if response.process_bundle.requires_finalization:
            finalized = self.worker.do_instruction(
                beam_fn_api_pb2.InstructionRequest(
                    instruction_id=bundle_id + "/finalize",
                    finalize_bundle=beam_fn_api_pb2.FinalizeBundleRequest(instruction_id=bundle_id),
                )
            )
            if finalized.error:
                raise UserCodeError(finalized.error)
        return result

    def flushed_outputs(self) -> int:
        """How many output pieces the running bundle has flushed to this side so far."""
        return len(self.data._inputs)  # noqa: SLF001 - Beam's in-memory channel keeps them there

    def input_for(self, transform_id: str, input_id: str) -> str:
        """The data-input transform that feeds ``transform_id`` (through Truncate)."""
        transforms = self.descriptor.transforms
        pcoll = transforms[transform_id].inputs[input_id]
        for read_id, proto in transforms.items():
            if proto.spec.urn == DATA_INPUT_URN and pcoll in proto.outputs.values():
                return read_id
            if proto.spec.urn == _TRUNCATE_URN and pcoll in proto.outputs.values():
                return self.input_for(read_id, next(iter(proto.inputs)))
        raise RuntimeError(f"No data input feeds transform {transform_id!r}")


class StreamedInputChannel(data_plane.InMemoryDataChannel):
    """The SDK's side of the in-memory channel: a bundle's data may be pulled from rows as the
    bundle processor reads it, after what was written to the channel."""

    def __init__(self) -> None:
        super().__init__()
        self._streams: dict[str, Iterator[tuple[str, bytes]]] = {}

    def stream(self, instruction_id: str, rows: Iterator[tuple[str, bytes]]) -> None:
        self._streams[instruction_id] = rows

    def input_elements(self, instruction_id, expected_inputs, abort_callback=None):
        yield from super().input_elements(instruction_id, expected_inputs, abort_callback)
        for transform, data in self._streams.pop(instruction_id, ()):
            yield beam_fn_api_pb2.Elements.Data(
                instruction_id=instruction_id, transform_id=transform, data=data
            )


_WORKERS: dict[tuple[str, str], StageWorker] = {}


def worker_for(plan_key: str, stage: StagePlan) -> StageWorker:
    """This process's worker for a stage of a plan (bundle processors are built once)."""
    key = (plan_key, stage.id)
    if key not in _WORKERS:
        _WORKERS[key] = StageWorker(plan_key, stage)
    return _WORKERS[key]

"""Runner-initiated splits of a running splittable-DoFn bundle (dynamic rebalancing).

Owns: the second thread that sends ``ProcessBundleSplitRequest``s to the in-process
``SdkWorker`` while an SDF bundle runs, and what the responses leave to re-process: the
``residual_roots`` (the unclaimed rest of the element in progress) and, from
``channel_splits``, the input elements from the lowest ``first_residual_element`` on (written
to the channel, now skipped; later splits only move it down). ``primary_roots`` the bundle
finishes. Leaves turning both into ``ResidualRecord``s to ``bundle_executor``.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from apache_beam.coders.coder_impl import create_InputStream
from apache_beam.metrics import monitoring_infos
from apache_beam.portability.api import beam_fn_api_pb2

from sparkbeam.runner.task.grouping import split_elements
from sparkbeam.translation.phases import SDF_PROCESS_URN

NAMESPACE = "sparkbeam"  # metrics namespace of the split counters

# Retry soon when the bundle is not registered yet (the request raced its start).
_RETRY_S = 0.005


class BundleSplitError(RuntimeError):
    """A split request failed inside the SDK (e.g. the SDF's ``try_split`` raised)."""


@dataclass(frozen=True)
class SplitPolicy:
    """When and how far to split the bundles of one SDF stage: every ``after_s`` seconds
    (None or 0: never), keeping the next of ``fractions`` (cycled) of the remaining work.

    Only a bundle of one element is split unless ``every_bundle`` (for ``check_sdf``): the
    fusion break already spreads several elements over the tasks, and splitting their bundles
    only moves work behind the next round's barrier (word count, 100 MB on 2 cores: 22.5 s
    splitting every bundle, 19.5 s not)."""

    after_s: float | None = 2.0
    fractions: tuple[float, ...] = (0.5,)
    every_bundle: bool = False

    def __post_init__(self) -> None:
        bad = [f for f in self.fractions if not 0.0 <= f < 1.0]
        if bad or not self.fractions:
            raise ValueError(
                f"split fractions {self.fractions!r} must be non-empty, each in [0, 1) "
                "(the fraction of the remainder the running bundle keeps)."
            )

    @property
    def enabled(self) -> bool:
        return bool(self.after_s and self.after_s > 0)

    def applies(self, coders: dict, inputs: dict[str, list[bytes]]) -> bool:
        """Whether a bundle of ``inputs`` (transform -> encoded chunks) may be split."""
        return self.enabled and (self.every_bundle or _one_element(coders, inputs))


def _one_element(coders: dict, inputs: dict[str, list[bytes]]) -> bool:
    """Whether ``inputs`` hold exactly one element; decodes at most the first one."""
    chunks = [(t, c) for t, cs in inputs.items() for c in cs if c]
    if len(chunks) != 1:
        return False
    transform, chunk = chunks[0]
    stream = create_InputStream(chunk)
    coders[transform].decode_from_stream(stream, True)
    return stream.size() == 0


@dataclass
class SplitOutcome:
    """What the splits of one bundle left for the runner to process again."""

    splits: int = 0  # split responses that moved work out of the bundle (not no-ops)
    residual_roots: list = field(default_factory=list)  # DelayedBundleApplications
    unread: dict[str, list[bytes]] = field(default_factory=dict)  # transform -> elements


def encoded_elements(coder_impl, chunks: Sequence[bytes]) -> list[bytes]:
    """Cut concatenated encoded windowed values into one byte string per element."""
    return [element for _, element in split_elements(b"".join(chunks), coder_impl)]


class BundleSplitter:
    """Splits one running bundle from a second thread while in its ``with`` block; then
    ``outcome()`` says what the bundle did not process."""

    def __init__(
        self,
        worker,  # apache_beam.runners.worker.sdk_worker.SdkWorker
        bundle_id: str,
        inputs: dict[str, list[bytes]],
        coders: dict,  # data-input transform -> windowed coder impl
        policy: SplitPolicy,
        fractions: Iterator[float],
    ) -> None:
        self.worker = worker
        self.bundle_id = bundle_id
        self.inputs = inputs
        self.coders = coders
        self.policy = policy
        self.fractions = fractions
        self.responses: list[beam_fn_api_pb2.ProcessBundleSplitResponse] = []
        self._elements: dict[str, list[bytes]] = {}
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name=f"split-{bundle_id}", daemon=True)

    def __enter__(self) -> BundleSplitter:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            wait = float(self.policy.after_s or 0.0)
            while not self._done.wait(wait):
                fraction = next(self.fractions)
                response = self._request(fraction)
                if response is None:
                    wait = _RETRY_S  # not started yet, or nothing left to split
                    continue
                self.responses.append(response)
                wait = float(self.policy.after_s or 0.0)
        except BaseException as e:  # noqa: BLE001 - re-raised on the task thread
            self._error = e

    def _request(self, fraction: float) -> beam_fn_api_pb2.ProcessBundleSplitResponse | None:
        desired = {
            transform: beam_fn_api_pb2.ProcessBundleSplitRequest.DesiredSplit(
                fraction_of_remainder=fraction,
                estimated_input_elements=len(self._elements_of(transform)),
            )
            for transform in self.inputs
        }
        response = self.worker.do_instruction(
            beam_fn_api_pb2.InstructionRequest(
                instruction_id=f"{self.bundle_id}/split-{next(self._ids)}",
                process_bundle_split=beam_fn_api_pb2.ProcessBundleSplitRequest(
                    instruction_id=self.bundle_id, desired_splits=desired
                ),
            )
        )
        # An error here means the bundle is unknown (not started, released, or failed);
        # a failed bundle reports its own error on the task thread.
        split = response.process_bundle_split
        if response.error or not (split.channel_splits or split.residual_roots):
            return None
        return split

    def _elements_of(self, transform: str) -> list[bytes]:
        if transform not in self._elements:
            self._elements[transform] = encoded_elements(
                self.coders[transform], self.inputs.get(transform, ())
            )
        return self._elements[transform]

    def outcome(self) -> SplitOutcome:
        """Residual roots and unread input elements of every split that happened. Call after
        the bundle's own error was checked: it wins over a split request it made fail."""
        if self._error is not None:
            raise BundleSplitError(
                f"split request for bundle {self.bundle_id!r} failed: "
                f"{type(self._error).__name__}: {self._error}"
            ) from self._error
        result = SplitOutcome()
        first: dict[str, int] = {}
        for response in self.responses:
            result.residual_roots.extend(response.residual_roots)
            moved = bool(response.residual_roots)
            for channel in response.channel_splits:
                at = channel.first_residual_element
                first[channel.transform_id] = min(at, first.get(channel.transform_id, at))
                moved = moved or at < len(self._elements_of(channel.transform_id))
            result.splits += moved
        for transform, at in first.items():
            unread = self._elements_of(transform)[at:]
            if unread:
                result.unread[transform] = unread
        return result


@dataclass
class SplitCounts:
    """Per-task totals, reported as ``sparkbeam`` counters on the SDF transform."""

    splits: int = 0
    residuals: int = 0
    unread: int = 0

    def add(self, outcome: SplitOutcome) -> None:
        self.splits += outcome.splits
        self.residuals += len(outcome.residual_roots)
        self.unread += sum(len(v) for v in outcome.unread.values())

    def monitoring_infos(self, descriptor) -> list:
        """Counters ``sparkbeam:runner_splits``, ``..._residuals``, ``..._unread_elements``."""
        if not self.splits:
            return []
        sdf = [tid for tid, t in descriptor.transforms.items() if t.spec.urn == SDF_PROCESS_URN]
        label = sdf[0] if sdf else None
        return [
            monitoring_infos.int64_user_counter(NAMESPACE, name, value, ptransform=label)
            for name, value in (
                ("runner_splits", self.splits),
                ("runner_split_residuals", self.residuals),
                ("runner_split_unread_elements", self.unread),
            )
        ]

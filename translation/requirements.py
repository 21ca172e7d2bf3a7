"""Submission-time checks: refuse, by name, what the runner cannot do."""

from __future__ import annotations

from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.portability.fn_api_runner import translations as t
from apache_beam.utils import proto_utils

from sparkbeam.translation.errors import UnsupportedFeatureError

SUPPORTED_REQUIREMENTS = frozenset(
    [
        common_urns.requirements.REQUIRES_STATEFUL_PROCESSING.urn,
        common_urns.requirements.REQUIRES_BUNDLE_FINALIZATION.urn,
        common_urns.requirements.REQUIRES_SPLITTABLE_DOFN.urn,
    ]
)

# The ParDoPayload field that marks a transform needing each unsupported requirement.
_REQUIREMENT_FIELDS = {
    common_urns.requirements.REQUIRES_STABLE_INPUT.urn: "requires_stable_input",
    common_urns.requirements.REQUIRES_TIME_SORTED_INPUT.urn: "requires_time_sorted_input",
}

_SUPPORTED_TIME_DOMAINS = (
    beam_runner_api_pb2.TimeDomain.EVENT_TIME,
    beam_runner_api_pb2.TimeDomain.PROCESSING_TIME,
)

_EMBEDDABLE_ENVIRONMENTS = frozenset(
    ["beam:env:embedded_python:v1", common_urns.environments.DEFAULT.urn, ""]
)


def check_requirements(pipeline: beam_runner_api_pb2.Pipeline) -> None:
    """Raise UnsupportedFeatureError naming the first transform we cannot run."""
    transforms = pipeline.components.transforms
    pardos = {
        transform.unique_name or tid: proto_utils.parse_Bytes(
            transform.spec.payload, beam_runner_api_pb2.ParDoPayload
        )
        for tid, transform in transforms.items()
        if transform.spec.urn in t.PAR_DO_URNS
    }
    for requirement in pipeline.requirements:
        if requirement in SUPPORTED_REQUIREMENTS:
            continue
        field = _REQUIREMENT_FIELDS.get(requirement)
        needs = [name for name, payload in pardos.items() if field and getattr(payload, field)]
        raise UnsupportedFeatureError(
            needs[0] if needs else "<pipeline>",
            f"the pipeline requirement {field or requirement!r}",
            "Remove it or use another runner.",
        )
    for name, payload in pardos.items():
        for timer_id, timer in payload.timer_family_specs.items():
            if timer.time_domain not in _SUPPORTED_TIME_DOMAINS:
                raise UnsupportedFeatureError(
                    name,
                    f"timers in time domain {timer.time_domain} (timer {timer_id!r})",
                    "Use event-time or processing-time timers.",
                )
    for env_id, env in pipeline.components.environments.items():
        if env.urn not in _EMBEDDABLE_ENVIRONMENTS:
            users = [tr.unique_name for tr in transforms.values() if tr.environment_id == env_id]
            if users:
                raise UnsupportedFeatureError(
                    users[0],
                    f"the SDK environment {env.urn!r} (cross-language or containerized transforms)",
                    "sparkbeam runs Python transforms in-process only.",
                )

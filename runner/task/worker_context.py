"""Per-Python-worker caches of what the driver ships: plan components, filesystem options.

A Spark Python worker runs many tasks of a job, so coders and windowing strategies (and, in
``stage_worker``, bundle processors) are built once per worker per ``plan_key``, from bytes
shipped with the task. The key hashes the plan's code: a changed DoFn body gets new processors.
Registering a plan also applies the job's filesystem options
(``sparkbeam.runner.spark.filesystem_options``), so the store and sinks reach ``s3://``, ...
"""

from __future__ import annotations

import hashlib
import threading

from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners import pipeline_context

from sparkbeam.runner.spark.filesystem_options import apply_in_task

_LOCK = threading.Lock()
_COMPONENTS: dict[str, bytes] = {}
_CONTEXTS: dict[str, pipeline_context.PipelineContext] = {}


def plan_key(plan) -> str:
    """The key workers cache a plan under: its shape's fingerprint and a hash of its code (the
    components and every stage's descriptor, into which DoFn bodies are pickled)."""
    code = hashlib.sha256(plan.components)
    for stage in plan.stages:
        code.update(stage.descriptor)
    return f"{plan.fingerprint}-{code.hexdigest()[:12]}"


def register_plan(plan_key: str, components: bytes) -> None:
    """Make a plan's components and the job's filesystem options known here (idempotent)."""
    apply_in_task()
    with _LOCK:
        _COMPONENTS.setdefault(plan_key, components)


def plan_context(plan_key: str) -> pipeline_context.PipelineContext:
    with _LOCK:
        context = _CONTEXTS.get(plan_key)
        if context is None:
            components = beam_runner_api_pb2.Components.FromString(_COMPONENTS[plan_key])
            context = pipeline_context.PipelineContext(components)
            _CONTEXTS[plan_key] = context
        return context

"""Per-Python-worker caches of what the driver ships: plan components, filesystem options.

A Spark Python worker runs many tasks of one job. Coders and windowing
strategies are rebuilt once per worker process per plan, keyed by a plan
key, from bytes shipped with the task (never from driver memory). Every task
that registers its plan also applies the filesystem options its job carries
(``sparkbeam.runner.spark.filesystem_options``), so the store and sinks reach
``s3://``, ``gs://``, ... with the pipeline's options.
"""

from __future__ import annotations

import threading

from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners import pipeline_context

from sparkbeam.runner.spark.filesystem_options import apply_in_task

_LOCK = threading.Lock()
_COMPONENTS: dict[str, bytes] = {}
_CONTEXTS: dict[str, pipeline_context.PipelineContext] = {}


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

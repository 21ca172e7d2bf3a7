"""SparkCheckpointRunner: a Beam PipelineRunner that executes on Spark."""

from __future__ import annotations

import logging

from apache_beam.options.pipeline_options import (
    DebugOptions,
    GoogleCloudOptions,
    PipelineOptions,
    StandardOptions,
    TypeOptions,
)
from apache_beam.options.value_provider import RuntimeValueProvider
from apache_beam.runners.pipeline_utils import group_by_key_input_visitor
from apache_beam.runners.runner import PipelineRunner, PipelineState
from apache_beam.transforms import environments
from sparkbeam.checkpoint import open_store
from sparkbeam.runner.executor import PlanExecutor
from sparkbeam.runner.options import SparkRunnerOptions
from sparkbeam.runner.result import SparkPipelineResult
from sparkbeam.runner.session import get_or_create_session
from sparkbeam.runner.streaming_options import SparkStreamingOptions
from sparkbeam.translation import translate

_LOG = logging.getLogger(__name__)


def portable_proto(pipeline, options: PipelineOptions):
    """The pipeline proto to plan: GroupByKey inputs get deterministic key coders
    (as in Beam's own runners) and every transform runs in-process Python."""
    pipeline.visit(
        group_by_key_input_visitor(
            not options.view_as(TypeOptions).allow_non_deterministic_key_coders
        )
    )
    return pipeline.to_runner_api(
        default_environment=environments.EmbeddedPythonEnvironment.default()
    )


class SparkCheckpointRunner(PipelineRunner):
    """Runs Beam Python pipelines on Apache Spark through PySpark.

    ``is_drain=True`` plans splittable DoFns in drain mode: every restriction
    is truncated through the SDF's ``truncate`` before processing (as Beam's
    FnApiRunner does), so unbounded work finishes.
    """

    def __init__(self, is_drain: bool = False) -> None:
        super().__init__()
        self._is_drain = is_drain

    def run_pipeline(self, pipeline, options: PipelineOptions) -> SparkPipelineResult:
        RuntimeValueProvider.set_runtime_options({})
        debug = options.view_as(DebugOptions)
        debug.experiments = list({*(debug.experiments or []), "beam_fn_api"})
        spark_options = options.view_as(SparkRunnerOptions)
        # Step 1: the portable proto.
        proto = portable_proto(pipeline, options)
        # Step 2: plan it (checks requirements; raises naming what is unsupported).
        plan = translate(proto, is_drain=self._is_drain)
        # Step 3: take the store's lock (a second job is refused before Spark starts), run.
        job_name = options.view_as(GoogleCloudOptions).job_name
        if options.view_as(StandardOptions).streaming:
            from sparkbeam.runner.streaming_job import open_streaming_store, start_streaming

            store = open_streaming_store(plan, options, spark_options.spark_app_name or job_name)
            try:
                spark = get_or_create_session(spark_options, job_name)
            except BaseException:
                store.close()
                raise
            drain_plan = lambda: translate(proto, is_drain=True)  # noqa: E731
            return start_streaming(spark, plan, options, drain_plan, store=store)
        store = None
        url = spark_options.checkpoint_dir
        if url:
            store = open_store(
                url, job_name=spark_options.spark_app_name or job_name or "sparkbeam"
            )
        try:
            spark = get_or_create_session(spark_options, job_name)
            executor = PlanExecutor(
                spark,
                plan,
                spark_options.shuffle_parallelism(),
                store=store,
                checkpoint_url=url,
                residual_budget_s=spark_options.residual_budget_s,
                split_policy=spark_options.sdf_split_policy(),
                startpoint_max_age_s=options.view_as(SparkStreamingOptions).startpoint_max_age_s,
            )
            executor.run()
        finally:
            if store is not None:
                store.close()
        # Step 4: the result, with metrics merged from every stage.
        return SparkPipelineResult(PipelineState.DONE, executor.monitoring_infos_by_stage)

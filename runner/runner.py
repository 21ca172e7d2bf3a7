"""SparkCheckpointRunner: a Beam PipelineRunner that executes on Spark."""

from __future__ import annotations

import atexit
import functools
import gc
import logging
import shutil
import tempfile
import time

from apache_beam.options.pipeline_options import (
    DebugOptions,
    GoogleCloudOptions,
    PipelineOptions,
    StandardOptions,
    TypeOptions,
)
from apache_beam.options.value_provider import RuntimeValueProvider
from apache_beam.runners.pipeline_utils import group_by_key_input_visitor
from apache_beam.runners.runner import PipelineResult, PipelineRunner, PipelineState
from apache_beam.transforms import environments

from sparkbeam.checkpoint import open_store
from sparkbeam.runner import file_outputs, one_line, progress
from sparkbeam.runner.batch.executor import PlanExecutor
from sparkbeam.runner.options import SparkRunnerOptions, SparkStreamingOptions, check_option_values
from sparkbeam.runner.result import SparkPipelineResult
from sparkbeam.runner.rounds.compatibility import refuse_before_start
from sparkbeam.runner.rounds.startpoints import check_startpoints
from sparkbeam.runner.spark.filesystem_options import apply_in_driver, use_in_jobs
from sparkbeam.runner.spark.session import get_or_create_session, is_connect
from sparkbeam.runner.spark.shipping import code_files, ship_user_code
from sparkbeam.runner.spark.storage_check import check_input_paths, check_shared_storage
from sparkbeam.runner.streaming.job import open_streaming_store, start_streaming
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
    """Runs Beam Python pipelines on Apache Spark through PySpark; ``is_drain=True`` truncates
    every SDF restriction before processing (as Beam's FnApiRunner does)."""

    def __init__(self, is_drain: bool = False) -> None:
        super().__init__()
        self._is_drain = is_drain

    def run_pipeline(self, pipeline, options: PipelineOptions) -> PipelineResult:
        progress.make_visible(options.view_as(SparkRunnerOptions).log_level)
        one_line.install()  # an error of ours reaches the operator as one line, not a traceback
        skip_last_collection_at_exit()
        # 1. Check what sparkbeam can be asked for (one-line errors, before any Spark).
        check_option_values(options)
        RuntimeValueProvider.set_runtime_options({})
        debug = options.view_as(DebugOptions)
        debug.experiments = list({*(debug.experiments or []), "beam_fn_api"})
        proto = portable_proto(pipeline, options)
        outputs = file_outputs.of(pipeline)
        # 2. Plan it (raises naming what is unsupported).
        streaming = options.view_as(StandardOptions).streaming
        plan = translate(proto, is_drain=self._is_drain, streaming=streaming)
        use_test_stream_mode(plan, options)
        # 3. Execute: the store first -- its lock, a failed startpoint, a finished job are
        #    refused in about a second, before Spark starts -- then Spark.
        job_name = options.view_as(GoogleCloudOptions).job_name
        spark_options = options.view_as(SparkRunnerOptions)
        fs_options = apply_in_driver(options)  # s3://... options here (the store), then in tasks
        store = open_job_store(plan, options, spark_options.spark_app_name or job_name)
        spark = start_spark(options, job_name, store, fs_options)
        progress.started(spark, store.url if store is not None else None, outputs)
        if options.view_as(StandardOptions).streaming:
            drain_plan = lambda: translate(proto, is_drain=True, streaming=True)  # noqa: E731
            return start_streaming(spark, plan, options, store, drain_plan, fs_options)
        started = time.time()
        try:
            executor = run_batch(spark, plan, options, store, fs_options)
        except BaseException:
            file_outputs.remove_beam_temp_dirs(outputs, started)
            raise
        # 4. The result, with metrics merged from every stage.
        return SparkPipelineResult(PipelineState.DONE, executor.monitoring_infos_by_stage)


@functools.cache  # once per process
def skip_last_collection_at_exit() -> None:
    """Have the heap frozen at exit, so CPython's last full collection skips it: over a driver's
    Beam, PySpark and plan it took 0.3-0.5 s of every run, to find cycles the OS reclaims
    anyway (CPython promises no ``__del__`` then; ``atexit`` and ``weakref.finalize`` work)."""
    atexit.register(gc.freeze)


def use_test_stream_mode(plan, options: PipelineOptions) -> None:
    """A pipeline with a TestStream runs in streaming mode, as on Beam's DirectRunner, with a
    temporary store unless --checkpoint_dir (a test resumes no stale store)."""
    if not plan.test_streams:
        return
    standard = options.view_as(StandardOptions)
    if not standard.streaming:
        _LOG.info("The pipeline reads a TestStream: running it in streaming mode")
        standard.streaming = True
    spark_options = options.view_as(SparkRunnerOptions)
    if not spark_options.checkpoint_dir:
        directory = tempfile.mkdtemp(prefix="sparkbeam-teststream-")
        atexit.register(shutil.rmtree, directory, True)
        spark_options.checkpoint_dir = directory


def open_job_store(plan, options: PipelineOptions, job_name: str | None):
    """The run's locked checkpoint store (streaming always; batch with --checkpoint_dir), or
    a refusal before Spark: a store executors cannot reach, a bad or failed startpoint, a
    finished job without --fresh."""
    check_shared_storage(options.view_as(SparkRunnerOptions))
    check_input_paths(plan, options.view_as(SparkRunnerOptions))
    streaming = options.view_as(SparkStreamingOptions)
    if options.view_as(StandardOptions).streaming:
        store = open_streaming_store(plan, options, job_name)
    elif url := options.view_as(SparkRunnerOptions).checkpoint_dir:
        store = open_store(url, job_name=job_name or "sparkbeam", break_lock=streaming.break_lock)
    else:
        return None
    try:
        check_startpoints(store.startpoints, plan)
        refuse_before_start(store, [p.id for p in plan.pipelines], streaming.fresh)
    except BaseException:
        store.close()
        raise
    return store


def start_spark(options: PipelineOptions, job_name: str | None, store, fs_options: str):
    """The Spark session, with the user's code shipped and the (encoded) filesystem options in
    every task; closes ``store`` if Spark cannot start."""
    try:
        spark_options = options.view_as(SparkRunnerOptions)
        files = code_files(options, connect=spark_options.remote_url() is not None)
        spark = get_or_create_session(spark_options, job_name, [f.name for f in files])
        ship_user_code(spark, options, files)  # the user's modules and packages reach executors
        if not is_connect(spark):  # on Connect the data plane carries them into tasks
            use_in_jobs(spark.sparkContext, fs_options)  # ... and in every task
        return spark
    except BaseException:
        if store is not None:
            store.close()
        raise


def run_batch(spark, plan, options: PipelineOptions, store, fs_options: str = "{}") -> PlanExecutor:
    """Run a batch plan to the end (with its checkpoint store, if given; closes it)."""
    spark_options = options.view_as(SparkRunnerOptions)
    started = time.monotonic()
    streaming_options = options.view_as(SparkStreamingOptions)
    try:
        executor = PlanExecutor(
            spark,
            plan,
            spark_options.shuffle_parallelism(),
            store=store,
            checkpoint_url=spark_options.checkpoint_dir,
            residual_budget_s=spark_options.residual_budget_s,
            split_policy=spark_options.sdf_split_policy(),
            startpoint_max_age_s=streaming_options.startpoint_max_age_s,
            filesystem_options=fs_options,
            data_plane=spark_options.data_plane,
            fresh=streaming_options.fresh,
            max_key_groups=spark_options.max_key_groups,
            state_memory_bytes=spark_options.task_state_memory_mb << 20,
        )
        with progress.BatchTicker(spark, executor.elements):  # a line every 10 s while it runs
            executor.run()
    finally:
        if store is not None:
            store.close()
    progress.batch_done(len(plan.stages), time.monotonic() - started, executor.resumed)
    return executor

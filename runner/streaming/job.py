"""Start a ``--streaming`` run and hand back a live PipelineResult at once (the round loops
run on driver threads); ``cancel()`` stops each pipeline once its current round committed, so
the next run resumes there.
"""

from __future__ import annotations

import logging
import threading

from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiMetrics
from apache_beam.runners.runner import PipelineResult, PipelineState

from sparkbeam.checkpoint import open_store
from sparkbeam.runner.options import SparkRunnerOptions, SparkStreamingOptions
from sparkbeam.runner.rounds.context import RunContext
from sparkbeam.runner.streaming.executor import DRAIN_REQUEST, StreamingExecutor
from sparkbeam.translation.plan import ExecutionPlan

_LOG = logging.getLogger(__name__)


def open_streaming_store(plan: ExecutionPlan, options: PipelineOptions, job_name=None):
    """Open and lock the store (default: under the job name); no Spark needed, so a second
    job on a locked store is refused before its Spark session starts."""
    streaming = options.view_as(SparkStreamingOptions)
    url = options.view_as(SparkRunnerOptions).checkpoint_dir
    if not url:
        name = options.view_as(GoogleCloudOptions).job_name or f"job-{plan.fingerprint[:12]}"
        url = streaming.default_checkpoint_dir(name)
        _LOG.warning("--streaming without --checkpoint_dir: checkpoints go to %s", url)
    return open_store(
        url,
        job_name=job_name or "sparkbeam",
        materialization_interval_s=streaming.materialization_interval_s,
        break_lock=streaming.break_lock,
    )


def start_streaming(
    spark,
    plan: ExecutionPlan,
    options: PipelineOptions,
    store,
    drain_plan=None,
    fs_options: str = "{}",
) -> StreamingResult:
    """Start every pipeline's round loop on the (opened, locked) store; ``drain_plan``: a
    callable returning the plan with SDF truncation."""
    spark_options = options.view_as(SparkRunnerOptions)
    streaming = options.view_as(SparkStreamingOptions)
    ctx = RunContext.create(
        spark,
        plan,
        store,
        store.url,
        spark_options.shuffle_parallelism(),
        interval_s=streaming.checkpoint_interval_s,
        max_restores=streaming.max_restores,
        startpoint_max_age_s=streaming.startpoint_max_age_s,
        filesystem_options=fs_options,  # each loop thread's jobs carry them
        data_plane=spark_options.data_plane,
        fresh=streaming.fresh,
        max_key_groups=spark_options.max_key_groups,
        state_memory_bytes=spark_options.task_state_memory_mb << 20,
    )
    executor = StreamingExecutor(ctx, drain_plan)
    executor.start()
    executor.stop_on_signals()  # Ctrl-C: stop after the running round commits
    return StreamingResult(executor, store)


class StreamingResult(PipelineResult):
    """The live result of a streaming run; metrics cover the rounds committed so far."""

    def __init__(self, executor: StreamingExecutor, store) -> None:
        super().__init__(PipelineState.RUNNING)
        self.executor = executor
        self._store = store
        self._lock = threading.Lock()

    @property
    def state(self) -> str:
        with self._lock:
            if self._state == PipelineState.RUNNING and self.executor.wait(0):
                self._finish(PipelineState.DONE)
            return self._state

    def wait_until_finish(self, duration=None) -> str:
        """Wait up to ``duration`` milliseconds (Beam's unit), or until every pipeline ended."""
        timeout = None if duration is None else duration / 1000.0
        try:
            done = self.executor.wait(timeout)
        except BaseException:
            self._finish(PipelineState.FAILED)
            raise
        return self._end(PipelineState.DONE) if done else self._state

    def cancel(self) -> str:
        """Stop after the current round of each pipeline; its checkpoint is committed."""
        self.executor.cancel()
        return self._end(PipelineState.CANCELLED)

    def drain(self) -> str:
        """Truncate pending restrictions (the SDFs' ``truncate``), fire every window and timer
        as if the watermark were at +infinity, commit, and stop: DRAINED."""
        self.executor.drain()
        return self._end(PipelineState.DRAINED)

    def _end(self, state: str) -> str:
        """``state``, unless the run already ended in another; the run's state."""
        with self._lock:
            if self._state == PipelineState.RUNNING:
                self._finish(state)
        return self._state

    def _finish(self, state: str) -> None:
        if self.executor.drain_control.event.is_set() and state == PipelineState.DONE:
            state = PipelineState.DRAINED
        if self.executor.interrupted and state == PipelineState.DONE:
            state = PipelineState.CANCELLED  # stopped by Ctrl-C / SIGTERM after a round
        if state == PipelineState.DRAINED:
            self._store.storage.delete(DRAIN_REQUEST)  # served; the next run starts normally
        self._state = state
        self.executor.restore_signals()
        self._store.close()

    def metrics(self) -> FnApiMetrics:
        return FnApiMetrics(self.executor.monitoring_infos_by_stage(), user_metrics_only=True)

    def monitoring_metrics(self) -> FnApiMetrics:
        return FnApiMetrics(self.executor.monitoring_infos_by_stage(), user_metrics_only=False)

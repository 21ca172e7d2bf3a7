"""Streaming: each independent pipeline runs in rounds on its own driver thread.

A round is one Spark job over the pipeline's live stages; once it succeeded, its staged state,
residuals, completed-work markers and sink files commit as one checkpoint (nothing of the
round is in flight: the barrier of a Chandy-Lamport snapshot), then its sink files become
visible. Each pipeline has its own thread, job group, round counter and checkpoint chain; the
pipelines share sparkbeam's FAIR scheduler pool. A round failing beyond Spark's task retries
restores only its own pipeline's last checkpoint.

Each pipeline's rounds are a ``rounds.loop.RoundLoop`` over a ``pipeline.PipelineRounds``,
sharing one ``RunContext``; this module owns their threads, the signals and the drain.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

from sparkbeam.checkpoint.errors import first_line
from sparkbeam.runner.errors import StageFailedError
from sparkbeam.runner.rounds.context import RunContext
from sparkbeam.runner.rounds.loop import RoundLoop
from sparkbeam.runner.streaming.pipeline import PipelineRounds
from sparkbeam.runner.task.worker_context import plan_key

_LOG = logging.getLogger(__name__)
DRAIN_REQUEST = "drain-request"


class Drain:
    """A drain, asked for by ``drain()`` or ``sparkbeam drain`` (a request in the store), and
    the SDF stages planned with truncation (Beam's drain expansion) that it runs."""

    def __init__(self, ctx: RunContext, drain_plan) -> None:
        self.ctx = ctx
        self.event = threading.Event()
        self._plan = drain_plan  # callable: the plan with SDF truncation, built on drain
        self._stages: dict | None = None
        self._lock = threading.Lock()
        if ctx.store.storage.exists(DRAIN_REQUEST):  # left from before this job held the store
            _LOG.warning("Ignoring a drain request left in %s from an earlier job", ctx.url)
            ctx.store.storage.delete(DRAIN_REQUEST)

    def requested(self) -> bool:
        if not self.event.is_set() and self.ctx.store.storage.exists(DRAIN_REQUEST):
            _LOG.warning("Drain requested through %s/%s", self.ctx.url, DRAIN_REQUEST)
            self.event.set()
        return self.event.is_set()

    def stages(self) -> dict:
        """Stage id -> (plan key, components broadcast, truncating stage), built once."""
        with self._lock:
            if self._stages is not None:
                return self._stages
            if self._plan is None:
                raise RuntimeError("This streaming run was started without a drain plan")
            plan = self._plan()
            if [s.id for s in plan.stages] != [s.id for s in self.ctx.plan.stages]:
                raise RuntimeError(
                    "The drain plan's stages differ from the running plan's; cannot drain. "
                    "Cancel the job instead (result.cancel()): its last checkpoint is kept."
                )
            key, components = plan_key(plan), self.ctx.plane.broadcast(plan.components)
            self._stages = {s.id: (key, components, s) for s in plan.stages if s.is_sdf_process}
            return self._stages


class StreamingExecutor:
    """Runs every pipeline of a plan in rounds on its own thread until done or cancelled."""

    def __init__(self, ctx: RunContext, drain_plan=None) -> None:
        self.ctx = ctx
        self.drain_control = Drain(ctx, drain_plan)
        self.loops = [
            RoundLoop(PipelineRounds(ctx, p, self.drain_control), ctx) for p in ctx.plan.pipelines
        ]
        self._threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []
        self.interrupted = False  # stopped by SIGINT/SIGTERM, not by the pipeline's end
        self._previous_handlers: dict = {}

    def stop_on_signals(self) -> None:
        """First SIGINT/SIGTERM: stop after the running round commits (like ``cancel()``),
        so the store resumes there; a second SIGINT exits at once. Main thread only."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous_handlers[sig] = signal.signal(sig, self._on_signal)

    def restore_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        self._previous_handlers = {}

    def _on_signal(self, signum, frame) -> None:
        if self.interrupted:  # the second one: the last committed checkpoint is what stays
            os.write(2, b"sparkbeam: stopping now; the next run resumes at the last checkpoint\n")
            os._exit(128 + signum)
        self.interrupted = True
        self.ctx.stop.set()
        print(
            f"sparkbeam: {signal.Signals(signum).name}: stopping after the running round "
            f"commits (checkpoints in {self.ctx.url}); press Ctrl-C again to stop at once.",
            file=sys.stderr,
            flush=True,
        )

    def start(self) -> None:
        for loop in self.loops:
            name = f"sparkbeam-{loop.pipeline.id}"
            thread = threading.Thread(target=self._run_loop, args=(loop,), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def _run_loop(self, loop: RoundLoop) -> None:
        plane = self.ctx.plane
        try:
            plane.use_scheduler_pool()  # every pipeline's rounds share sparkbeam's FAIR pool
            plane.use_in_jobs(self.ctx.filesystem_options)  # s3://... options in every task
            loop.run()
        except BaseException as e:  # noqa: BLE001 - reported by wait()
            _LOG.error("%s -- pipeline %s failed; the job stops.", _cause(e), loop.pipeline.id)
            self.errors.append(e)
            self.ctx.stop.set()  # a pipeline beyond its restores fails the job

    def wait(self, timeout_s: float | None = None) -> bool:
        """True when every pipeline loop has ended; raises the first pipeline failure."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for thread in self._threads:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            thread.join(left)
        if self.errors:
            raise self.errors[0]
        return not any(t.is_alive() for t in self._threads)

    def cancel(self) -> None:
        """Stop every pipeline after its current round (which commits its checkpoint)."""
        self.ctx.stop.set()
        for thread in self._threads:
            thread.join()

    def drain(self) -> None:
        """Drain: truncate pending restrictions, fire every window and timer, then stop."""
        self.drain_control.event.set()
        for thread in self._threads:
            thread.join()

    def monitoring_infos_by_stage(self) -> dict[str, list]:
        return self.ctx.metrics.by_name(self.ctx.plan)


def _cause(e: BaseException) -> str:
    """One line, the cause first: a task's Python exception, not the JVM's frames (the whole
    error reaches the caller of ``wait``)."""
    return e.cause if isinstance(e, StageFailedError) else first_line(e, named=True)

"""Progress lines an operator reads at the default log level.

sparkbeam's loggers are children of ``sparkbeam``, which ``make_visible`` sets to INFO
unless the program set its level, so a run says whether it starts fresh or resumes, how
its rounds go (one line every ``EVERY_S`` seconds; every round at DEBUG) and how it ended.
Silence them with ``logging.getLogger("sparkbeam").setLevel(logging.WARNING)``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from apache_beam.metrics import monitoring_infos as mi
from apache_beam.utils import timestamp

from sparkbeam.runner.spark.session import is_connect

EVERY_S = 5.0
BATCH_EVERY_S = 10.0
_LOG = logging.getLogger("sparkbeam.progress")
_HANDLER_FLAG = "_sparkbeam_progress_handler"


def make_visible(level: str | None = None) -> None:
    """sparkbeam's INFO lines reach the operator unless the program set sparkbeam's level
    (``level``: --log_level's): through the root's handlers (Beam's imports add one at
    WARNING), else a stderr handler of its own."""
    root, logger = logging.getLogger(), logging.getLogger("sparkbeam")
    if level is not None:
        logger.setLevel(level)
    elif logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    ours = [h for h in logger.handlers if getattr(h, _HANDLER_FLAG, False)]
    if root.handlers:  # the program (or Beam) configured logging, maybe since the last run
        for handler in ours:
            logger.removeHandler(handler)
            logger.propagate = True
        return
    if ours or logger.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s sparkbeam: %(message)s", "%H:%M:%S"))
    setattr(handler, _HANDLER_FLAG, True)
    logger.addHandler(handler)
    logger.propagate = False


def records(infos, pcollections: AbstractSet[str]) -> int:
    """Elements that crossed the given PCollections, from Beam's element-count metrics."""
    total = 0
    for info in infos:
        if info.urn == mi.ELEMENT_COUNT_URN and info.labels.get("PCOLLECTION") in pcollections:
            total += mi.extract_counter_value(info)
    return total


class PipelineProgress:
    """The progress lines of one independent pipeline's rounds."""

    def __init__(self, pipeline: str) -> None:
        self.pipeline = pipeline
        self.started = time.monotonic()
        self.last_line = float("-inf")
        self.records = 0
        self.rounds = 0

    def opened(self, url: str, checkpoint_id: int | None, round_no: int, pending: int) -> None:
        if checkpoint_id is None:
            _LOG.info("%s: starting fresh (no checkpoint in %s)", self.pipeline, url)
        else:
            _LOG.info(
                "resuming %s from checkpoint %d (round %d next), %d pending residual(s)",
                self.pipeline, checkpoint_id, round_no, pending,
            )  # fmt: skip

    def round_committed(
        self, round_no: int, checkpoint_id: int, records: int, pending: int, watermark_micros
    ) -> None:
        """Count the round; one INFO line every ``EVERY_S`` seconds, each round at DEBUG."""
        self.rounds += 1
        self.records += records
        now = time.monotonic()
        level = logging.DEBUG
        if now - self.last_line >= EVERY_S:
            level, self.last_line = logging.INFO, now
        _LOG.log(
            level,
            "%s: round %d committed (checkpoint %d); %d round(s), %d record(s) so far, "
            "watermark %s, %d pending residual(s)",
            self.pipeline, round_no, checkpoint_id, self.rounds, self.records,
            _watermark(watermark_micros), pending,
        )  # fmt: skip

    def ended(self, how: str, checkpoint_id: int | None, pending: int) -> None:
        _LOG.info(
            "%s %s: %d round(s), %d record(s) in %.1fs; last checkpoint %s, %d pending residual(s)",
            self.pipeline, how, self.rounds, self.records, time.monotonic() - self.started,
            checkpoint_id, pending,
        )  # fmt: skip


def started(spark, store_url: str | None, outputs: Sequence[str] = ()) -> None:
    """One line once Spark is up: where the job runs, where its state and its files go."""
    try:
        if hasattr(spark, "sparkContext") and not is_connect(spark):
            sc = spark.sparkContext
            master, app, name, ui = sc.master, sc.applicationId, sc.appName, sc.uiWebUrl
        else:
            conf = spark.conf
            master, app = conf.get("spark.master", "?"), conf.get("spark.app.id", "?")
            name, ui = conf.get("spark.app.name", "?"), None
    except Exception:  # noqa: BLE001 - a progress line never fails a run
        return
    _LOG.info(
        "running on master %s, application %s (%s), Spark UI %s; checkpoint store %s; output %s",
        master, app, name, ui or "-", store_url or "none (batch without --checkpoint_dir)",
        ", ".join(outputs) or "-",
    )  # fmt: skip


class ElementCounter:
    """Elements a batch run's tasks moved between its stages so far (Beam's element-count
    metrics of each finished task): a Spark accumulator the tasks add to; none over Connect."""

    def __init__(self, spark, pcollections) -> None:
        self.pcollections = frozenset(pcollections)
        self.accumulator = None if is_connect(spark) else spark.sparkContext.accumulator(0)

    def count(self, record) -> None:
        """Task side: add a task's metrics record to the count (other records: nothing)."""
        from sparkbeam.runner.task.records import MetricsRecord

        if self.accumulator is not None and isinstance(record, MetricsRecord):
            from apache_beam.portability.api import metrics_pb2

            infos = [metrics_pb2.MonitoringInfo.FromString(b) for b in record.monitoring_infos]
            self.accumulator.add(records(infos, self.pcollections))

    def value(self) -> int | None:
        """Driver side: the count so far (None: not counted)."""
        return None if self.accumulator is None else self.accumulator.value


class BatchTicker:
    """While a batch job runs: a line every ``BATCH_EVERY_S`` seconds naming the running Spark
    stages and their tasks done/total (classic Spark: its status tracker; none over Connect),
    and the elements its finished tasks moved."""

    def __init__(self, spark, elements: ElementCounter | None = None) -> None:
        self.spark, self.elements = spark, elements
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def __enter__(self) -> BatchTicker:
        if not is_connect(self.spark):
            self.thread = threading.Thread(target=self._run, name="sparkbeam-progress", daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(5)

    def _run(self) -> None:
        started = time.monotonic()
        while not self.stop.wait(BATCH_EVERY_S):
            try:
                line = running_stages(self.spark.sparkContext.statusTracker())
            except Exception:  # noqa: BLE001 - the session may be stopping
                return
            count = self.elements.value() if self.elements is not None else None
            if count is not None:
                line += f"; {count:,} element(s) so far"
            _LOG.info("running for %.0fs: %s", time.monotonic() - started, line)


def running_stages(tracker) -> str:
    """``<stage name> tasks 3/8`` for each active Spark stage, or ``between Spark jobs``."""
    parts = []
    for stage_id in sorted(tracker.getActiveStageIds()):
        info = tracker.getStageInfo(stage_id)
        if info is not None:
            name = info.name if len(info.name) <= 60 else info.name[:57] + "..."
            parts.append(f"{name} tasks {info.numCompletedTasks}/{info.numTasks}")
    return "; ".join(parts) or "between Spark jobs"


def batch_done(stages: int, elapsed_s: float, resumed: dict[str, int]) -> None:
    extra = f"; resumed {len(resumed)} stage(s) from their checkpoint" if resumed else ""
    _LOG.info("done: %d stage(s) in %.1fs%s", stages, elapsed_s, extra)


def batch_resumed(pipeline: str, checkpoint_id: int) -> None:
    _LOG.info("resuming %s from checkpoint %d", pipeline, checkpoint_id)


def _watermark(micros) -> str:
    """``-inf`` (nothing seen yet), ``+inf`` (the input is done; also past year 9999, as the
    global window's end) or an ISO UTC time."""
    if micros is None:
        return "-"
    if micros <= timestamp.MIN_TIMESTAMP.micros:
        return "-inf"
    if micros >= timestamp.MAX_TIMESTAMP.micros:
        return "+inf"
    try:
        return timestamp.Timestamp(micros=micros).to_rfc3339()
    except (ValueError, OverflowError):
        return "+inf" if micros > 0 else "-inf"

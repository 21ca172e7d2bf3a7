"""The PipelineResult of a sparkbeam run: state, metrics, cancel."""

from __future__ import annotations

from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiMetrics
from apache_beam.runners.runner import PipelineResult


class SparkPipelineResult(PipelineResult):
    """Result of a batch run, which ``run()`` finishes: always terminal, so
    ``wait_until_finish`` and ``cancel`` return at once. Metrics are the MonitoringInfos of
    tasks that succeeded (committed and attempted are equal)."""

    def __init__(self, state: str, monitoring_infos_by_stage: dict) -> None:
        super().__init__(state)
        self._monitoring_infos_by_stage = monitoring_infos_by_stage
        self._metrics: FnApiMetrics | None = None

    def wait_until_finish(self, duration=None) -> str:
        return self._state

    def cancel(self) -> str:
        return self._state

    def metrics(self) -> FnApiMetrics:
        if self._metrics is None:
            self._metrics = FnApiMetrics(self._monitoring_infos_by_stage, user_metrics_only=True)
        return self._metrics

    def monitoring_metrics(self) -> FnApiMetrics:
        return FnApiMetrics(self._monitoring_infos_by_stage, user_metrics_only=False)

"""What every round of a run reads: one frozen ``RunContext``, made once by the run's executor
(batch or streaming) and handed to every round loop and job. ``StageMetrics`` is its one
mutable part (pipelines commit on their own threads). Leaves to others: what differs per side
(``loop.RoundJob``), and the run's lifecycle (the executors).
"""

from __future__ import annotations

import functools
import threading
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sparkbeam.checkpoint.keygroups import default_max_key_groups
from sparkbeam.runner.metrics import merge_monitoring_infos
from sparkbeam.runner.plane import plane_for
from sparkbeam.runner.rounds.compatibility import RestoreGuard
from sparkbeam.runner.task.staged_state import DEFAULT_MEMORY_BYTES
from sparkbeam.runner.task.worker_context import plan_key
from sparkbeam.translation.plan import ExecutionPlan


class StageMetrics:
    """Monitoring infos by stage id, merged as rounds add them (thread-safe)."""

    def __init__(self) -> None:
        self._infos: dict[str, list] = defaultdict(list)
        self._lock = threading.Lock()

    def add(self, stage: str, infos: Iterable) -> None:
        with self._lock:
            self._infos[stage] = merge_monitoring_infos([*self._infos[stage], *infos])

    def by_name(self, plan: ExecutionPlan) -> dict[str, list]:
        """Stage name -> its merged infos, for ``FnApiMetrics``."""
        with self._lock:
            return {s.name: list(self._infos.get(s.id, [])) for s in plan.stages}


@dataclass(frozen=True)
class RunContext:
    """One run's plan, data plane, store and settings, as every round reads them."""

    plane: Any  # the data plane (``runner.plane``): sources, unions, broadcasts, job labels
    plan: ExecutionPlan
    plan_key: str  # what workers cache the plan's processors under (``plan_key``)
    components: Any  # broadcast of the plan's serialized components
    parallelism: int
    store: Any  # the CheckpointStore (batch without --checkpoint_dir: an in-memory one)
    url: str | None  # --checkpoint_dir; None: batch rounds advance in memory, no checkpoint
    metrics: StageMetrics
    startpoint_max_age_s: float | None = None
    interval_s: float = 0.0  # least time between round starts (streaming's checkpoint interval)
    max_restores: int = 0  # restores of the last checkpoint after a failed round (batch: 0)
    stop: threading.Event = field(default_factory=threading.Event)  # ends every loop
    filesystem_options: str = "{}"  # encoded, carried by every job (``spark.filesystem_options``)
    fresh: bool = False  # --fresh: a finished checkpoint runs again (else FinishedJobError)
    state_memory_bytes: int = DEFAULT_MEMORY_BYTES  # --task_state_memory_mb: a worker's, kept

    @classmethod
    def create(
        cls,
        spark,
        plan: ExecutionPlan,
        store,
        url: str | None,
        parallelism: int | None,
        data_plane: str | None = None,
        max_key_groups: int | None = None,
        **settings,
    ) -> RunContext:
        """The context of one run: the plan's components broadcast once, its key derived; the
        store's new pipelines get ``max_key_groups``, else key groups derived from the run's
        parallelism (a restored pipeline keeps its checkpoints')."""
        plane = plane_for(spark, data_plane)
        plane.use_in_jobs(settings.get("filesystem_options", "{}"))  # loop threads: again
        parallelism = parallelism or plane.default_parallelism()
        store.use_max_key_groups(max_key_groups or default_max_key_groups(parallelism))
        return cls(
            plane=plane,
            plan=plan,
            plan_key=plan_key(plan),
            components=plane.broadcast(plan.components),
            parallelism=parallelism,
            store=store,
            url=url,
            metrics=StageMetrics(),
            **settings,
        )

    @functools.cached_property
    def guard(self) -> RestoreGuard:
        """What each checkpoint records of the plan, and the check on restore."""
        return RestoreGuard(self.plan)

    @property
    def durable(self) -> bool:
        """Whether rounds commit checkpoints (else they advance in memory)."""
        return bool(self.url)

    def state_fields(
        self, pipeline: str, state, checkpoint_id: int | None, round_no: int, parallelism: int
    ) -> dict[str, Any]:
        """The `StateRound` fields by which a round's tasks read and stage their task-owned
        state (``state``: the pipeline's open PipelineStore), for batch and streaming alike."""
        return dict(
            pipeline=pipeline,
            url=self.url,
            checkpoint_id=checkpoint_id,
            round_no=round_no,
            parallelism=parallelism,
            max_key_groups=state.max_key_groups,
            memory_bytes=self.state_memory_bytes,
        )

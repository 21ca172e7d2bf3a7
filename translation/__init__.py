"""Pipeline proto -> ExecutionPlan. Pure functions; never imports pyspark."""

from sparkbeam.translation.errors import UnsupportedFeatureError
from sparkbeam.translation.plan import (
    BufferId,
    Edge,
    EdgeKind,
    ExecutionPlan,
    PipelineId,
    PipelinePlan,
    SideInput,
    StageId,
    StagePlan,
    TimerFamily,
)
from sparkbeam.translation.translate import translate

__all__ = [
    "BufferId",
    "Edge",
    "EdgeKind",
    "ExecutionPlan",
    "PipelineId",
    "PipelinePlan",
    "SideInput",
    "StageId",
    "StagePlan",
    "TimerFamily",
    "UnsupportedFeatureError",
    "translate",
]

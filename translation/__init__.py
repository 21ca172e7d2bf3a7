"""Pipeline proto -> ExecutionPlan. Pure functions; never imports pyspark."""

from sparkbeam.translation.compatibility import Difference, compare
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
from sparkbeam.translation.shape import PipelineShape, pipeline_shapes
from sparkbeam.translation.translate import translate

__all__ = [
    "BufferId",
    "Difference",
    "Edge",
    "EdgeKind",
    "ExecutionPlan",
    "PipelineId",
    "PipelinePlan",
    "PipelineShape",
    "SideInput",
    "StageId",
    "StagePlan",
    "TimerFamily",
    "UnsupportedFeatureError",
    "compare",
    "pipeline_shapes",
    "translate",
]

"""Splittable-DoFn run-time support: residual handler, timers, holds."""

from sparkbeam.sdf.checkpoint_handler import (
    DueResidual,
    MemoryResiduals,
    ResidualTimerService,
    StateAndTimerBundleCheckpointHandler,
)
from sparkbeam.sdf.offset_range_provider import OffsetRangeProvider
from sparkbeam.sdf.residuals import ResidualRecord

__all__ = [
    "DueResidual",
    "MemoryResiduals",
    "OffsetRangeProvider",
    "ResidualRecord",
    "ResidualTimerService",
    "StateAndTimerBundleCheckpointHandler",
]

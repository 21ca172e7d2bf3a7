"""Splittable-DoFn run-time support: residual handler, timers, holds."""

from sparkbeam.sdf.checkpoint_handler import DueResidual, StateAndTimerBundleCheckpointHandler
from sparkbeam.sdf.residuals import ResidualRecord
from sparkbeam.sdf.timer_service import ResidualTimerService

__all__ = [
    "DueResidual",
    "ResidualRecord",
    "ResidualTimerService",
    "StateAndTimerBundleCheckpointHandler",
]

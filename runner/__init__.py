"""SparkCheckpointRunner and its options; the Spark side of sparkbeam.

Attributes load lazily so that importing ``sparkbeam.runner.options`` (done
by the runner-alias hook whenever Beam's options load) stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparkbeam.runner.options import SparkRunnerOptions
    from sparkbeam.runner.runner import SparkCheckpointRunner

__all__ = ["SparkCheckpointRunner", "SparkRunnerOptions"]


def __getattr__(name: str) -> Any:
    if name == "SparkCheckpointRunner":
        from sparkbeam.runner.runner import SparkCheckpointRunner

        return SparkCheckpointRunner
    if name == "SparkRunnerOptions":
        from sparkbeam.runner.options import SparkRunnerOptions

        return SparkRunnerOptions
    raise AttributeError(name)

"""SparkCheckpointRunner and its options; the Spark side of sparkbeam."""

from sparkbeam.runner.options import SparkRunnerOptions
from sparkbeam.runner.runner import SparkCheckpointRunner

__all__ = ["SparkCheckpointRunner", "SparkRunnerOptions"]

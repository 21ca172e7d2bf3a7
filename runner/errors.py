"""Errors the runner raises to users: each names what failed and what to do."""


class PipelineOptionsError(ValueError):
    """A sparkbeam option is malformed (e.g. --spark_conf without '=')."""


class SparkSessionError(RuntimeError):
    """Spark could not be reached or started with the given options."""


class StageFailedError(RuntimeError):
    """User code failed inside a Beam stage running on Spark.

    The message names the stage and its transforms and carries the user's
    Python traceback, not the JVM's.
    """

    def __init__(self, stage: str, transforms, user_traceback: str) -> None:
        shown = ", ".join(transforms) or stage
        super().__init__(
            f"Beam stage {stage!r} ({shown}) failed on Spark.\n"
            f"User traceback (from the Python worker):\n{user_traceback}"
        )
        self.stage = stage
        self.user_traceback = user_traceback

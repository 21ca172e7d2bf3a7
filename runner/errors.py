"""Errors the runner raises to users: each names what failed and what to do."""


class PipelineOptionsError(ValueError):
    """A sparkbeam option is malformed (e.g. --spark_conf without '=')."""


class SparkSessionError(RuntimeError):
    """Spark could not be reached or started with the given options."""


class StageFailedError(RuntimeError):
    """User code failed inside a Beam stage running on Spark.

    The message names the stage; the SDK's traceback in it names the failing
    step ("while running 'MyStep'") and carries the user's Python frames, not
    the JVM's.
    """

    def __init__(self, stage: str, user_traceback: str) -> None:
        super().__init__(
            f"Beam stage {stage!r} failed on Spark; fix the user code named below and rerun.\n"
            f"User traceback (from the Python worker):\n{user_traceback}"
        )
        self.stage = stage
        self.user_traceback = user_traceback

"""Errors raised while turning a Beam pipeline into an execution plan."""


class UnsupportedFeatureError(NotImplementedError):
    """The pipeline uses a transform or requirement sparkbeam cannot run (yet)."""

    def __init__(self, transform: str, feature: str, hint: str = "") -> None:
        message = (
            f"Transform {transform!r} needs {feature}, "
            "which SparkCheckpointRunner does not support."
        )
        if hint:
            message += f" {hint}"
        super().__init__(message)
        self.transform = transform
        self.feature = feature

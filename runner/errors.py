"""Errors the runner raises to users: each names what failed and what to do."""

import re


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


_STAGE_TAG = re.compile(r"\[(stage-\d+)\]")


def run_guarded(stage_id: str | None, action):
    """Run a Spark action; a task failure becomes StageFailedError naming the stage."""
    try:
        return action()
    except Exception as e:  # noqa: BLE001 - rewrapped with the stage named
        text = str(e)
        match = _STAGE_TAG.search(text)
        failed = match.group(1) if match else (stage_id or "<unknown>")
        from sparkbeam.runner.shipping import missing_module_error

        user = user_traceback(text)
        raise missing_module_error(failed, user) or StageFailedError(failed, user) from None


def user_traceback(text: str) -> str:
    """The Python worker's traceback from a Spark failure, without JVM frames."""
    marker = "UserCodeError: "
    if marker in text:
        text = text[text.rindex(marker) + len(marker) :]
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("at ")]
    return "\n".join(lines).strip()


class IncompatiblePipelineError(ValueError):
    """A checkpoint holds state the changed pipeline cannot take over.

    Raised on restore when the running pipeline removed, renumbered or re-coded a part that
    owns checkpointed state (see ``sparkbeam.translation.compatibility``).
    """

    def __init__(
        self, pipeline_id: str, checkpoint_id: int, url: str, differences: list[str]
    ) -> None:
        self.pipeline_id = pipeline_id
        self.checkpoint_id = checkpoint_id
        self.differences = list(differences)
        listed = "\n".join(f"  - {d}" for d in differences)
        where = f"{url.rstrip('/')}/pipelines/{pipeline_id}"
        super().__init__(
            f"Checkpoint {checkpoint_id} of pipeline {pipeline_id!r} in {url!r} was written by "
            f"an incompatible version of this pipeline:\n{listed}\n"
            "To keep that state, run the version that wrote it. To start fresh, pass a new "
            f"--checkpoint_dir, or stop every job on the store and delete {where!r}."
        )

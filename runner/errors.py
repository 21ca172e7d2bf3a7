"""Errors the runner raises to users: each names what failed and what to do."""

import logging
import os
import re
import textwrap

from sparkbeam.sdf.startpoints.errors import StartpointFailedError, startpoint_failure

_LOG = logging.getLogger(__name__)


class PipelineOptionsError(ValueError):
    """A sparkbeam option is malformed (e.g. --spark_conf without '=')."""


class SparkSessionError(RuntimeError):
    """Spark could not be reached or started with the given options."""


class StageFailedError(RuntimeError):
    """User code failed inside a Beam stage running on Spark: a short block naming the stage,
    the failing transform, the user's own frames and what to do (the rest is logged at DEBUG;
    ``user_traceback`` keeps the worker's whole traceback)."""

    transform: str | None = None  # the failing step Beam named (the subclasses name none)

    def __init__(self, stage: str, user_traceback: str, transforms: str = "") -> None:
        self.stage = stage
        self.user_traceback = user_traceback
        self.transform = failing_transform(user_traceback)
        # The fused stage's transforms only when Beam did not name the failing one: the
        # message names what failed, not its neighbours.
        transforms = "" if self.transform else transforms.removeprefix(f"{stage}: ")
        stage_text = f"{stage!r} ({transforms})" if transforms else repr(stage)
        where = f" in {self.transform!r}" if self.transform else ""
        lines = [f"Beam stage {stage_text} failed on Spark{where}."]
        if self.transform:
            lines.append(f"  Transform: {self.transform!r}")
        error = last_error(user_traceback)
        lines.append(f"  Error: {error}")
        frames = _frames_block(user_traceback)
        lines += frames
        debug = "(--log_level=DEBUG)"
        cause = _cause_advice(error)
        if cause:
            lines.append(f"  What to do: {cause}; the full trace is logged at DEBUG {debug}.")
        elif self.transform or frames:
            what = f"the code of {self.transform!r}" if self.transform else "the user code above"
            lines.append(
                f"  What to do: fix {what} and rerun; the full trace is logged at DEBUG {debug}."
            )
        else:
            lines.append(
                "  What to do: no frame of your code is in the trace: Beam's or sparkbeam's code "
                "failed running the stage, most often on a coder that does not fit its values "
                "(e.g. a CombiningValueStateSpec's coder must encode the combiner's "
                f"accumulator). Check the stage's coders and state specs; the full trace is "
                f"logged at DEBUG {debug}. If they are right, report it with that trace."
            )
        super().__init__("\n".join(lines))

    @property
    def cause(self) -> str:
        """The task's Python exception on one line, "Type: message" (its message's first
        line), for a log line that puts the cause first; the JVM's frames are not in it."""
        return _MODULE_PATH.sub("", last_error(self.user_traceback))


class DamagedStateError(StageFailedError):
    """A task found a file of the checkpoint it read corrupt or missing: the store is damaged,
    not the code. A round loop falls back to the newest sound checkpoint; this reaches the
    user only when that finds none damaged and the restores ran out."""

    def __init__(self, stage: str, user_traceback: str, path: str) -> None:
        self.stage, self.user_traceback, self.path = stage, user_traceback, path
        where = f"Beam stage {stage!r}" if stage != UNKNOWN_STAGE else "A Beam stage"
        RuntimeError.__init__(
            self,
            f"{where} could not read checkpoint file {path!r}: {self.cause}\n"
            "  What to do: the store is damaged, not the code. `sparkbeam checkpoints verify "
            "--checkpoint_dir <store>` lists its damaged files and the checkpoint a restart "
            "restores; if it finds none, the file was unreadable for a while: rerun the job.",
        )


def _cause_advice(error: str) -> str | None:
    """What to do about a failure whose cause is the machine, not the code: a full disk, a
    file an executor cannot see. None for the others."""
    if "No space left on device" in error or "ENOSPC" in error:
        return (
            "a disk is full (the output's, the checkpoint store's, or an executor's "
            "spark.local.dir): free space or point the job at a larger disk, then rerun; the "
            "checkpoint store resumes the job where its last checkpoint left off"
        )
    if error.startswith(("FileNotFoundError", "IOError", "OSError")) and (
        "No such file" in error or "./" in error or "not found" in error.lower()
    ):
        return (
            "a file the stage reads is missing where the executor looked: on a cluster give "
            "input and output paths every executor reaches (an absolute path on a shared "
            "filesystem, or a URL such as s3://...); a relative path resolves in each "
            "executor's own work directory"
        )
    return None


class PythonWorkerStartError(StageFailedError):
    """An executor's Python worker failed before running any of the stage's code: the
    executors' Python environment is broken, not the pipeline."""

    def __init__(self, stage: str, worker_output: str, pythonpath: str | None) -> None:
        self.stage, self.user_traceback = stage, worker_output
        where = f" (Beam stage {stage!r})" if stage != UNKNOWN_STAGE else ""
        lines = [
            f"Spark's Python worker did not start on an executor{where}: "
            f"{last_error(worker_output)}",
            *_frames_block(worker_output, "Raised at"),
        ]
        if pythonpath:
            lines.append(f"  The worker's PYTHONPATH: {pythonpath}")
        lines.append(
            "  What to do: the executors' Python (PYSPARK_PYTHON, spark.executorEnv.*) must "
            "start and import apache_beam, pyspark and sparkbeam at the driver's versions; "
            "fix or install them there and rerun. The full trace is logged at DEBUG."
        )
        RuntimeError.__init__(self, "\n".join(lines))


def python_worker_start_error(stage: str, text: str) -> PythonWorkerStartError | None:
    """The error for Spark's "Error from python worker" block (a worker that did not start)."""
    match = _WORKER_DID_NOT_START.search(text)
    if match is None:
        return None
    output = textwrap.dedent(match.group(1))
    pythonpath = match.group(2).strip() if match.group(2) else None
    return PythonWorkerStartError(stage, output, pythonpath)


# Spark's PythonWorkerFactory: the worker's output (indented), then its PYTHONPATH.
_WORKER_DID_NOT_START = re.compile(
    r"Error from python worker:\n((?:  .*\n?)+)(?:PYTHONPATH was:\n  (.*))?"
)
UNKNOWN_STAGE = "<unknown>"  # a failure no stage can be told for
_MODULE_PATH = re.compile(r"^(?:[A-Za-z_]\w*\.)+(?=\w+: )")  # "a.b.ValueError: " -> "ValueError: "
_DAMAGED = re.compile(
    r"(?:TaskStateDamagedError|CheckpointCorruptError): Checkpoint file (['\"])(.+?)\1 is corrupt: "
)
_STAGE_TAG = re.compile(r"\[(stage-\d+)\]")
_STEP = re.compile(r"\[while running '([^']+)'\]")
_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+')
_LIBRARY = re.compile(r"(^|/)(apache_beam|pyspark|py4j|sparkbeam)/|^<frozen ")
# Code that lives in Beam's package but is a user's: its examples and tests.
_BEAM_USER_CODE = re.compile(r"/apache_beam/examples/|_test\.py$")
# sparkbeam's own folders (an editable install has no "sparkbeam/" in their paths)
_OWN = tuple(
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), d, "")
    for d in ("runner", "sdf", "translation", "checkpoint", os.path.join("sparkbeam", "io"))
)


def run_guarded(stage_id: str | None, action, describe=None):
    """Run a Spark action; a task failure becomes StageFailedError naming the stage (and its
    transforms, ``describe(stage_id)``)."""
    try:
        return action()
    except Exception as e:  # noqa: BLE001 - rewrapped with the stage named
        text = str(e)
        _LOG.debug("Spark action failed:\n%s", text)
        match = _STAGE_TAG.search(text)
        failed = match.group(1) if match else (stage_id or UNKNOWN_STAGE)
        transforms = (describe(failed) if describe is not None else "") or ""
        from sparkbeam.runner.spark.shipping import missing_module_error

        worker = python_worker_start_error(failed, text)
        if worker is not None:
            raise worker from None
        user = user_traceback(text)
        damaged = _DAMAGED.findall(user)  # the file a TaskStateDamagedError names
        if damaged:  # the store, not the code: the round loop falls back
            raise DamagedStateError(failed, user, damaged[-1][1]) from None
        startpoint = startpoint_failure(user)
        if startpoint is not None:  # not the user's DoFn: restoring cannot help
            raise _with_frames(startpoint, user) from None
        missing = missing_module_error(failed, user)
        raise missing or StageFailedError(failed, user, transforms) from None


def _with_frames(error: StartpointFailedError, traceback_text: str) -> StartpointFailedError:
    """The startpoint failure, its first line unchanged, with the user's frames below."""
    frames = _frames_block(traceback_text)
    if not frames:
        return error
    return StartpointFailedError(error.summary, error.token, "\n".join(frames))


def user_traceback(text: str) -> str:
    """The Python worker's traceback from a Spark failure, without JVM frames."""
    marker = "UserCodeError: "
    if marker in text:
        text = text[text.rindex(marker) + len(marker) :]
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("at ")]
    return "\n".join(lines).strip()


def failing_transform(traceback_text: str) -> str | None:
    """The step Beam names in "[while running 'Step']", if any."""
    match = _STEP.search(traceback_text)
    return match.group(1) if match else None


def last_error(traceback_text: str) -> str:
    """The "Type: message" line of a traceback's last exception (the first line of a
    multi-line message), without Beam's step annotation."""
    lines = traceback_text.splitlines()
    last_frame = max((i for i, line in enumerate(lines) if _FRAME.match(line)), default=-1)
    after = lines[last_frame + 1 :] if last_frame >= 0 else []
    for line in after:  # skip the frame's source line (and its ^^^ marks)
        if line and not line.startswith((" ", "\t")):
            return _STEP.sub("", _STAGE_TAG.sub("", line)).strip()
    for line in reversed(lines):
        if line and not line.startswith((" ", "\t", "Traceback", "During", "The above")):
            return _STEP.sub("", _STAGE_TAG.sub("", line)).strip()
    return traceback_text.strip().splitlines()[-1] if traceback_text.strip() else "?"


def _frames_block(traceback_text: str, title: str = "User traceback") -> list[str]:
    """The `user_frames` under ``title``, indented for an error's block; none if none."""
    frames = user_frames(traceback_text)
    return [f"  {title} (most recent call last):", *("  " + f for f in frames)] if frames else []


def user_frames(traceback_text: str) -> list[str]:
    """The frames (and their source lines) outside Beam, Spark, py4j and sparkbeam, once each
    (Beam's own examples and tests count as user code)."""
    out: list[str] = []
    seen: set[str] = set()
    keep = False
    for line in traceback_text.splitlines():
        frame = _FRAME.match(line)
        if frame:
            path = frame.group(1)
            library = (_LIBRARY.search(path) and not _BEAM_USER_CODE.search(path)) or (
                path.startswith(_OWN)
            )
            keep = not library and line.strip() not in seen
            if keep:
                seen.add(line.strip())
                out.append(line.rstrip())
        elif keep and line.startswith("    ") and line.strip().strip("^~ "):
            out.append(line.rstrip())
        elif not line.startswith("    "):
            keep = False
    return out


class IncompatiblePipelineError(ValueError):
    """A checkpoint holds state the changed pipeline cannot take over (it removed, renumbered
    or re-coded a part that owns it: ``sparkbeam.translation.compatibility``)."""

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

"""Every sparkbeam flag, with its default in the help text: `SparkRunnerOptions` (every run)
and `SparkStreamingOptions` (rounds and checkpoints of ``--streaming`` runs)."""

from __future__ import annotations

import math
import os
import re

from apache_beam.options import pipeline_options

from sparkbeam.checkpoint.keygroups import MAX_KEY_GROUPS_LIMIT
from sparkbeam.runner.errors import PipelineOptionsError

DEFAULT_MASTER = "local[*]"
_BEAM_DEFAULT_MASTER = "local[4]"


class SparkRunnerOptions(pipeline_options.PipelineOptions):
    """Options of SparkCheckpointRunner; a direct subclass of PipelineOptions, so Beam parses
    its flags in every program.

    ``--spark_master_url`` is Beam's ``SparkRunnerOptions``' (``master_url()``: unset, local[*],
    not Beam's local[4]; a live session's master wins), ``--parallelism``
    ``FlinkRunnerOptions``'."""

    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        parser.add_argument(
            "--data_plane",
            default=None,
            choices=("rdd", "frames"),
            help="How stages and shuffles run on classic Spark: rdd (RDDs) or frames "
            "(DataFrames: mapInArrow over Arrow batches, JVM shuffles). Over Spark Connect "
            "always frames. Default: SPARKBEAM_DATA_PLANE, else rdd.",
        )
        parser.add_argument(
            "--spark_conf",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="Extra Spark configuration, repeatable (e.g. --spark_conf "
            "spark.executor.memory=2g). Default: none.",
        )
        parser.add_argument(
            "--spark_remote",
            default=None,
            metavar="sc://HOST:PORT",
            help="Run on the Spark Connect server at this URL instead of starting Spark in "
            "this process (`sparkbeam serve` starts a local one); not together with "
            "--spark_master_url. Default: Spark's SPARK_REMOTE environment variable, else none.",
        )
        parser.add_argument(
            "--spark_app_name",
            default=None,
            help="Spark application name. Default: the Beam job name, else 'sparkbeam'.",
        )
        parser.add_argument(
            "--log_level",
            default=None,
            choices=("DEBUG", "INFO", "WARNING", "ERROR"),
            help="Level of sparkbeam's log (the 'sparkbeam' logger). An error sparkbeam raises "
            "is printed as its message alone; at DEBUG its traceback too. Default: INFO, "
            "unless the program set that logger's level.",
        )
        parser.add_argument(
            "--checkpoint_dir",
            default=None,
            help="URL of the checkpoint store (local path, file://, or any filesystem "
            "Beam's FileSystems reaches). With it, every SDF round is committed there and a "
            "killed batch job resumes its pending residuals when rerun. Default: none.",
        )
        parser.add_argument(
            "--shared_filesystem",
            action="store_true",
            default=False,
            help="Declare that an absolute local --checkpoint_dir is on a filesystem every "
            "Spark executor mounts at the same path (NFS...). Without it a cluster master "
            "(spark://, yarn, k8s://) refuses a local path; a relative path is always refused "
            "there. Default: off.",
        )
        parser.add_argument(
            "--max_key_groups",
            type=int,
            default=None,
            help="Key groups of a new checkpoint store's keyed state: the unit a restore at "
            "another --parallelism reassigns, so the most tasks a keyed stage can have. A "
            "restored pipeline keeps the key groups of its checkpoints (its keyed stages then "
            "run at most that many tasks). At most 32768. Default: derived from the "
            "parallelism as Flink derives its max parallelism: the power of two at or above "
            "1.5 x parallelism, at least 128.",
        )
        parser.add_argument(
            "--task_state_memory_mb",
            type=int,
            default=256,
            help="Memory a Python worker gives the keyed state it keeps between rounds "
            "(GroupByKey buffers, user state, SDF residuals); a larger key-group range spills to "
            "a RocksDB in the executor's Spark local directory, so state may outgrow the "
            "executors' memory (slower). Default: 256.",
        )
        # Splittable DoFns: residuals and runner-initiated splits.
        parser.add_argument(
            "--residual_budget_s",
            type=float,
            default=30.0,
            help="Batch without --checkpoint_dir only (else 0): a splittable DoFn residual due "
            "within this many seconds of its task's start is re-fed by that task (sleeping, no "
            "CPU); a later one waits on the driver for a later round (a Spark job). 0 re-feeds "
            "every residual in a later round. Default: 30 (a polling SDF costs one Spark job "
            "per 30 s of waiting, not one per poll).",
        )
        parser.add_argument(
            "--sdf_split_after_s",
            type=float,
            default=2.0,
            help="Runner-initiated splits: a splittable DoFn bundle of one element still running "
            "after this many seconds (and every as many after) keeps half its remaining work; "
            "the other half is spread over the next round's tasks. Bundles of several elements "
            "are not split. 0 turns splitting off. Default: 2.0.",
        )
        parser.add_argument(
            "--sdf_split_fractions",
            default=None,
            metavar="F1,F2,...",
            help="For testing SDFs: split every running bundle, not only one-element ones, "
            "each split keeping the next of these fractions of its remainder (cycled), each "
            "in [0, 1). Default: 0.5, one-element bundles only.",
        )

    def shuffle_parallelism(self) -> int | None:
        """--parallelism: partitions after GroupByKey, Reshuffle and stateful shuffles; None
        when unset (Beam's -1): Spark's defaultParallelism."""
        value = self.view_as(pipeline_options.FlinkRunnerOptions).parallelism
        return value if value and value > 0 else None

    def sdf_split_policy(self):
        """--sdf_split_after_s and --sdf_split_fractions as a SplitPolicy (clear error if bad)."""
        from sparkbeam.runner.task.bundle_splits import SplitPolicy

        text = self.sdf_split_fractions
        try:
            fractions = tuple(float(f) for f in text.split(",")) if text else (0.5,)
            return SplitPolicy(self.sdf_split_after_s, fractions, every_bundle=bool(text))
        except ValueError as e:
            raise PipelineOptionsError(
                f"--sdf_split_fractions {text!r}: {e} Write e.g. --sdf_split_fractions=0.3,0.7."
            ) from None

    def master_url(self) -> str:
        """--spark_master_url if given, else local[*]."""
        return self.explicit_master_url() or DEFAULT_MASTER

    def explicit_master_url(self) -> str | None:
        """--spark_master_url as the user gave it; None when not given (Beam's default)."""
        given = self.view_as(pipeline_options.SparkRunnerOptions).spark_master_url
        if not given or (given == _BEAM_DEFAULT_MASTER and not _given(self, "spark_master_url")):
            return None
        return given

    def remote_url(self) -> str | None:
        """--spark_remote, else ``SPARK_REMOTE``; checked (one-line error if malformed, or if
        --spark_master_url is given too); None to run Spark in this process."""
        url = self.spark_remote or os.environ.get("SPARK_REMOTE") or None
        if url is None:
            return None
        flag = "--spark_remote" if self.spark_remote else "SPARK_REMOTE (environment)"
        master = self.explicit_master_url()
        if master:
            raise PipelineOptionsError(
                f"{flag} {url!r} and --spark_master_url {master!r} both name where Spark runs; "
                "give one: a Spark Connect server's master is set where it starts "
                "(`sparkbeam serve --master ...`)."
            )
        check_remote_url(flag, url)
        return url

    def spark_conf_pairs(self) -> list[tuple[str, str]]:
        """Parse --spark_conf values; raise a one-line error for a malformed one."""
        return key_value_pairs("--spark_conf", self.spark_conf)


def key_value_pairs(flag: str, items: list[str] | None) -> list[tuple[str, str]]:
    """The (key, value) pairs of a repeatable ``flag KEY=VALUE`` (Spark conf); a one-line
    `PipelineOptionsError` for a malformed one."""
    pairs = []
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise PipelineOptionsError(
                f"{flag} {item!r} is not KEY=VALUE; write it like {flag} spark.executor.memory=2g."
            )
        pairs.append((key.strip(), value.strip()))
    return pairs


def check_remote_url(flag: str, url: str) -> None:
    """Raise a one-line error unless ``url`` is a Spark Connect URL (pyspark's own parser)."""
    from pyspark.errors import PySparkValueError
    from pyspark.sql.connect.client import DefaultChannelBuilder

    try:
        DefaultChannelBuilder(url)
    except (PySparkValueError, ValueError) as e:
        detail = getattr(e, "getMessageParameters", lambda: None)() or {}
        reason = detail.get("detail") or str(e).strip().splitlines()[0]
        raise PipelineOptionsError(
            f"{flag} {url!r} is not a Spark Connect URL ({reason}); write it like "
            "sc://127.0.0.1:15002 (`sparkbeam serve` prints the URL of a local server)."
        ) from None


def _given(options: pipeline_options.PipelineOptions, name: str) -> bool:
    """Whether ``--name`` is among the flags the options were parsed from."""
    flag = f"--{name}"
    return any(str(f) == flag or str(f).startswith(flag + "=") for f in options._flags or ())


DEFAULT_CHECKPOINT_ROOT = "sparkbeam-checkpoints"


class SparkStreamingOptions(pipeline_options.PipelineOptions):
    """Options of ``--streaming`` runs, which always have a checkpoint store (default
    ``./sparkbeam-checkpoints/<job name>``: the same command rerun after a crash resumes)."""

    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        parser.add_argument(
            "--checkpoint_interval_s",
            type=float,
            default=1.0,
            help="Streaming: a pipeline's next round starts as soon as the previous one has "
            "committed and work is due (a timer: a residual's resume delay, a processing-time "
            "timer or trigger; or a watermark that moved); with no timer pending, the loop "
            "looks for work again this long after a round started. Every round ends with a "
            "checkpoint (its barrier). Default: 1.0.",
        )
        parser.add_argument(
            "--materialization_interval_s",
            type=float,
            default=10.0,
            help="Streaming: how often a checkpoint writes a full snapshot of the state "
            "instead of only its changelog. Every round's tasks, and a restore, replay the "
            "changelog since the last snapshot, so a long interval makes rounds slower; a "
            "short one writes the whole state more often. Default: 10.",
        )
        parser.add_argument(
            "--max_restores",
            type=int,
            default=3,
            help="Streaming: how many times one pipeline may restore its last checkpoint "
            "after a round failed beyond Spark's task retries before the job fails. A round "
            "that read a damaged checkpoint file does not count: it falls back to the newest "
            "sound checkpoint. Default: 3.",
        )
        parser.add_argument(
            "--startpoint_max_age_s",
            type=float,
            default=7 * 24 * 3600.0,
            help="Startpoints (batch with --checkpoint_dir, and streaming): a startpoint still "
            "pending this many seconds after it was set is reported as a warning when the job "
            "starts or restores (never silently dropped). Default: 604800 (7 days).",
        )
        parser.add_argument(
            "--break_lock",
            action="store_true",
            default=False,
            help="With a checkpoint store (--checkpoint_dir, or --streaming): take the store's "
            "write lock even if another job holds it, or its lock file is unreadable (a crash "
            "while taking it). Only when no other job uses the store. Default: off.",
        )
        parser.add_argument(
            "--fresh",
            action="store_true",
            default=False,
            help="With a checkpoint store: run a job whose last checkpoint is finished again "
            "from the beginning (it writes its output again: give it a new --output). An "
            "unfinished run still resumes. Without it, rerunning a finished job fails. "
            "Default: off.",
        )

    def default_checkpoint_dir(self, job_name: str) -> str:
        """``./sparkbeam-checkpoints/<job name>``: one directory per job name."""
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", job_name).strip("-") or "sparkbeam"
        return os.path.abspath(os.path.join(DEFAULT_CHECKPOINT_ROOT, safe))


# The longest duration any *_s flag may have: ten years, far below where a deadline overflows
# a timestamp or threading's TIMEOUT_MAX (an infinite interval once killed every round).
MAX_DURATION_S = 10 * 365 * 24 * 3600.0

# (flag, smallest allowed value, whether the smallest itself is allowed, what it means)
_BOUNDS = (
    ("checkpoint_interval_s", 0.0, False, "seconds between the starts of two rounds"),
    ("materialization_interval_s", 0.0, False, "seconds between full state snapshots"),
    ("max_restores", 0, True, "restores of a failed pipeline (0: fail at once)"),
    ("residual_budget_s", 0.0, True, "seconds (0: every residual goes to the store)"),
    ("sdf_split_after_s", 0.0, True, "seconds (0: no runner-initiated splits)"),
    ("startpoint_max_age_s", 0.0, False, "seconds"),
    ("task_state_memory_mb", 0, False, "megabytes a worker keeps of state before spilling"),
)


def check_option_values(options: pipeline_options.PipelineOptions) -> None:
    """Refuse an out-of-range sparkbeam option with one line naming it (before any Spark work)."""

    views = (options.view_as(SparkRunnerOptions), options.view_as(SparkStreamingOptions))
    parallelism = options.view_as(pipeline_options.FlinkRunnerOptions).parallelism
    unset = parallelism == -1 and not _given(options, "parallelism")  # Beam's default: unset
    if parallelism is not None and parallelism < 1 and not unset:
        raise PipelineOptionsError(
            f"--parallelism={parallelism!r} must be a whole number of at least 1 (the number "
            "of partitions after a shuffle); leave it out to use Spark's default parallelism."
        )
    _check_key_groups(options.view_as(SparkRunnerOptions).max_key_groups, parallelism, unset)
    for name, low, inclusive, meaning in _BOUNDS:
        value = next((getattr(v, name) for v in views if hasattr(v, name)), None)
        if value is None:
            continue
        if isinstance(value, float) and not math.isnan(value) and value > MAX_DURATION_S:
            raise PipelineOptionsError(
                f"--{name}={value!r} must be a finite number of seconds, at most "
                f"{MAX_DURATION_S:.0f} (10 years; {meaning}); fix the flag and rerun."
            )
        bad = math.isnan(value) or value < low or (value == low and not inclusive)
        if bad:
            bound = f"at least {low:g}" if inclusive else f"more than {low:g}"
            raise PipelineOptionsError(
                f"--{name}={value!r} must be {bound} ({meaning}); fix the flag and rerun."
            )


def _check_key_groups(max_key_groups: int | None, parallelism: int | None, unset: bool) -> None:
    """--max_key_groups in 1..32768, and an explicit --parallelism that keyed stages can have."""
    if max_key_groups is not None and not 1 <= max_key_groups <= MAX_KEY_GROUPS_LIMIT:
        raise PipelineOptionsError(
            f"--max_key_groups={max_key_groups!r} must be in 1..{MAX_KEY_GROUPS_LIMIT}; leave "
            "it out to derive it from the parallelism."
        )
    if unset or parallelism is None:
        return
    if max_key_groups is not None and parallelism > max_key_groups:
        raise PipelineOptionsError(
            f"--parallelism={parallelism} is more than --max_key_groups={max_key_groups}: a "
            "keyed stage's task owns whole key groups; raise --max_key_groups (a new store) to "
            "at least the parallelism, lower --parallelism, or leave --max_key_groups out."
        )
    if parallelism > MAX_KEY_GROUPS_LIMIT:
        raise PipelineOptionsError(
            f"--parallelism={parallelism} is more than the {MAX_KEY_GROUPS_LIMIT} key groups a "
            "store can have (a keyed stage's task owns whole key groups); lower --parallelism."
        )

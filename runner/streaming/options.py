"""SparkStreamingOptions: the flags of ``--streaming`` runs (rounds and checkpoints)."""

from __future__ import annotations

import os
import re

from apache_beam.options import pipeline_options

DEFAULT_CHECKPOINT_ROOT = "sparkbeam-checkpoints"


class SparkStreamingOptions(pipeline_options.PipelineOptions):
    """Options of SparkCheckpointRunner in streaming mode (``--streaming``).

    A streaming run always has a checkpoint store: ``--checkpoint_dir`` if
    given, else ``./sparkbeam-checkpoints/<job name>`` — so running the same
    command again after a crash resumes where the last checkpoint left off.
    """

    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        parser.add_argument(
            "--checkpoint_interval_s",
            type=float,
            default=1.0,
            help="Streaming: the shortest time between the starts of two rounds of a "
            "pipeline; every round ends with a checkpoint (its barrier). A pipeline with no "
            "due work waits longer, until its next timer. Default: 1.0.",
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
            "after a round failed beyond Spark's task retries before the job fails. "
            "Default: 3.",
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

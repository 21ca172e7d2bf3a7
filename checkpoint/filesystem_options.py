"""Beam's filesystem options as values and as command-line flags, applied once per process.

Owns: which of Beam's option groups configure a filesystem (S3, GCS, Azure, HDFS), the values
a user set in them (`collect`), applying them with ``FileSystems.set_options`` once per process
and value (`apply`), and the same flags on a CLI subcommand. Options nobody set are left out,
so Beam and boto3 read the environment as usual. Leaves to others: shipping the values to Spark
tasks (``sparkbeam.runner.spark.filesystem_options``). Beam is imported lazily.
"""

from __future__ import annotations

import argparse
import json
import threading
from typing import Any

GCS_CLI_FLAGS = (
    "--project",
    "--impersonate_service_account",
    "--gcp_oauth_scope",
    "--no_auth",
    "--enable_gcsio_blob_generation",
    "--gcs_custom_audit_entry",
)
"""The GoogleCloudOptions flags that matter to GCS (the others are Dataflow job settings)."""

_LOCK = threading.Lock()
_APPLIED: str | None = None


def groups() -> tuple:
    """Beam's option groups that configure a filesystem."""
    from apache_beam.options.pipeline_options import (
        AzureOptions,
        GoogleCloudOptions,
        HadoopFileSystemOptions,
        S3Options,
    )

    return (S3Options, GoogleCloudOptions, AzureOptions, HadoopFileSystemOptions)


class _Recorder:
    """Stands in for Beam's argument parser: notes a group's dests, optionally forwards them."""

    def __init__(self, target: Any = None, only: tuple[str, ...] | None = None) -> None:
        self.target, self.only = target, only
        self.dests: list[str] = []

    def add_argument(self, *flags: str, **kwargs: Any) -> None:
        if self.only is not None and flags[0] not in self.only:
            return
        self.dests.append(kwargs.get("dest") or flags[0].lstrip("-").replace("-", "_"))
        if self.target is not None:
            kwargs["default"] = argparse.SUPPRESS  # only flags given on the command line count
            self.target.add_argument(*flags, **kwargs)

    add_value_provider_argument = add_argument

    def add_argument_group(self, *args: Any, **kwargs: Any) -> _Recorder:
        return self


def option_names() -> set[str]:
    """The dests of every filesystem option (``s3_endpoint_url``, ``hdfs_host``, ...)."""
    names: set[str] = set()
    for group in groups():
        recorder = _Recorder()
        group._add_argparse_args(recorder)
        names.update(recorder.dests)
    return names


def collect(options: Any) -> dict[str, Any]:
    """The filesystem options set in a ``PipelineOptions``, by dest."""
    wanted = option_names()
    given = options.get_all_options(drop_default=True)
    return {k: v for k, v in sorted(given.items()) if k in wanted and v is not None}


def encode(values: dict[str, Any]) -> str:
    """A stable text form of `collect`'s values (what travels to Spark tasks)."""
    return json.dumps(values, sort_keys=True, default=str)


def apply(encoded: str) -> None:
    """``FileSystems.set_options`` with these values, unless this process already has them."""
    global _APPLIED
    with _LOCK:
        if encoded == _APPLIED:
            return
        from apache_beam.io.filesystems import FileSystems
        from apache_beam.options.pipeline_options import PipelineOptions

        FileSystems.set_options(PipelineOptions([], **json.loads(encoded or "{}")))
        _APPLIED = encoded


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """Add Beam's filesystem flags (``--s3_endpoint_url``, ...) to a CLI subcommand."""
    for group in groups():
        target = parser.add_argument_group(
            f"filesystem options (Beam's {group.__name__}; default: from the environment)"
        )
        only = GCS_CLI_FLAGS if group.__name__ == "GoogleCloudOptions" else None
        group._add_argparse_args(_Recorder(target, only))


def apply_cli_arguments(args: argparse.Namespace) -> None:
    """Configure Beam's filesystems in this process from the flags of `add_cli_arguments`."""
    wanted = option_names()
    apply(encode({k: v for k, v in sorted(vars(args).items()) if k in wanted and v is not None}))

"""How every store subcommand takes, checks and opens its store, and reports what it cannot.

Owns: ``--checkpoint_dir`` with Beam's filesystem flags, refusing a ``--checkpoint_dir`` no
command could read (one line, exit code 2, no directory created), opening a store read-only or
locked, and the one-line errors of an unreachable store; for ``sparkbeam checkpoints`` (`cli`),
``startpoints`` (`startpoints_cli`) and ``drain``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence

from sparkbeam.checkpoint import filesystem_options
from sparkbeam.checkpoint.errors import StoreAccessError, first_line
from sparkbeam.checkpoint.store import CheckpointStore, open_store


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    """``--checkpoint_dir`` and Beam's filesystem flags, for a subcommand that opens a store."""
    parser.add_argument(
        "--checkpoint_dir",
        required=True,
        help="store URL: a path, file://, s3://bucket/dir, gs://, azfs://, hdfs://",
    )
    filesystem_options.add_cli_arguments(parser)


def use_store_arguments(args: argparse.Namespace) -> None:
    """Configure Beam's filesystems from the flags, for a store that needs them."""
    url = args.checkpoint_dir
    if "://" in url and not url.startswith(("file://", "memory://")):
        filesystem_options.apply_cli_arguments(args)


def run_store_command(
    command: str,
    func: Callable[[argparse.Namespace], int],
    args: argparse.Namespace,
    errors: tuple[type[Exception], ...],
) -> int:
    """Run a parsed store subcommand: a bad ``--checkpoint_dir``, ``errors`` and an unreachable
    store become one line on stderr and exit code 2."""
    use_store_arguments(args)
    try:
        return func(args)
    except StoreArgumentError as e:
        return cli_error(str(e), command)
    except errors as e:
        return cli_error(str(e))
    except Exception as e:
        return unreachable(args, e)


def cli_error(message: str, command: str | None = None) -> int:
    """What every ``sparkbeam`` command prints of a failure: one line on stderr (in argparse's
    style for bad input, ``command`` given), exit code 2."""
    prefix = "" if command is None else f"sparkbeam {command}: "
    print(f"{prefix}error: {message}", file=sys.stderr)
    return 2


_CLIENT_MODULES = ("botocore", "boto3", "google", "azure", "requests", "urllib3", "apache_beam.io")
"""Where the errors of the filesystems' clients come from (S3, GCS, Azure, Beam's own)."""

_FLAGS_BY_SCHEME = {
    "s3": "the filesystem flags (--s3_endpoint_url, --s3_access_key_id, ...) or the environment "
    "(AWS_ENDPOINT_URL_S3, AWS_ACCESS_KEY_ID, ...)",
    "gs": "the credentials (GOOGLE_APPLICATION_CREDENTIALS, --impersonate_service_account), "
    "--project, and STORAGE_EMULATOR_HOST (only for an emulator)",
    "azfs": "--azure_connection_string (or AZURE_STORAGE_CONNECTION_STRING), or "
    "--blob_service_endpoint with --azure_managed_identity_client_id",
    "hdfs": "--hdfs_host, --hdfs_port and --hdfs_user",
}


def unreachable(args: argparse.Namespace, error: Exception) -> int:
    """One line for a store the filesystem client cannot reach, naming the flags of its
    scheme; other errors propagate."""
    if isinstance(error, StoreAccessError):  # already says what to set
        return cli_error(f"cannot reach the checkpoint store: {error}")
    if not type(error).__module__.startswith(_CLIENT_MODULES):
        raise error
    first = first_line(error)[:300]
    scheme = args.checkpoint_dir.split("://", 1)[0]
    flags = _FLAGS_BY_SCHEME.get(scheme, "the filesystem flags of its scheme")
    return cli_error(
        f"cannot reach the checkpoint store {args.checkpoint_dir!r}: {first}. Check {flags}."
    )


class StoreArgumentError(ValueError):
    """``--checkpoint_dir`` names nothing a command can read (one line, exit code 2)."""


def check_store_url(url: str, must_exist: bool = True) -> None:
    """Refuse a ``--checkpoint_dir`` that is no readable store before anything opens it: a
    read-only command must not create a directory, nor print "no checkpoints" for a typo."""
    hint = "check --checkpoint_dir (the directory or URL the job was run with)"
    if url.startswith("memory://"):
        return
    if "://" not in url or url.startswith("file://"):
        path = url[len("file://") :] if url.startswith("file://") else url
        if not os.path.exists(path):
            if not must_exist:
                return
            raise StoreArgumentError(f"no checkpoint store at {url!r}: it does not exist; {hint}.")
        if not os.path.isdir(path):
            raise StoreArgumentError(f"{url!r} is a file, not a checkpoint store; {hint}.")
        if not os.access(path, os.R_OK | os.X_OK):
            raise StoreArgumentError(
                f"cannot read the checkpoint store {url!r}: permission denied; run as a user "
                "who can read it."
            )
        return
    from apache_beam.io.filesystems import FileSystems

    if FileSystems.get_scheme(url) is None:
        raise StoreArgumentError(
            f"{url!r} is neither a path nor a URL (scheme://...); {hint}, e.g. ./ckpt or "
            "s3://bucket/ckpt."
        )
    try:
        FileSystems.get_filesystem(url)
    except ValueError:
        raise StoreArgumentError(
            f"no filesystem for {url!r}: its scheme is not one Beam knows (s3://, gs://, "
            "azfs://, hdfs://, file://); install the Beam extra for it or fix the URL."
        ) from None


def read_only_store(args: argparse.Namespace) -> CheckpointStore:
    check_store_url(args.checkpoint_dir)
    return open_store(args.checkpoint_dir, read_only=True)


def locked_store(args: argparse.Namespace, what: str) -> CheckpointStore:
    check_store_url(args.checkpoint_dir, must_exist=False)
    return open_store(
        args.checkpoint_dir, job_name=f"startpoints-{what}", break_lock=args.break_lock
    )  # fmt: skip


def when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) if t else "-"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)

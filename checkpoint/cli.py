"""``sparkbeam checkpoints list|show|verify|clean`` and ``sparkbeam startpoints set|list|delete``.

Owns: the operator's view of a store -- the argparse subcommands (`add_subcommands`,
`add_startpoint_subcommands`, wired into the ``sparkbeam`` console script by the runner) and a
standalone `main` (``python -m sparkbeam.checkpoint.cli checkpoints list --checkpoint_dir URL``).
Startpoints are written out of band (never into a checkpoint) and apply at the job's next start;
``startpoints set``/``delete`` take the store's lock so they cannot race a running job. Output
is a readable table, or JSON with ``--json``; ``verify`` also says which checkpoint a restart
of each pipeline would restore (the newest undamaged one). ``list``, ``show`` and ``verify``
open the store read-only (no lock); ``clean`` takes the lock. Every subcommand takes Beam's
filesystem flags (``--s3_endpoint_url``, ``--s3_access_key_id``, ..., ``--hdfs_host``, ...) for
stores on ``s3://``, ``gs://``, ``azfs://`` or ``hdfs://``; unset ones come from the
environment, as in Beam. Leaves to others: everything it prints comes from `CheckpointStore`;
applying startpoints (`sparkbeam.sdf.startpoints.session`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence

from sparkbeam.checkpoint import filesystem_options
from sparkbeam.checkpoint.errors import (
    CheckpointCorruptError,
    CheckpointNotFoundError,
    StoreLockedError,
)
from sparkbeam.checkpoint.reader import VerificationResult
from sparkbeam.checkpoint.startpoints import StartpointKind, check_position
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


def add_subcommands(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``checkpoints`` with its four subcommands to an existing subparsers object."""
    p = subparsers.add_parser("checkpoints", help="inspect, verify and clean a checkpoint store")
    sub = p.add_subparsers(dest="checkpoints_command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        add_store_arguments(sp)
        sp.add_argument("--json", action="store_true", help="print JSON instead of a table")

    sp = sub.add_parser("list", help="pipelines and their checkpoints")
    common(sp)
    sp.add_argument("--pipeline", help="only this pipeline (default: all)")
    sp.set_defaults(checkpoints_func=_list)

    sp = sub.add_parser("show", help="one checkpoint's manifest in detail")
    common(sp)
    sp.add_argument("--pipeline", required=True)
    sp.add_argument("--checkpoint", type=int, help="checkpoint id (default: the latest)")
    sp.set_defaults(checkpoints_func=_show)

    sp = sub.add_parser("verify", help="read every file and check sizes and checksums")
    common(sp)
    sp.add_argument("--pipeline", help="only this pipeline (default: all)")
    sp.add_argument("--checkpoint", type=int, help="only this checkpoint id (default: all)")
    sp.set_defaults(checkpoints_func=_verify)

    sp = sub.add_parser("clean", help="delete files that no checkpoint names (takes the lock)")
    common(sp)
    sp.add_argument(
        "--grace_s",
        type=float,
        default=3600.0,
        help="keep unnamed files younger than this many seconds (default: 3600)",
    )
    sp.add_argument(
        "--break_lock", action="store_true", help="take the lock even if held (default: off)"
    )
    sp.set_defaults(checkpoints_func=_clean)
    p.set_defaults(func=run)
    return p


def add_startpoint_subcommands(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``startpoints`` with ``set``, ``list`` and ``delete``."""
    p = subparsers.add_parser(
        "startpoints", help="set, list, delete source start positions (applied at the next start)"
    )
    sub = p.add_subparsers(dest="startpoints_command", required=True)

    def common(sp: argparse.ArgumentParser, *, one: bool) -> None:
        add_store_arguments(sp)
        sp.add_argument(
            "--pipeline",
            required=one,
            help="independent pipeline id, e.g. pipeline-0 (`sparkbeam plan` or `checkpoints "
            "list` shows them)" + ("" if one else "; default: all"),
        )
        if one:
            sp.add_argument(
                "--transform", required=True, help="the SDF source transform's name (ReadOffsets)"
            )
            sp.add_argument(
                "--key",
                help="only this element, as str(element) or the provider's startpoint_key(); "
                "default: every element of the transform at start",
            )
            sp.add_argument(
                "--break_lock",
                action="store_true",
                help="take the store lock even if held (default: off)",
            )

    sp = sub.add_parser("set", help="add or replace a startpoint")
    common(sp, one=True)
    sp.add_argument("--kind", required=True, choices=[k.value for k in StartpointKind])
    sp.add_argument(
        "--value",
        help="offset (kind offset) or epoch milliseconds (kind timestamp); "
        "none for oldest and upcoming",
    )
    sp.set_defaults(startpoints_func=_sp_set)

    sp = sub.add_parser("list", help="pending startpoints, with their age")
    common(sp, one=False)
    sp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sp.set_defaults(startpoints_func=_sp_list)

    sp = sub.add_parser("delete", help="remove one startpoint")
    common(sp, one=True)
    sp.set_defaults(startpoints_func=_sp_delete)
    p.set_defaults(func=run_startpoints)
    return p


def run(args: argparse.Namespace) -> int:
    """Run a parsed ``checkpoints`` command; returns the exit code."""
    use_store_arguments(args)
    try:
        return args.checkpoints_func(args)
    except StoreArgumentError as e:
        return _input_error("checkpoints", e)
    except (CheckpointCorruptError, CheckpointNotFoundError, StoreLockedError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        return _unreachable(args, e)


def run_startpoints(args: argparse.Namespace) -> int:
    """Run a parsed ``startpoints`` command; returns the exit code."""
    use_store_arguments(args)
    try:
        return args.startpoints_func(args)
    except StoreArgumentError as e:
        return _input_error("startpoints", e)
    except (CheckpointCorruptError, StoreLockedError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        return _unreachable(args, e)


def _input_error(command: str, error: Exception) -> int:
    print(f"sparkbeam {command}: error: {error}", file=sys.stderr)
    return 2


def _unreachable(args: argparse.Namespace, error: Exception) -> int:
    """One line for a store the filesystem client cannot reach; other errors propagate."""
    if not type(error).__module__.startswith(("botocore", "boto3", "apache_beam.io")):
        raise error
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    print(
        f"error: cannot reach the checkpoint store {args.checkpoint_dir!r}: {first}. Check the "
        "filesystem flags (--s3_endpoint_url, --s3_access_key_id, ...) or the environment "
        "(AWS_ENDPOINT_URL_S3, AWS_ACCESS_KEY_ID, ...).",
        file=sys.stderr,
    )
    return 2


class StoreArgumentError(ValueError):
    """``--checkpoint_dir`` names nothing a command can read (one line, exit code 2)."""


def check_store_url(url: str, must_exist: bool = True) -> None:
    """Refuse a ``--checkpoint_dir`` that is no readable store, before anything opens it.

    A read-only command must not create a directory, nor print "no checkpoints" for a typo."""
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


def _ro(args: argparse.Namespace) -> CheckpointStore:
    check_store_url(args.checkpoint_dir)
    return open_store(args.checkpoint_dir, read_only=True)


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) if t else "-"


def _size(n: int) -> str:
    x = float(n)
    for unit in ("B", "KiB", "MiB"):
        if x < 1024:
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return f"{x:.1f} GiB"


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _list(args: argparse.Namespace) -> int:
    store = _ro(args)
    pids = [args.pipeline] if args.pipeline else store.list_pipelines()
    infos = [i for pid in pids for i in store.list_checkpoints(pid)]
    if args.json:
        print(json.dumps([dataclasses.asdict(i) for i in infos], indent=1))
        return 0
    if not infos:
        print(f"No checkpoints in {store.url!r}.")
        return 0
    rows = [
        (
            i.pipeline_id, i.checkpoint_id, _when(i.created), i.parallelism or "-", i.entries,
            _size(i.materialization_bytes), _size(i.changelog_bytes),
            i.materialization_files + i.changelog_files, "ok" if i.error is None else i.error,
        )
        for i in infos
    ]  # fmt: skip
    print(
        _table(
            ("PIPELINE", "ID", "CREATED (UTC)", "PAR", "KEYS", "MATERIALIZED", "CHANGELOG",
             "FILES", "MANIFEST"),
            rows,
        )
    )  # fmt: skip
    return 0


def _show(args: argparse.Namespace) -> int:
    store = _ro(args)
    cid = args.checkpoint
    if cid is None:
        ids = [i.checkpoint_id for i in store.list_checkpoints(args.pipeline)]
        if not ids:
            raise CheckpointNotFoundError(args.pipeline, None, store.url)
        cid = ids[-1]
    m = store.load_manifest(args.pipeline, cid)
    if args.json:
        print(json.dumps(m.to_json(), indent=1))
        return 0
    print(f"pipeline         {m.pipeline_id}")
    print(f"checkpoint       {m.checkpoint_id}   created {_when(m.created)} UTC")
    print(f"fingerprint      {m.fingerprint or '-'}")
    print(f"parallelism      {m.parallelism}   max key groups {m.max_key_groups}")
    print(f"keys             {m.entries}")
    print(f"completed work   {', '.join(sorted(m.completed)) or '-'}")
    print(f"source positions {', '.join(sorted(m.source_positions)) or '-'}")
    print(f"metadata         {json.dumps(m.metadata, sort_keys=True)}")
    rows = [("materialization", f.name, f"{f.kg_start}-{f.kg_stop}", f.records, _size(f.size),
             f.checksum) for f in m.materialization]  # fmt: skip
    rows += [("changelog", f.name, "-", f.records, _size(f.size), f.checksum) for f in m.changelog]
    print(_table(("KIND", "FILE", "KEY GROUPS", "RECORDS", "SIZE", "CHECKSUM"), rows))
    return 0


def _verify(args: argparse.Namespace) -> int:
    store = _ro(args)
    pids = [args.pipeline] if args.pipeline else store.list_pipelines()
    results: list[VerificationResult] = []
    for pid in pids:
        ids = [args.checkpoint] if args.checkpoint is not None else [
            i.checkpoint_id for i in store.list_checkpoints(pid)
        ]  # fmt: skip
        results.extend(store.verify(pid, cid) for cid in ids)
    bad = [r for r in results if not r.ok]
    # What a restart restores: the newest undamaged checkpoint (known when all were checked).
    restart = {} if args.checkpoint is not None else _restart_choices(pids, results)
    if args.json:
        docs = [dict(dataclasses.asdict(r), restart=restart.get(r.pipeline_id) == r.checkpoint_id)
                for r in results]  # fmt: skip
        print(json.dumps(docs, indent=1))
        return 1 if bad else 0
    rows = [(r.pipeline_id, r.checkpoint_id, r.files_checked, _size(r.bytes_checked),
             "ok" if r.ok else "DAMAGED") for r in results]  # fmt: skip
    print(_table(("PIPELINE", "ID", "FILES", "BYTES", "RESULT"), rows))
    for r in bad:
        for p in r.problems:
            print(f"  {r.pipeline_id} checkpoint {r.checkpoint_id}: {p}")
    for pid in pids if args.checkpoint is None else ():
        cid = restart.get(pid)
        if cid is None:
            print(f"{pid}: no undamaged checkpoint: a restart fails; restore the store from a "
                  "backup, or start fresh with a new --checkpoint_dir.")  # fmt: skip
        else:
            print(f"{pid}: a restart would use checkpoint {cid} (the newest undamaged one).")
    return 1 if bad else 0


def _restart_choices(pids: Sequence[str], results: list[VerificationResult]) -> dict:
    """Pipeline -> the checkpoint a restart restores (the newest undamaged), if any."""
    choices = {}
    for pid in pids:
        ok = [r.checkpoint_id for r in results if r.pipeline_id == pid and r.ok]
        if ok:
            choices[pid] = max(ok)
    return choices


def _clean(args: argparse.Namespace) -> int:
    check_store_url(args.checkpoint_dir)
    with open_store(args.checkpoint_dir, job_name="checkpoints-clean",
                    break_lock=args.break_lock) as store:  # fmt: skip
        deleted = store.clean(grace_s=args.grace_s)
    if args.json:
        print(json.dumps({"deleted": deleted}, indent=1))
    else:
        print(f"Deleted {len(deleted)} unreferenced file(s) from {args.checkpoint_dir!r}.")
        for p in deleted:
            print(f"  {p}")
    return 0


def _locked(args: argparse.Namespace, what: str) -> CheckpointStore:
    check_store_url(args.checkpoint_dir, must_exist=False)
    return open_store(
        args.checkpoint_dir, job_name=f"startpoints-{what}", break_lock=args.break_lock
    )  # fmt: skip


def _sp_set(args: argparse.Namespace) -> int:
    kind = StartpointKind(args.kind)
    check_position(kind, args.value)  # refused now, not at the next restart
    key = None if args.key is None else args.key.encode("utf-8")
    with _locked(args, "set") as store:
        sp = store.startpoints.set(args.pipeline, args.transform, kind, args.value, key)
    where = "every element" if args.key is None else f"element {args.key!r}"
    value = "" if sp.position is None else f" {sp.position}"
    print(
        f"Set startpoint {kind.value}{value} for {where} of transform {args.transform!r} in "
        f"pipeline {args.pipeline!r}. It applies when the job next starts or restores, and is "
        "deleted once a checkpoint reflects it (`sparkbeam startpoints list` shows what waits)."
    )
    return 0


def _sp_list(args: argparse.Namespace) -> int:
    store = _ro(args)
    items = store.startpoints.list(args.pipeline)
    now = time.time()
    if args.json:
        docs = [dict(s.to_json(), pipeline_id=s.pipeline_id, element_key=s.element_key_text,
                     age_s=now - s.created) for s in items]  # fmt: skip
        print(json.dumps(docs, indent=1))
        return 0
    if not items:
        print(f"No startpoints in {store.url!r}.")
        return 0
    rows = [(s.pipeline_id, s.source, "*" if s.element_key is None else s.element_key_text,
             s.kind.value, s.position or "-", _when(s.created), _age(now - s.created))
            for s in items]  # fmt: skip
    print(_table(("PIPELINE", "TRANSFORM", "KEY", "KIND", "VALUE", "SET (UTC)", "AGE"), rows))
    for s in items:
        if s.failed:  # every start refuses it: say so, with the command that deletes it
            print(f"FAILED: {s.failed}")
    return 0


def _age(seconds: float) -> str:
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= n:
            return f"{seconds / n:.1f}{unit}"
    return f"{max(seconds, 0):.0f}s"


def _sp_delete(args: argparse.Namespace) -> int:
    key = None if args.key is None else args.key.encode("utf-8")
    with _locked(args, "delete") as store:
        found = store.startpoints.delete(args.pipeline, args.transform, key)
    where = "the transform-level startpoint" if key is None else f"the startpoint of {args.key!r}"
    if not found:
        print(
            f"error: pipeline {args.pipeline!r} has no {where[4:]} for transform "
            f"{args.transform!r}. Run `sparkbeam startpoints list --checkpoint_dir "
            f"{args.checkpoint_dir}` to see what exists.",
            file=sys.stderr,
        )
        return 1
    print(f"Deleted {where} for transform {args.transform!r} in pipeline {args.pipeline!r}.")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sparkbeam", description="sparkbeam checkpoint store")
    sub = parser.add_subparsers(dest="command", required=True)
    add_subcommands(sub)
    add_startpoint_subcommands(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

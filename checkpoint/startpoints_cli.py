"""``sparkbeam startpoints set|list|delete``: operator start positions, out of band.

Startpoints are written to the store (never into a checkpoint) and apply at the job's next
start; ``set`` and ``delete`` take the store's lock so they cannot race a running job, ``set``
refuses a position it can check, ``list`` shows each one's age and a ``FAILED:`` line for one
that failed to apply. Leaves to others: applying them (`sparkbeam.sdf.startpoints.session`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from sparkbeam.checkpoint.cli_store import (
    add_store_arguments,
    locked_store,
    read_only_store,
    run_store_command,
    table,
    when,
)
from sparkbeam.checkpoint.errors import CheckpointCorruptError, StoreLockedError
from sparkbeam.checkpoint.startpoints import StartpointKind, check_position


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


def run_startpoints(args: argparse.Namespace) -> int:
    """Run a parsed ``startpoints`` command; returns the exit code."""
    errors = (CheckpointCorruptError, StoreLockedError, ValueError)
    return run_store_command("startpoints", args.startpoints_func, args, errors)


def _sp_set(args: argparse.Namespace) -> int:
    kind = StartpointKind(args.kind)
    check_position(kind, args.value)  # refused now, not at the next restart
    key = None if args.key is None else args.key.encode("utf-8")
    with locked_store(args, "set") as store:
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
    store = read_only_store(args)
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
             s.kind.value, s.position or "-", when(s.created), _age(now - s.created))
            for s in items]  # fmt: skip
    print(table(("PIPELINE", "TRANSFORM", "KEY", "KIND", "VALUE", "SET (UTC)", "AGE"), rows))
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
    with locked_store(args, "delete") as store:
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

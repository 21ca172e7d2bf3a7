"""``sparkbeam checkpoints list|show|verify|clean``, and the standalone store CLI.

Owns: the operator's view of a store's checkpoints -- the argparse subcommands
(`add_subcommands`, wired into the ``sparkbeam`` console script by the runner) and a standalone
`main` (``python -m sparkbeam.checkpoint.cli``) that also has ``startpoints``. A table, or JSON
with ``--json``; ``verify`` also says which checkpoint a restart would restore (the driver's
rule) and exits 1 if any checkpoint is damaged or a restart is refused. ``clean`` alone takes
the lock. Leaves to others: opening the store (`cli_store`) and what it prints (`store`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence

from sparkbeam.checkpoint.cli_store import (
    add_store_arguments,
    check_store_url,
    read_only_store,
    run_store_command,
    table,
    when,
)
from sparkbeam.checkpoint.errors import (
    CheckpointCorruptError,
    CheckpointNotFoundError,
    StoreLockedError,
)
from sparkbeam.checkpoint.reader import VerificationResult
from sparkbeam.checkpoint.restore import lost_manifests, sound_checkpoint
from sparkbeam.checkpoint.startpoints_cli import add_startpoint_subcommands
from sparkbeam.checkpoint.store import CheckpointInfo, open_store


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

    sp = sub.add_parser(
        "verify",
        help="read every file and check sizes and checksums; say which checkpoint a restart "
        "uses; exit 0 if every checkpoint is sound, 1 if any is damaged",
    )
    common(sp)
    sp.add_argument("--pipeline", help="only this pipeline (default: all)")
    sp.add_argument("--checkpoint", type=int, help="only this checkpoint id (default: all)")
    sp.set_defaults(checkpoints_func=_verify)

    sp = sub.add_parser("clean", help="delete files that no checkpoint names (takes the lock)")
    common(sp)
    sp.add_argument(
        "--grace_s",
        type=_grace_seconds,
        default=3600.0,
        help="keep unnamed files younger than this many seconds, 0 to 315360000 (default: 3600)",
    )
    sp.add_argument(
        "--break_lock", action="store_true", help="take the lock even if held (default: off)"
    )
    sp.set_defaults(checkpoints_func=_clean)
    p.set_defaults(func=run)
    return p


def _grace_seconds(text: str) -> float:
    """--grace_s as a finite number of seconds from 0 to ten years (argparse names the flag)."""
    value = float(text)
    if not 0 <= value <= 10 * 365 * 24 * 3600:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds from 0 to 315360000")
    return value


def run(args: argparse.Namespace) -> int:
    """Run a parsed ``checkpoints`` command; returns the exit code."""
    errors = (CheckpointCorruptError, CheckpointNotFoundError, StoreLockedError)
    return run_store_command("checkpoints", args.checkpoints_func, args, errors)


def _size(n: int) -> str:
    x = float(n)
    for unit in ("B", "KiB", "MiB"):
        if x < 1024:
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return f"{x:.1f} GiB"


def _list(args: argparse.Namespace) -> int:
    store = read_only_store(args)
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
            i.pipeline_id, i.checkpoint_id, when(i.created), i.parallelism or "-", i.entries,
            _size(i.materialization_bytes), _size(i.changelog_bytes),
            i.materialization_files + i.changelog_files, _layout(i),
            "ok" if i.error is None else i.error,
        )
        for i in infos
    ]  # fmt: skip
    print(
        table(
            ("PIPELINE", "ID", "CREATED (UTC)", "PAR", "KEYS", "MATERIALIZED", "CHANGELOG",
             "FILES", "LAYOUT", "MANIFEST"),
            rows,
        )
    )  # fmt: skip
    latest = {i.pipeline_id: i for i in infos if i.error is None}  # oldest first
    for info in latest.values():
        if info.refused is not None:
            print(f"{info.pipeline_id}: a restart is refused: {info.refused}")
    return 0


def _layout(info: CheckpointInfo) -> str:
    if info.error is not None:
        return "-"
    return str(info.layout) if info.refused is None else f"{info.layout} (refused)"


def _show(args: argparse.Namespace) -> int:
    store = read_only_store(args)
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
    print(f"checkpoint       {m.checkpoint_id}   created {when(m.created)} UTC")
    print(f"fingerprint      {m.fingerprint or '-'}")
    print(f"parallelism      {m.parallelism}   max key groups {m.max_key_groups}")
    print(f"keys             {m.entries}")
    print(f"completed work   {', '.join(sorted(m.completed)) or '-'}")
    print(f"source positions {', '.join(sorted(m.source_positions)) or '-'}")
    print(f"metadata         {json.dumps(m.metadata, sort_keys=True)}")
    rows = [("materialization", f.name, f"{f.kg_start}-{f.kg_stop}", f.records, _size(f.size),
             f.checksum) for f in m.materialization]  # fmt: skip
    rows += [("changelog", f.name, "-", f.records, _size(f.size), f.checksum) for f in m.changelog]
    print(table(("KIND", "FILE", "KEY GROUPS", "RECORDS", "SIZE", "CHECKSUM"), rows))
    return 0


def _verify(args: argparse.Namespace) -> int:
    store = read_only_store(args)
    pids = [args.pipeline] if args.pipeline else store.list_pipelines()
    results: list[VerificationResult] = []
    for pid in pids:
        ids = [args.checkpoint] if args.checkpoint is not None else [
            i.checkpoint_id for i in store.list_checkpoints(pid)
        ]  # fmt: skip
        results.extend(store.verify(pid, cid) for cid in ids)
    bad = [r for r in results if not r.ok]
    # What a restart restores: the newest undamaged checkpoint (known when all were checked).
    restart = {} if args.checkpoint is not None else _restart_choices(store, pids, results)
    refused = {
        pid: CheckpointInfo.from_manifest(store.load_manifest(pid, cid), store.url).refused
        for pid, cid in restart.items()
    }
    checked = {r.pipeline_id for r in results}
    lost = {pid: lost_manifests(store, pid) for pid in pids if pid not in checked}
    # Damage, or a restart that fails (manifests lost, another state layout): exit 1.
    failing = bool(bad) or any(lost.values()) or any(refused.values())
    if args.json:
        docs = [
            dict(dataclasses.asdict(r), restart=restart.get(r.pipeline_id) == r.checkpoint_id,
                 refused=refused.get(r.pipeline_id) if restart.get(r.pipeline_id) == r.checkpoint_id
                 else None)
            for r in results
        ]  # fmt: skip
        docs += [{"pipeline_id": pid, "ok": False, "problems": [str(e)], "restart": False}
                 for pid, e in lost.items() if e is not None]  # fmt: skip
        print(json.dumps(docs, indent=1))
        return 1 if failing else 0
    rows = [(r.pipeline_id, r.checkpoint_id, r.files_checked, _size(r.bytes_checked),
             "ok" if r.ok else "DAMAGED") for r in results]  # fmt: skip
    print(table(("PIPELINE", "ID", "FILES", "BYTES", "RESULT"), rows))
    for r in bad:
        for p in r.problems:
            print(f"  {r.pipeline_id} checkpoint {r.checkpoint_id}: {p}")
    for pid in pids if args.checkpoint is None else ():
        cid = restart.get(pid)
        if lost.get(pid) is not None:
            print(f"{pid}: committed checkpoints, but no manifest is left: a restart fails "
                  "(starting fresh would publish its output again); restore the manifests "
                  "from a backup, or delete the pipeline's directory or use a new "
                  "--checkpoint_dir.")  # fmt: skip
        elif pid in lost:
            print(f"{pid}: no checkpoint committed: a restart starts fresh.")
        elif cid is None:
            print(f"{pid}: no undamaged checkpoint: a restart fails; restore the store from a "
                  "backup, or start fresh with a new --checkpoint_dir.")  # fmt: skip
        elif refused.get(pid):
            print(f"{pid}: a restart is refused: {refused[pid]}")
        else:
            print(f"{pid}: a restart would use checkpoint {cid} (the newest undamaged one).")
    return 1 if failing else 0


def _restart_choices(store, pids: Sequence[str], results: list[VerificationResult]) -> dict:
    """Pipeline -> the checkpoint a restart restores, if any."""
    choices = {pid: _restart_choice(store, pid, results) for pid in pids}
    return {pid: cid for pid, cid in choices.items() if cid is not None}


def _restart_choice(store, pid: str, results: list[VerificationResult]) -> int | None:
    """The newest sound checkpoint: the driver's own rule (`restore.sound_checkpoint`), over
    the results just printed (a checkpoint committed since is verified now)."""
    checked = {r.checkpoint_id: r for r in results if r.pipeline_id == pid}
    cid, _ = sound_checkpoint(store, pid, lambda c: checked.get(c) or store.verify(pid, c))
    return cid


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sparkbeam", description="sparkbeam checkpoint store")
    sub = parser.add_subparsers(dest="command", required=True)
    add_subcommands(sub)
    add_startpoint_subcommands(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

"""The ``sparkbeam`` command: ``plan`` (run a script with a runner that only prints its
ExecutionPlan), ``drain``, ``serve`` (a local Spark Connect server until Ctrl-C or SIGTERM);
``checkpoints`` and ``startpoints`` from ``sparkbeam.checkpoint.cli``, ``sdf-check`` from
``sparkbeam.sdf.testing.cli``.
"""

from __future__ import annotations

import argparse
import logging
import os
import runpy
import sys
from collections.abc import Sequence

_APITOOLS = "apitools not found, and bigquery client libraries are not available"


def _import_beam_quietly() -> None:
    """Import Beam without the one warning its optional BigQuery client logs, nor the root
    handler that ``logging.warning`` installed (a script's ``basicConfig`` still works)."""
    root = logging.getLogger()
    handlers = list(root.handlers)
    quiet = logging.Filter()
    quiet.filter = lambda record: not str(record.msg).startswith(_APITOOLS)  # type: ignore
    root.addFilter(quiet)
    try:
        import apache_beam  # noqa: F401
    finally:
        root.removeFilter(quiet)
        root.handlers[:] = handlers


_import_beam_quietly()

from apache_beam.runners.runner import (  # noqa: E402 - after the quiet import
    PipelineResult,
    PipelineRunner,
    PipelineState,
)

from sparkbeam.checkpoint import cli as checkpoint_cli  # noqa: E402
from sparkbeam.checkpoint import cli_store, startpoints_cli  # noqa: E402
from sparkbeam.checkpoint.cli_store import cli_error  # noqa: E402
from sparkbeam.sdf.testing import cli as sdf_check_cli  # noqa: E402
from sparkbeam.translation import translate  # noqa: E402


class PlanPrinter(PipelineRunner):
    """A runner that prints the plan sparkbeam would run, and runs nothing."""

    def run_pipeline(self, pipeline, options) -> PipelineResult:
        from apache_beam.options.pipeline_options import StandardOptions

        from sparkbeam.runner.runner import portable_proto

        streaming = options.view_as(StandardOptions).streaming
        print(translate(portable_proto(pipeline, options), streaming=streaming).describe())
        return PipelineResult(PipelineState.DONE)


def _plan(args: argparse.Namespace) -> int:
    if not os.path.isfile(args.script):
        what = "a directory" if os.path.isdir(args.script) else "not found"
        return cli_error(
            f"script {args.script!r} is {what}: give the path of a Beam pipeline script.", "plan"
        )
    # By its import path: under `python -m` this module is __main__, which runpy replaces.
    runner = "--runner=sparkbeam.runner.cli.PlanPrinter"
    argv = [a for a in args.script_args if not a.startswith("--runner")]
    sys.argv = [args.script, *argv, runner]
    try:
        runpy.run_path(args.script, run_name="__main__")
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def _drain(args: argparse.Namespace) -> int:
    """Ask the streaming job on a store to drain (it checks between rounds)."""
    from sparkbeam.checkpoint import open_storage
    from sparkbeam.checkpoint.lock import read_lock
    from sparkbeam.runner.streaming.executor import DRAIN_REQUEST

    cli_store.use_store_arguments(args)
    storage = open_storage(args.checkpoint_dir)
    holder = read_lock(storage)
    if holder is None:
        print(
            f"No job holds the store {args.checkpoint_dir}: nothing to drain. Start the "
            "streaming job first, or check --checkpoint_dir.",
            file=sys.stderr,
        )
        return 2
    storage.write(DRAIN_REQUEST, b"drain")
    print(
        f"Drain requested of job {holder.get('job_name')!r} "
        f"(pid {holder.get('pid')} on {holder.get('host')})."
    )
    print(
        f"Drain requested in {args.checkpoint_dir}: the running job truncates its pending "
        "restrictions, fires every window and timer, commits and stops (state DRAINED)."
    )
    return 0


def _serve(args: argparse.Namespace) -> int:
    """Run a local Spark Connect server until Ctrl-C or SIGTERM, then stop it."""
    import signal

    from sparkbeam.runner.options import key_value_pairs
    from sparkbeam.runner.spark import connect_server

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    # Both stop it; SIGINT also when the shell that started it in the background ignores it.
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    try:
        conf = dict(key_value_pairs("--conf", args.conf))
    except ValueError as e:  # its PipelineOptionsError, one line
        return cli_error(str(e), "serve")
    if args.max_cores is not None:
        if args.max_cores < 1:
            return cli_error(f"--max_cores {args.max_cores} must be at least 1.", "serve")
        conf["spark.cores.max"] = str(args.max_cores)
    try:
        server = connect_server.start_server(args.master, args.port, args.log_dir, extra_conf=conf)
    except connect_server.ConnectServerError as e:
        return cli_error(str(e), "serve")
    except KeyboardInterrupt:
        return 130
    print(
        f"Spark Connect server at {server.url} (master {args.master}, pid {server.pid}, log "
        f"{server.log_path}).\nRun pipelines on it with --spark_remote={server.url} (or "
        f"SPARK_REMOTE={server.url}). Ctrl-C (SIGINT) or SIGTERM stops it.",
        flush=True,
    )
    try:
        code = server.proc.wait()
        return cli_error(f"the server exited with code {code}; see {server.log_path}", "serve")
    except KeyboardInterrupt:
        print("Stopping the Spark Connect server.", flush=True)
        return 0
    finally:
        server.stop()


def _add_serve(sub) -> None:
    from sparkbeam.runner.spark.connect_server import DEFAULT_MASTER, DEFAULT_PORT

    serve = sub.add_parser("serve", help="run a local Spark Connect server (Ctrl-C stops it)")
    serve.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"port on 127.0.0.1. Default: {DEFAULT_PORT}.",
    )
    serve.add_argument(
        "--master",
        default=DEFAULT_MASTER,
        help=f"the server's Spark master. Default: {DEFAULT_MASTER}.",
    )
    serve.add_argument(
        "--log_dir", default=None, help="folder of the server's log. Default: a new temporary one."
    )
    serve.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Spark configuration of the server's application, repeatable (e.g. --conf "
        "spark.executor.memory=2g). Default: none.",
    )
    serve.add_argument(
        "--max_cores",
        type=int,
        default=None,
        help="the most cores the server's application takes on a cluster master "
        "(spark.cores.max), leaving the rest to other applications. Default: Spark's (on a "
        "standalone master: every core).",
    )
    serve.set_defaults(func=_serve)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparkbeam", description="Beam Python pipelines on Apache Spark."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="print the execution plan of a pipeline script")
    plan.add_argument("script", help="path of a Beam pipeline script")
    plan.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    plan.set_defaults(func=_plan)
    drain = sub.add_parser("drain", help="drain the streaming job running on a checkpoint store")
    cli_store.add_store_arguments(drain)  # --checkpoint_dir and --s3_endpoint_url, ...
    drain.set_defaults(func=_drain)
    _add_serve(sub)
    checkpoint_cli.add_subcommands(sub)
    startpoints_cli.add_startpoint_subcommands(sub)
    sdf_check_cli.add_subcommands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "checkpoints":
        return checkpoint_cli.run(args)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

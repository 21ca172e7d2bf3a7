"""``sparkbeam sdf-check module:DoFnOrFactory --elements JSON_OR_FILE``: check an SDF.

Owns: the ``sdf-check`` subcommand (`add_subcommands`, wired into the ``sparkbeam`` console
script by the runner) and a standalone `main`. Prints ``check_sdf``'s scenario table and returns
0 when no scenario failed, else 1. Leaves the checks to ``sparkbeam.sdf.testing.check``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from sparkbeam.checkpoint.cli_store import cli_error


def add_subcommands(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``sdf-check`` to an existing subparsers object."""
    from sparkbeam.sdf.testing.check import SCENARIOS

    p = subparsers.add_parser(
        "sdf-check", help="check a splittable DoFn: coders, splits, checkpoints, resume"
    )
    p.add_argument("dofn", help="module:attr of a DoFn, a DoFn class or a factory (no args)")
    p.add_argument(
        "--elements",
        required=True,
        help="input elements: a JSON list, or the path of a file holding one",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random choices (default: 0)")
    p.add_argument(
        "--parallelism",
        type=int,
        nargs=2,
        default=(2, 3),
        metavar=("RUN", "RESUME"),
        help="parallelism of the runs, and of the resume at another parallelism (default: 2 3)",
    )
    p.add_argument("--spark_master", default="local[2]", help="Spark master (default: local[2])")
    p.add_argument(
        "--scenario",
        action="append",
        choices=SCENARIOS,
        help="run only this scenario, repeatable (default: all)",
    )
    p.set_defaults(func=run)
    return p


def load_elements(text: str) -> list:
    """A JSON list given inline, or read from the file at that path."""
    if os.path.exists(text):
        with open(text, encoding="utf-8") as f:
            text = f.read()
    value = json.loads(text)
    if not isinstance(value, list):
        raise ValueError(f"--elements must be a JSON list, got {type(value).__name__}.")
    return value


def check_dofn_ref(ref: str) -> str | None:
    """What is wrong with a ``module:attr`` reference, in one line (None: it loads)."""
    from sparkbeam.sdf.testing.run import load_dofn

    try:
        load_dofn(ref)
    except ModuleNotFoundError as e:
        return (
            f"cannot import module {e.name!r} of {ref!r}: run from the directory that holds "
            "it, add it to PYTHONPATH, or install its package."
        )
    except AttributeError as e:
        module = ref.partition(":")[0]
        return f"{ref!r}: {e}; check the name after ':' (an attribute of module {module!r})."
    except (ValueError, TypeError) as e:
        return str(e)
    return None


def run(args: argparse.Namespace) -> int:
    from sparkbeam.sdf.testing.check import check_sdf

    sys.path.insert(0, os.getcwd())  # module:attr relative to where the command runs
    try:
        elements = load_elements(args.elements)
    except (ValueError, OSError) as e:
        first = " ".join(str(e).split())
        return cli_error(
            f"bad --elements {args.elements!r}: {first}. Give a JSON list, e.g. "
            "--elements '[1, 2]', or the path of a file holding one.",
            "sdf-check",
        )
    problem = check_dofn_ref(args.dofn)
    if problem is not None:
        return cli_error(problem, "sdf-check")
    report = check_sdf(
        args.dofn,
        elements,
        seed=args.seed,
        parallelism=tuple(args.parallelism),
        spark_master=args.spark_master,
        scenarios=args.scenario,
        raise_on_failure=False,
    )
    print(report)
    print("PASS" if report.passed else "FAIL")
    return 0 if report.passed else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sparkbeam", description="Check a splittable DoFn.")
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

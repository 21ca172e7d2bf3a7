"""A user's pipeline whose DoFns live in the user's own code, for shipping tests.

``stage_user_pipeline(dest)`` copies it into ``dest`` (a folder no executor
has) and returns the main script's path. Run it in a subprocess:
``python <main> --output OUT [--dofn_module M] [--lib_dir D] <Beam flags>``.

- ``mylib/`` (package, next to the main script): shipped by sparkbeam as an
  own-folder module; ``--dofn_module mylib.probe`` (default).
- ``tinypkg/`` (``setup.py`` + package ``tinydofns``): ship it with
  ``--setup_file <dest>/tinypkg/setup.py --lib_dir <dest>/tinypkg
  --dofn_module tinydofns``.
- ``--lib_dir`` adds a folder to the driver's sys.path only: without a flag
  that ships it, executors fail with ModuleNotOnExecutorsError.

Each output line is JSON: {"x", "y", "module_file", "leaked"} where ``leaked``
lists the driver-only sys.path folders the executor's Python could see.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def stage_user_pipeline(dest: Path) -> Path:
    """Copy the user's pipeline (main script, mylib/, tinypkg/) to ``dest``; return the main."""
    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist")
    shutil.copytree(HERE / "mylib", dest / "mylib", ignore=ignore)
    shutil.copytree(HERE / "tinypkg", dest / "tinypkg", ignore=ignore)
    shutil.copyfile(HERE / "user_main.py", dest / "user_main.py")
    return dest / "user_main.py"


def run_user_pipeline(
    tmp_path: Path, master: str, *args: str
) -> tuple[subprocess.CompletedProcess, Path]:
    """Run the staged pipeline on ``master`` from a folder and a PYTHONPATH that lack the
    user's modules (executors inherit neither); its output file."""
    main = stage_user_pipeline(tmp_path / "app")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    out = tmp_path / "out.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYTHONPATH"] = str(elsewhere)  # executors inherit it: it lacks the user's code
    cmd = [sys.executable, str(main), "--output", str(out), *args]
    cmd += ["--runner=SparkCheckpointRunner", f"--spark_master_url={master}"]
    proc = subprocess.run(cmd, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    return proc, out

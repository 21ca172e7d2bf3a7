"""Ship the user's code to Spark executors, and name what was not shipped.

Executors have their own Python and site-packages; the driver's ``sys.path`` never reaches
them. Through Spark's ``addPyFile`` (a zip on every Python worker's ``sys.path``) go the
modules the main script imports from its own folder, and Beam's ``--setup_file`` and
``--extra_package`` (and local packages named in ``--requirements_file``), collected by Beam's
``Stager``: an sdist is built into a wheel on the driver, a pure-Python wheel ships as a zip.
Compiled packages and PyPI requirements must already be installed there: sparkbeam runs no pip
on executors (it logs what it leaves out). ``--save_main_session`` needs nothing more.

Over Spark Connect the same files, and a zip of sparkbeam itself (the server's Python may not
have it), are uploaded as session artifacts (``addArtifacts(..., pyfile=True)``), once per
session. Also here: the error a task's ``ModuleNotFoundError`` becomes
(``missing_module_error``, asked by ``errors.run_guarded``).
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import importlib.metadata
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

from sparkbeam.runner.errors import StageFailedError

_LOG = logging.getLogger(__name__)
_SHIPPED: dict[str, set[str]] = {}  # Spark application id -> file names already added
_PACKAGE_SUFFIXES = (".whl", ".tar.gz", ".tar", ".zip")
_SKIP_DIRS = {"__pycache__", ".git", ".venv", "venv", ".tox", ".mypy_cache", ".pytest_cache"}


class UserCodeShippingError(RuntimeError):
    """The user's code cannot be shipped to the executors as given."""

    @classmethod
    def compiled(cls, package: str) -> UserCodeShippingError:
        return cls(
            f"Package {package!r} has compiled code; sparkbeam ships only pure-Python "
            "packages. Install it in the executors' Python instead."
        )


class ModuleNotOnExecutorsError(StageFailedError):
    """A task failed importing a module the executors' Python does not have."""

    def __init__(self, stage: str, module: str, user_traceback: str) -> None:
        RuntimeError.__init__(
            self,
            f"Beam stage {stage!r} failed on Spark: module {module!r} is not installed on "
            "the executors. Ship it: keep it in the main script's folder (sparkbeam ships "
            "those modules), pass --setup_file=path/to/setup.py or --extra_package=dist/"
            "<pkg>.whl, or add a zip with spark-submit --py-files / --spark_conf "
            "spark.submit.pyFiles=<pkg>.zip; or install it in the executors' Python.\n"
            f"User traceback (from the Python worker):\n{user_traceback}",
        )
        self.stage = stage
        self.module = module
        self.user_traceback = user_traceback


_MISSING = re.compile(r"ModuleNotFoundError: No module named '([^']+)'")


def missing_module_error(stage: str, user_traceback: str) -> ModuleNotOnExecutorsError | None:
    """The clear error for a task that failed on a missing module, else None."""
    match = _MISSING.search(user_traceback)
    if match is None:
        return None
    return ModuleNotOnExecutorsError(stage, match.group(1), user_traceback)


def code_files(options, connect: bool) -> list[Path]:
    """The files a run ships: the user's modules and Beam's staged packages (on Connect,
    sparkbeam first). Each is named by its content, so the names identify the code."""
    work = _work_dir()
    files = [f for f in (main_folder_zip(work, connect),) if f] + staged_packages(options, work)
    return [sparkbeam_zip(), *files] if connect else files


def ship_user_code(spark, options, files: list[Path] | None = None) -> list[str]:
    """Add ``files`` (default ``code_files``) to the SparkContext, or upload them as Connect
    session artifacts; the names added (each once per application or session)."""
    from sparkbeam.runner.spark.session import is_connect

    connect = is_connect(spark)
    files = code_files(options, connect) if files is None else files
    if connect:
        shipped = _SHIPPED.setdefault(spark.session_id, set())
        add = lambda path: spark.addArtifacts(path, pyfile=True)  # noqa: E731
    else:
        sc = spark.sparkContext
        shipped = _SHIPPED.setdefault(sc.applicationId, set())
        add = sc.addPyFile
    added = []
    for path in files:
        if path.name not in shipped:
            add(str(path))
            shipped.add(path.name)
            added.append(path.name)
    if added:
        _LOG.info("Shipped to the executors: %s", ", ".join(added))
    return added


@functools.cache
def sparkbeam_zip() -> Path:
    """A zip of the sparkbeam package as this process imports it (installed or editable: its
    sub-packages may live in other folders), built once per process."""
    import sparkbeam
    import sparkbeam.io  # noqa: F401 - its own folder too (sources and sinks tasks run)
    import sparkbeam.runner.runner  # noqa: F401 - loads every sub-package a run uses

    root = Path(sparkbeam.__path__[0]).resolve()
    tops = {"sparkbeam": root}
    for name, module in sorted(sys.modules.items()):
        parts = name.split(".")
        paths = list(getattr(module, "__path__", []))
        if len(parts) == 2 and parts[0] == "sparkbeam" and paths:
            folder = Path(paths[0]).resolve()
            if not folder.is_relative_to(root):
                tops[name] = folder
    return _zip_paths(_work_dir(), "sparkbeam", tops)


def _work_dir() -> Path:
    """A new folder for zips to ship, removed when this process exits (Spark serves them
    from there while its application runs)."""
    work = Path(tempfile.mkdtemp(prefix="sparkbeam-ship-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    return work


def main_folder_zip(work: Path, connect: bool = False) -> Path | None:
    """A zip of the modules the main script imported from its own folder (None if none).

    Run as ``python -m pkg.app``, the main's folder is the one holding ``pkg``. Over Spark
    Connect with no user script as main (pytest, a notebook, a REPL), the working directory's
    modules ship: the server's workers never share the driver's ``sys.path``."""
    folder = _main_folder()
    if folder is None and connect:
        folder = Path.cwd()
    if folder is None:
        return None
    tops = main_folder_modules(folder)
    if not tops:
        return None
    return _zip_paths(work, "user_modules", tops)


def _main_folder() -> Path | None:
    """The folder of the user's main script; None when ``__main__`` is not one (no file, or
    an installed tool's such as pytest's)."""
    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None)
    if not main_file:
        return None
    folder = Path(main_file).resolve().parent
    if any(folder.is_relative_to(root) for root in _installed_roots()):
        return None
    spec = getattr(main, "__spec__", None)
    for _ in range(spec.name.count(".") if spec and spec.name else 0):
        folder = folder.parent
    return folder


def main_folder_modules(folder: Path) -> dict[str, Path]:
    """Top-level modules/packages imported from ``folder``: name -> file or package folder;
    not installed distributions (editable ones too) nor the interpreter's: executors have
    their own."""
    excluded = _installed_roots()
    modules = dict(sys.modules)
    found: dict[str, Path] = {}
    for top in {name.partition(".")[0] for name in modules} - {"__main__"}:
        module = modules.get(top)
        path = _top_level_path(module, top, folder) if module is not None else None
        if path is not None and not any(path.is_relative_to(root) for root in excluded):
            found[top] = path
    if found:  # the (slow) scan of installed distributions only when there is a candidate
        installed = set(importlib.metadata.packages_distributions())
        found = {top: path for top, path in found.items() if top not in installed}
    return found


def _top_level_path(module, top: str, folder: Path) -> Path | None:
    """The file or folder of top-level module ``top`` if it sits directly in ``folder``."""
    for candidate in (folder / top, folder / f"{top}.py"):
        if not candidate.exists():
            continue
        locations = [getattr(module, "__file__", None), *list(getattr(module, "__path__", []))]
        for loc in filter(None, locations):
            resolved = Path(loc).resolve()
            if resolved == candidate.resolve() or resolved.is_relative_to(candidate.resolve()):
                return candidate
    return None


def _installed_roots() -> list[Path]:
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    roots.update(sysconfig.get_paths().get(k, "") for k in ("purelib", "platlib", "stdlib"))
    return [Path(r).resolve() for r in roots if r]


def _zip_paths(work: Path, stem: str, tops: dict[str, Path]) -> Path:
    """Zip modules and package folders, each at the zip path of its (dotted) name; the
    zip's name carries a content hash. A folder without ``__init__.py`` (a namespace
    package) gets an empty one: ``zipimport`` cannot import namespace packages."""
    staging = work / f"{stem}.zip"
    with zipfile.ZipFile(staging, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(tops):
            path = tops[name]
            if path.is_file():
                zf.write(path, path.name)
                continue
            at = name.replace(".", "/")
            for root, dirs, filenames in os.walk(path):
                dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
                if "__init__.py" not in filenames:
                    inside = (Path(root).relative_to(path) / "__init__.py").as_posix()
                    zf.writestr(zipfile.ZipInfo(f"{at}/{inside}"), b"")
                for filename in sorted(filenames):
                    if filename.endswith((".pyc", ".pyo")):
                        continue
                    full = Path(root) / filename
                    zf.write(full, f"{at}/{full.relative_to(path).as_posix()}")
    return _hash_named(staging, stem, ".zip")


def _hash_named(path: Path, stem: str, suffix: str) -> Path:
    """Rename to ``stem-<sha>.suffix`` so one name always means one content (Spark requires it)."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    target = path.with_name(f"{stem}-{digest}{suffix}")
    path.replace(target)
    return target


def staged_packages(options, work: Path) -> list[Path]:
    """Beam's --setup_file / --extra_package artifacts, as zips for addPyFile."""
    from apache_beam.options.pipeline_options import PipelineOptions, SetupOptions
    from apache_beam.runners.portability.stager import Stager

    setup = options.view_as(SetupOptions)
    if not (setup.setup_file or setup.extra_packages or setup.requirements_file):
        return []
    only = PipelineOptions(
        setup_file=setup.setup_file,
        extra_packages=list(setup.extra_packages or []) or None,
        requirements_file=setup.requirements_file,
        requirements_cache="skip",  # PyPI requirements are not downloaded: see module doc
    )
    build = work / "build"
    build.mkdir()
    try:
        resources = Stager.create_job_resources(
            only, str(build), log_submission_env_dependencies=False
        )
    except RuntimeError as e:
        raise UserCodeShippingError(f"Could not build the user's packages: {e}") from None
    shipped = []
    for src, dst, _ in Stager.extract_staging_tuple_iter(resources):
        if dst == "requirements.txt":
            _LOG.warning(
                "--requirements_file %r: its PyPI packages are not installed on the executors "
                "by sparkbeam; install them in the executors' Python (local package paths in "
                "it are shipped).",
                setup.requirements_file,
            )
        elif dst.endswith(_PACKAGE_SUFFIXES):  # not Beam's bookkeeping (extra_packages.txt)
            shipped.append(_as_zip(Path(src), dst, work))
    return shipped


def _as_zip(src: Path, name: str, work: Path) -> Path:
    """A pure-Python package as a zip for sys.path: a wheel as is, an sdist built first."""
    stem = src.name.split("-")[0]
    if name.endswith(".whl") or src.name.endswith(".whl"):
        if not src.name.endswith("-none-any.whl"):
            raise UserCodeShippingError.compiled(src.name)
        copy = work / "wheels" / src.name
        copy.parent.mkdir(exist_ok=True)
        shutil.copyfile(src, copy)
        return _hash_named(copy, stem, ".zip")
    wheel = _pip_wheel(src, work)
    if wheel is not None:
        return _as_zip(wheel, wheel.name, work)
    lib = _setup_build_py(src, work)
    return _zip_paths(work, stem, {p.name: p for p in lib.iterdir()})


def _pip_wheel(sdist: Path, work: Path) -> Path | None:
    """``pip wheel`` an sdist (no deps, no isolation: the driver's build tools, no network)."""
    out = work / "built"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    proc = subprocess.run(
        [*cmd, "--wheel-dir", str(out), str(sdist)], capture_output=True, text=True
    )
    wheels = sorted(out.glob("*.whl")) if out.exists() else []
    if proc.returncode == 0 and wheels:
        return wheels[0]
    _LOG.info("pip wheel %s failed (%s); trying setup.py build_py", sdist.name, _error_line(proc))
    return None


def _setup_build_py(sdist: Path, work: Path) -> Path:
    """The sdist's pure-Python modules via ``setup.py build_py`` (no wheel tooling needed)."""
    unpacked = work / "sdist"
    shutil.unpack_archive(sdist, unpacked)
    setups = sorted(unpacked.glob("*/setup.py"))
    if not setups:
        raise UserCodeShippingError(
            f"Could not build {sdist.name!r}: pip wheel failed and it has no setup.py. "
            "Install 'wheel' (and the project's build backend) in the driver's Python."
        )
    if any(p.suffix in (".c", ".cc", ".cpp", ".pyx") for p in setups[0].parent.rglob("*")):
        raise UserCodeShippingError.compiled(sdist.name)
    lib = work / "build_lib"
    proc = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(lib)],
        cwd=setups[0].parent,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0 or not lib.exists():
        raise UserCodeShippingError(f"Could not build {sdist.name!r}: {_error_line(proc)}")
    return lib


def _error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return (errors or lines or ["no output"])[0]

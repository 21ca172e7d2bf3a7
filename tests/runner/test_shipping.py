"""The user's code reaches executors that do not have it (issue 11.3): what is shipped and
how. The runs on executors that lack the code are in ``tests/cluster/test_cluster_shipping.py``
(on the shared standalone cluster)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkbeam.runner.errors import StageFailedError
from sparkbeam.runner.spark.shipping import (
    ModuleNotOnExecutorsError,
    main_folder_modules,
    missing_module_error,
)
from tests.runner.user_code import stage_user_pipeline


def test_missing_module_error_names_the_module_and_the_flags():
    tb = "Traceback...\nModuleNotFoundError: No module named 'mylib.probe'"
    err = missing_module_error("stage-2", tb)
    assert isinstance(err, ModuleNotOnExecutorsError) and isinstance(err, StageFailedError)
    with pytest.raises(ModuleNotOnExecutorsError, match=r"'stage-2'.*module 'mylib.probe'.*"):
        raise err
    assert err.module == "mylib.probe" and "--extra_package" in str(err)
    assert missing_module_error("stage-2", "ValueError: boom") is None


def test_main_folder_modules_finds_own_modules_not_installed_ones(tmp_path, monkeypatch):
    (tmp_path / "ownpkg_xyz").mkdir()
    (tmp_path / "ownpkg_xyz" / "__init__.py").write_text("")
    (tmp_path / "ownmod_xyz.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import ownmod_xyz  # noqa: F401
    import ownpkg_xyz  # noqa: F401

    try:
        found = main_folder_modules(tmp_path)
    finally:
        del sys.modules["ownmod_xyz"], sys.modules["ownpkg_xyz"]
    assert found == {
        "ownpkg_xyz": tmp_path / "ownpkg_xyz",
        "ownmod_xyz": tmp_path / "ownmod_xyz.py",
    }
    # sparkbeam's own source tree is an installed (editable) distribution: never shipped.
    repo = Path(__file__).resolve().parents[2]
    assert "sparkbeam" not in main_folder_modules(repo)


@pytest.mark.slow
def test_setup_file_and_extra_package_become_importable_zips(tmp_path):
    import zipfile

    from apache_beam.options.pipeline_options import PipelineOptions

    from sparkbeam.runner.spark.shipping import staged_packages

    app = stage_user_pipeline(tmp_path / "app").parent
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "setup.py", "-q", "sdist", "--dist-dir", str(dist)],
        cwd=app / "tinypkg",
        check=True,
        capture_output=True,
    )
    (sdist,) = dist.glob("*.tar.gz")
    for flag in (f"--setup_file={app / 'tinypkg' / 'setup.py'}", f"--extra_package={sdist}"):
        work = tmp_path / flag[2:7]
        work.mkdir()
        (zipped,) = staged_packages(PipelineOptions([flag]), work)
        assert zipped.name.startswith("tinydofns-") and zipped.suffix == ".zip"
        assert "tinydofns/__init__.py" in zipfile.ZipFile(zipped).namelist()
    assert staged_packages(PipelineOptions([]), tmp_path) == []


def test_a_namespace_package_ships_importable(tmp_path, monkeypatch):
    """A folder of modules without ``__init__.py`` imports from a zip only as a package."""
    from sparkbeam.runner.spark.shipping import main_folder_zip

    (tmp_path / "nspkg_xyz" / "inner").mkdir(parents=True)
    (tmp_path / "nspkg_xyz" / "inner" / "mod.py").write_text("VALUE = 7\n")
    (tmp_path / "app_xyz.py").write_text("import nspkg_xyz.inner.mod\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(
        sys.modules["__main__"], "__file__", str(tmp_path / "app_xyz.py"), raising=False
    )
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", None, raising=False)
    import nspkg_xyz.inner.mod  # noqa: F401

    try:
        (tmp_path / "work").mkdir()
        zipped = main_folder_zip(tmp_path / "work")
    finally:
        for name in [n for n in sys.modules if n.startswith("nspkg_xyz")]:
            del sys.modules[name]
    probe = "import nspkg_xyz.inner.mod as m; print(m.VALUE)"
    env = dict(os.environ, PYTHONPATH=str(zipped))
    done = subprocess.run(
        [sys.executable, "-S", "-c", probe], env=env, capture_output=True, text=True, cwd="/"
    )
    assert done.stdout.strip() == "7", done.stderr[-2000:]


def test_the_folder_of_shipped_zips_is_removed_when_the_driver_exits(tmp_path):
    """Spark serves the zips from it while its application runs; afterwards nothing is left
    (every run used to leave a ``sparkbeam-ship-*`` folder in the temp directory)."""
    code = (
        "from sparkbeam.runner.spark.shipping import sparkbeam_zip;"
        "z = sparkbeam_zip(); print(z.parent); assert z.exists()"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    folder = Path(proc.stdout.strip().splitlines()[-1])
    assert folder.parent == tmp_path and not folder.exists()

"""CLI input errors: one line on stderr naming what is wrong and what to do, exit code 2.

Two cases run the real ``sparkbeam`` console script in a subprocess, so what is checked is
exactly what an operator sees: no traceback, and no Beam import noise on stderr. The others
call its ``main`` in this process (a subprocess imports Beam again: ~7 s a case on 2 cores).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sparkbeam.runner.cli import main

SPARKBEAM = os.path.join(os.path.dirname(sys.executable), "sparkbeam")


def _sparkbeam(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SPARKBEAM, *args], capture_output=True, text=True, timeout=300, cwd=cwd
    )  # fmt: skip


@pytest.fixture
def cli(capsys, monkeypatch):
    """``sparkbeam <args>`` through the console script's ``main``, in this process."""

    def run(*args: str, cwd) -> subprocess.CompletedProcess:
        monkeypatch.chdir(cwd)
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess([SPARKBEAM, *args], code, out, err)

    return run


def _one_line_error(proc: subprocess.CompletedProcess, command: str, *words: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"sparkbeam {command}: error: "), lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_plan_of_a_missing_script(tmp_path):
    proc = _sparkbeam("plan", "missing.py", cwd=tmp_path)
    _one_line_error(proc, "plan", "'missing.py'", "not found", "pipeline script")


@pytest.mark.parametrize(
    "ref, words",
    [
        ("nosuchmodule:Fn", ("'nosuchmodule'", "PYTHONPATH")),
        ("os:NoSuchFn", ("'NoSuchFn'", "after ':'")),
        ("os.path", ("not 'module:attr'",)),
    ],
)
def test_sdf_check_of_a_dofn_that_does_not_load(cli, tmp_path, ref, words):
    proc = cli("sdf-check", ref, "--elements", "[1]", cwd=tmp_path)
    _one_line_error(proc, "sdf-check", *words)


def test_sdf_check_with_malformed_elements(cli, tmp_path):
    proc = cli("sdf-check", "os:path", "--elements", "[1, 2", cwd=tmp_path)
    _one_line_error(proc, "sdf-check", "--elements", "JSON list")


@pytest.mark.parametrize("command", ["checkpoints", "startpoints"])
@pytest.mark.parametrize(
    "store, words",
    [
        ("a_file", ("is a file", "--checkpoint_dir")),
        ("missing_dir", ("does not exist", "--checkpoint_dir")),
        ("garbage:://x", ("neither a path nor a URL",)),
        ("nosuch://bucket/ckpt", ("no filesystem", "scheme")),
    ],
)
def test_list_of_a_store_that_is_not_one(cli, tmp_path, command, store, words):
    (tmp_path / "a_file").write_text("not a store")
    proc = cli(command, "list", "--checkpoint_dir", store, cwd=tmp_path)
    _one_line_error(proc, command, *words)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]  # nothing was created


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_list_of_an_unreadable_store(cli, tmp_path):
    store = tmp_path / "ckpt"
    store.mkdir(mode=0)
    try:
        proc = cli("checkpoints", "list", "--checkpoint_dir", str(store), cwd=tmp_path)
    finally:
        store.chmod(0o755)
    _one_line_error(proc, "checkpoints", "permission denied")


def test_no_beam_import_warning_on_stderr(tmp_path):
    (tmp_path / "ckpt").mkdir()
    proc = _sparkbeam("checkpoints", "list", "--checkpoint_dir", "ckpt", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""

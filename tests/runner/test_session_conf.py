"""sparkbeam's Spark defaults that outlive a driver: the fair-scheduler file."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile

from sparkbeam.runner.spark import session_conf


def test_killed_drivers_leave_no_new_pools_file_each():
    """Each driver wrote its own temporary pools file and removed it at exit, so every killed
    driver (tests and soaks kill many) left one behind: over 300 here in a day. Drivers now
    share one file per content, written once."""
    code = (
        "import os, signal; from sparkbeam.runner.spark import session_conf; "
        "print(session_conf.allocation_file(), flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    )
    pattern = os.path.join(tempfile.gettempdir(), "sparkbeam-pools-*")
    paths = set()
    for _ in range(3):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        paths.add(proc.stdout.strip())
    before = set(glob.glob(pattern))
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        paths.add(proc.stdout.strip())
    assert len(paths) == 1 and set(glob.glob(pattern)) == before
    (path,) = paths
    with open(path) as f:
        assert f'<pool name="{session_conf.POOL}">' in f.read()
    assert session_conf.allocation_file() == path

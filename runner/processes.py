"""Stopping a process together with everything it started (its process group).

A Spark driver, a Connect server or a test broker starts children (a JVM, Python workers)
that outlive a signal sent to the leader alone. Callers start such a process with
``start_new_session=True`` and stop it here; these functions return only once no member of
the group runs, so the caller may then reuse its port or its files.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time


def stop_process_group(
    proc: subprocess.Popen, timeout: float = 10.0, signals=(signal.SIGTERM, signal.SIGKILL)
) -> None:
    """Send ``signals`` in turn to the group led by ``proc``, each given ``timeout`` seconds
    to empty it; SIGKILL whatever is left after the last."""
    for sig in signals:
        _signal_group(proc.pid, sig)
        if _wait_group(proc, timeout):
            return
    _signal_group(proc.pid, signal.SIGKILL)
    _wait_group(proc, timeout)


def kill_process_group(proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """SIGKILL the group led by ``proc`` (a crash of the whole host, as a test wants it)."""
    stop_process_group(proc, timeout, signals=(signal.SIGKILL,))


def group_members(pgid: int) -> list[int]:
    """PIDs in process group ``pgid`` that have not exited (zombies count as exited: in a
    container nobody may ever reap them)."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                state, _ppid, pgrp = f.read().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue  # gone meanwhile
        if int(pgrp) == pgid and state != "Z":
            members.append(int(entry.name))
    return members


def _wait_group(proc: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        proc.poll()  # reaps the leader
        if proc.returncode is not None and not group_members(proc.pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass

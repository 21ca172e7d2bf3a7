"""The shutdown check sees a marked process while it lives, by role, and not after it is stopped.

`tests.servers.leftover_processes` is what ``conftest.pytest_sessionfinish`` and the cluster's
``stop()`` rely on to prove that no master, worker, executor, driver or moto process outlives
the tests; this checks it on a plain ``sleep`` (and its child) started like a server.
"""

from __future__ import annotations

import subprocess
import time

from tests.servers import leftover_processes, server_env, stop_process_group


def test_leftover_processes_finds_marked_children_until_their_group_is_stopped():
    proc = subprocess.Popen(
        ["sh", "-c", "sleep 60 & sleep 60; wait"],
        env=server_env("probe-7"),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30  # the shell forks its children when it gets the CPU
        while True:
            found = leftover_processes(role="probe-7")
            if sum(cmd == "sleep 60" for _, cmd in found) == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert proc.pid in {pid for pid, _ in found}
        assert sum(cmd == "sleep 60" for _, cmd in found) == 2  # the children carry it too
        assert leftover_processes(role_prefix=("probe-",)) == found
        assert leftover_processes(role="probe-8") == []  # another role is not matched
    finally:
        stop_process_group(proc)
    assert leftover_processes(role="probe-7") == []

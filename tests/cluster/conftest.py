"""The shared standalone cluster (one master, two workers on 127.0.0.1) and the shutdown check.

One cluster serves every test of this folder (session scope: starting it costs tens of
seconds). When the session ends, `pytest_sessionfinish` fails the run if any process started
by a test server fixture -- master, worker, executor, Python worker, driver, moto -- is still
alive, and kills it.
"""

from __future__ import annotations

import os
import signal
import sys

import pytest

from tests.cluster.standalone import start_cluster
from tests.servers import leftover_processes


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory):
    """A Spark standalone master with two 1-core workers; stopped, and checked gone, at the end."""
    cluster = start_cluster(tmp_path_factory.mktemp("spark-cluster"), workers=2)
    try:
        yield cluster
    finally:
        left = cluster.stop()
        assert not left, f"cluster processes still alive after stop (killed now): {left}"


@pytest.fixture
def cluster(standalone_cluster):
    """The shared cluster, with both workers ALIVE (a test may have killed one)."""
    standalone_cluster.ensure_workers()
    return standalone_cluster


def pytest_sessionfinish(session, exitstatus):
    """No master, worker, executor, driver or moto process may outlive the test session."""
    left = leftover_processes()
    if not left:
        return
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    lines = "\n".join(f"  {pid}: {cmd[:200]}" for pid, cmd in left)
    print(f"\nERROR: server processes outlived the session (killed):\n{lines}", file=sys.stderr)
    session.exitstatus = 1


@pytest.hookimpl(tryfirst=True)  # before xdist reads the group marks into the node ids
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist, every test of this folder runs on one worker: they share one cluster."""
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.xdist_group("cluster"))

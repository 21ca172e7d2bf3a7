"""The cluster tests share one standalone cluster, so under pytest-xdist they must all run on
one worker (``--dist loadgroup`` with the ``cluster`` group). Two things silently broke that
grouping, so each worker started a cluster of its own and the S3 recovery job ran twice: the
folder's conftest added the mark after xdist had read the marks (now ``tryfirst``, in
``tests/connect/conftest.py`` too), and pytest 9.2 ignores xdist's node-id suffix
(pytest-dev/pytest-xdist#1386): constraints.txt pins pytest 9.1.1 until xdist follows."""

from __future__ import annotations


def test_this_folder_runs_in_the_cluster_group(request):
    if not getattr(request.config.option, "loadgroup", False):
        return  # not under xdist's loadgroup: one process runs everything anyway
    assert request.node.nodeid.endswith("@cluster"), (
        f"{request.node.nodeid} carries no xdist group: --dist loadgroup does not group on "
        "this pytest/xdist pair (see this module's docstring)"
    )

"""pytest plugin ``sparkbeam_sdf`` (entry point ``pytest11``): the ``sdf_checker`` fixture.

A user test is::

    def test_my_reader(sdf_checker):
        sdf_checker(MyReadFn(), ["a.txt", "b.txt"])

``sdf_checker`` is ``sparkbeam.sdf.testing.check_sdf`` (same keyword arguments) on the Spark
master ``--sdf-check-master`` (default: ``$SPARK_REMOTE`` if set, else ``local[2]``; an
``sc://host:port`` master such as a warm ``sparkbeam serve`` skips the JVM start, and an active
SparkSession is reused). Leaves the checks to ``sparkbeam.sdf.testing.check``.
"""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser) -> None:
    group = parser.getgroup("sparkbeam-sdf", "sparkbeam splittable-DoFn checks")
    group.addoption(
        "--sdf-check-master",
        default=os.environ.get("SPARK_REMOTE") or "local[2]",
        help=(
            "Spark master for sdf_checker's pipelines: local[N], spark://..., or sc://host:port "
            "for a Spark Connect server such as `sparkbeam serve` (default: $SPARK_REMOTE, "
            "else local[2])."
        ),
    )


@pytest.fixture
def sdf_checker(request):
    """``check_sdf`` bound to this session's Spark master."""
    from sparkbeam.sdf.testing.check import check_sdf

    master = request.config.getoption("--sdf-check-master")

    def checker(dofn, elements, **kwargs):
        kwargs.setdefault("spark_master", master)
        return check_sdf(dofn, elements, **kwargs)

    return checker

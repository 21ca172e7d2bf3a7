"""``check_sdf`` (and the pytest plugin's ``sdf_checker``) on a warm Spark Connect server.

An ``sc://`` master sends the scenario pipelines to the server: a test suite pointed at a
``sparkbeam serve`` skips the JVM start. The DoFn lives in this repository's ``tests``
package, which the server's workers cannot import: the run proves it reaches them.
"""

from __future__ import annotations

import pytest

from sparkbeam.sdf.testing import check_sdf
from tests.sdf_testing import sdfs

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.connect]


def test_check_sdf_runs_its_pipelines_on_a_connect_server(connect_server):
    report = check_sdf(
        sdfs.GoodOffsetFn(),
        sdfs.ELEMENTS,
        spark_master=connect_server.url,
        scenarios=["baseline", "checkpoint-every-claim"],
    )
    assert [s.status for s in report.scenarios] == ["PASS", "PASS"]
    assert report.scenarios[0].outputs > 0

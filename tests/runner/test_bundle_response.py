"""A ProcessBundleResponse field the runner does not handle fails the bundle, by name."""

from __future__ import annotations

import pytest
from apache_beam.portability.api import beam_fn_api_pb2

from sparkbeam.runner.task.stage_worker import check_handled


def test_handled_fields_pass():
    response = beam_fn_api_pb2.ProcessBundleResponse(requires_finalization=True)
    response.monitoring_data["1"] = b"\x01"
    response.residual_roots.add()
    check_handled(response)


def test_embedded_elements_raise_naming_the_field():
    response = beam_fn_api_pb2.ProcessBundleResponse()
    response.elements.data.add(instruction_id="b1", transform_id="out", data=b"x")
    with pytest.raises(NotImplementedError, match=r"field\(s\) elements, which sparkbeam"):
        check_handled(response)

"""Connect tests share one local Spark Connect server (the session-scoped ``connect_server``)."""

from __future__ import annotations

import os

import pytest


@pytest.hookimpl(tryfirst=True)  # before xdist reads the group marks into the node ids
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist, every test of this folder runs on one worker: one server for all."""
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.xdist_group("connect"))

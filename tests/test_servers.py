"""The test servers start, answer, and are gone (by PID) when stopped."""

from __future__ import annotations

import os

import pytest

from sparkbeam.runner.processes import group_members
from tests.servers import (
    leftover_processes,
    start_azurite,
    start_gcs_server,
    start_s3_server,
    stop_process_group,
)


def _put_and_list(server) -> list[str]:
    if server.name == "s3":
        server.client().put_object(Bucket=server.bucket, Key="a/b", Body=b"x")
    elif server.name == "gcs":
        server.client().bucket(server.bucket).blob("a/b").upload_from_string(b"x")
    else:
        server.client().upload_blob("a/b", b"x")
    return server.keys("a/")


@pytest.mark.parametrize("start", [start_s3_server, start_gcs_server, start_azurite])
def test_an_object_store_emulator_serves_a_bucket_and_stops(tmp_path, start):
    server = start(tmp_path)
    try:
        assert _put_and_list(server) == ["a/b"]
        members = set(group_members(server.proc.pid))
        marked = {pid for pid, _ in leftover_processes(role=server.name)}
        assert members and members <= marked  # so the check below can fail
    finally:
        stop_process_group(server.proc)
    assert server.proc.poll() is not None
    try:
        os.kill(server.proc.pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive
    assert not members & {pid for pid, _ in leftover_processes(role=server.name)}

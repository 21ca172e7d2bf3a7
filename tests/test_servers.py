"""The test servers start, answer, and are gone (by PID) when stopped."""

from __future__ import annotations

import os

from tests.servers import start_s3_server, stop_process_group


def test_s3_server_serves_a_bucket_and_stops(tmp_path):
    server = start_s3_server(tmp_path)
    try:
        server.client().put_object(Bucket=server.bucket, Key="a/b", Body=b"x")
        assert server.keys("a/") == ["a/b"]
    finally:
        stop_process_group(server.proc)
    assert server.proc.poll() is not None
    try:
        os.kill(server.proc.pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive

"""A refused connection to GCS or Azure is retried -- briefly before the endpoint has ever
answered in this process, by the client's own policy once it has (a transient fault of a
healthy store) -- where a wrong endpoint fails within seconds (`test_object_store_errors`).
Through a TCP gate in front of the emulator that refuses connections for a while."""

from __future__ import annotations

import socket
import threading
import time
from urllib.parse import urlsplit

import pytest

from sparkbeam.checkpoint.filesystem import open_storage
from tests.servers import free_port, point_beam_at


class Gate:
    """Forwards a 127.0.0.1 port to ``target`` (host:port); `shut` drops its connections and
    refuses new ones for a while."""

    def __init__(self, target: str) -> None:
        host, port = target.split(":")
        self.target, self.port = (host, int(port)), free_port()
        self.connections: list[socket.socket] = []
        self._listen()

    def _listen(self) -> None:
        self.server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, args=(self.server,), daemon=True).start()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:  # shut
                return
            upstream = socket.create_connection(self.target)
            self.connections += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()

    def shut(self, seconds: float | None = None) -> None:
        """Refuse connections, for ``seconds`` (None: for good)."""
        for s in [self.server, *self.connections]:  # shutdown: wakes the threads in accept/recv
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        if seconds is not None:
            threading.Timer(seconds, self._listen).start()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        sink.close()


@pytest.mark.parametrize("cloud", ["gcs", "azure"], indirect=True)
def test_a_refused_connection_is_retried(cloud, monkeypatch):
    """Refused at first contact for 1 s: reached. Refused for 5 s (past the first contact's
    3.5 s) once the store has answered: the client's own retries wait it out (GCS's within
    seconds, Azure's first one after 12-18 s)."""
    here = urlsplit(cloud.endpoint_url).netloc
    gate = Gate(here)
    there = f"127.0.0.1:{gate.port}"
    for name, value in cloud.env().items():
        monkeypatch.setenv(name, value.replace(here, there))
    monkeypatch.setattr(cloud, "endpoint_url", cloud.endpoint_url.replace(here, there))
    point_beam_at(cloud)
    storage = open_storage(cloud.url(f"gate-{gate.port}"))
    try:
        gate.shut(1.0)
        storage.write("a", b"first contact")
        gate.shut(5.0)
        started = time.monotonic()
        assert storage.read("a") == b"first contact"
        assert time.monotonic() - started >= 4.0  # it did meet the shut gate
    finally:
        gate.shut()

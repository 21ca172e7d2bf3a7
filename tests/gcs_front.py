"""fake-gcs-server behind a front that mends one thing: JSON batch requests.

google-cloud-storage sends each part of a batch (``POST /batch/storage/v1``: Beam's GCS
filesystem renames and deletes in batches) without a ``Content-ID`` header, and fake-gcs-server
skips such parts, answering an empty batch (fsouza/fake-gcs-server#411, #1443); real GCS does
not need the header. The front numbers the parts and passes every request through otherwise
unchanged. ``python -m tests.gcs_front PORT BACKEND_PORT -- fake-gcs-server ARGS...`` starts
the emulator as its child (one process group: `tests.servers` stops both by the front's PID).
"""

from __future__ import annotations

import http.client
import http.server
import itertools
import re
import subprocess
import sys

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


def number_batch_parts(content_type: str, body: bytes) -> bytes:
    """``body`` with a ``Content-ID: <n>`` header at the top of each multipart part."""
    found = re.search(r'boundary="?([^";]+)"?', content_type)
    if not found:
        return body
    delimiter = re.escape(b"--" + found.group(1).encode())
    ids = itertools.count(1)
    return re.sub(
        delimiter + rb"(\r?\n)",
        lambda m: m.group(0) + b"Content-ID: <%d>" % next(ids) + m.group(1),
        body,
    )


def handler(backend_port: int) -> type[http.server.BaseHTTPRequestHandler]:
    class Front(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.command == "POST" and self.path.startswith("/batch/"):
                body = number_batch_parts(self.headers.get("Content-Type", ""), body)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            backend = http.client.HTTPConnection("127.0.0.1", backend_port, timeout=120)
            try:
                backend.request(self.command, self.path, body=body, headers=headers)
                answer = backend.getresponse()
                data = answer.read()
            finally:
                backend.close()
            self.send_response(answer.status, answer.reason)
            for key, value in answer.getheaders():
                if key.lower() not in HOP_BY_HOP:
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = forward

        def log_message(self, format, *args) -> None:  # noqa: A002 - the base's signature
            pass

    return Front


def main(argv: list[str]) -> None:
    port, backend_port = int(argv[0]), int(argv[1])
    emulator = subprocess.Popen(argv[argv.index("--") + 1 :])
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler(backend_port))
    server.daemon_threads = True
    try:
        server.serve_forever()
    finally:
        emulator.terminate()


if __name__ == "__main__":
    main(sys.argv[1:])

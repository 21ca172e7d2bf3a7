"""Local runs: import the worker daemon's Beam while the JVM starts, not after.

The worker daemon's Beam import (1.3-3 s) came after the JVM's own start, on a cold local run's
critical path. So just before launching the JVM the driver starts a *zygote*, which imports it
while the JVM boots, then waits on a Unix socket in a private directory (its path in ``ENV``,
inherited by the JVM and the daemon it launches). That daemon (``hand_over``) sends the zygote
its standard streams, arguments, environment, ``sys.path`` and working directory; the zygote's
forked child takes them over and serves, warm. The launched process stays as the JVM's handle:
it forwards SIGTERM and exits when the child does.

One fork per zygote; an unasked one exits with its driver or after ``IDLE_S``. Whatever goes
wrong on the way, the launched daemon imports and serves itself.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import cast

ENV = "SPARKBEAM_DAEMON_ZYGOTE"
IDLE_S = 120.0
HAND_OVER_TIMEOUT_S = 60.0  # the zygote may still be importing when the daemon asks


# --- driver side -----------------------------------------------------------------------------


def spawn() -> subprocess.Popen | None:
    """Start a zygote for the JVM about to be launched and point ``ENV`` at it."""
    directory = tempfile.mkdtemp(prefix="sparkbeam-zygote-")  # 0700: only this user connects
    path = os.path.join(directory, "socket")
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", __name__, path, str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except OSError:
        os.rmdir(directory)
        return None
    os.environ[ENV] = path
    return proc


def abandon(proc: subprocess.Popen) -> None:
    """The JVM did not start: stop the zygote no daemon will ask, and remove its socket."""
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    _remove(str(cast(list, proc.args)[3]))  # the socket path, as spawn() passed it


def _remove(path: str) -> None:
    """The socket and its private directory."""
    for leftover in (path, os.path.dirname(path)):
        try:
            os.remove(leftover) if leftover == path else os.rmdir(leftover)
        except OSError:
            pass


def launched() -> None:
    """The JVM has its copy of the environment: later ones (another session) start their own."""
    os.environ.pop(ENV, None)


# --- the launched daemon's side ----------------------------------------------------------------


def hand_over() -> bool:
    """Have the zygote in ``ENV`` fork the daemon with this process's streams and environment;
    then stand in for it until it exits. False (nothing done) if there is no zygote to ask."""
    path = os.environ.get(ENV)
    if not path:
        return False
    request = {
        "python": _interpreter(),
        "argv": sys.argv,
        "env": dict(os.environ),
        "path": sys.path,
        "cwd": os.getcwd(),
    }
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(HAND_OVER_TIMEOUT_S)
            conn.connect(path)
            data = json.dumps(request).encode()
            sent = socket.send_fds(conn, [data], [0, 1, 2])
            conn.sendall(data[sent:])
            conn.shutdown(socket.SHUT_WR)
            pid = int(_read_all(conn) or b"0")
    except (OSError, ValueError):
        return False
    if pid <= 0:
        return False
    _stand_in(pid)
    return True


def _stand_in(pid: int) -> None:
    """The JVM signals and watches this process: pass SIGTERM on, live as long as ``pid``."""

    def forward(signum, _frame) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    while True:
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            return  # gone (PermissionError: the pid was reused by another user's process)
        time.sleep(0.1)


def _interpreter() -> list:
    """Which Python this is: a daemon of another interpreter must not become this one."""
    return [os.path.realpath(sys.executable), sys.prefix, list(sys.version_info)]


def _read_all(conn: socket.socket) -> bytes:
    parts = []
    while chunk := conn.recv(4096):
        parts.append(chunk)
    return b"".join(parts)


# --- the zygote ----------------------------------------------------------------------------------


def _serve(path: str, parent: int) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)  # first: a daemon that asks early waits for the imports below
    listener.listen(1)
    from sparkbeam.runner.spark import daemon

    daemon.preload()
    listener.settimeout(0.5)
    deadline = time.monotonic() + IDLE_S
    conn = None
    while conn is None:
        if os.getppid() != parent or time.monotonic() > deadline:
            return  # the driver is gone, or its JVM started a daemon without us
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
    conn.settimeout(HAND_OVER_TIMEOUT_S)
    message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    request = json.loads(message + _read_all(conn))  # the daemon shut its end after sending
    if request.get("python") != _interpreter():  # spark.pyspark.python names another one
        for fd in fds:
            os.close(fd)
        conn.sendall(b"0")  # the daemon serves itself
        return
    pid = os.fork()
    if pid == 0:
        listener.close()
        conn.close()
        _become_daemon(request, fds)  # never returns
    for fd in fds:
        os.close(fd)
    conn.sendall(str(pid).encode())
    conn.close()


def _become_daemon(request: dict, fds: list[int]) -> None:
    code = 1
    try:
        # As a daemon the JVM launched: PySpark starts the JVM with SIGINT ignored (Ctrl-C is
        # the driver's to handle), and a launched process inherits that.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv[:] = request["argv"]
        sys.path[:] = request["path"]
        from sparkbeam.runner.spark import daemon

        daemon.serve()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        os._exit(code)


def _main(argv: list[str]) -> None:
    path, parent = argv[0], int(argv[1])
    try:
        _serve(path, parent)
    finally:
        _remove(path)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # nothing to finalize: a Beam-laden interpreter's shutdown only costs time


if __name__ == "__main__":
    _main(sys.argv[1:])

"""The store's write lock: one job writes a store at a time.

Owns: the lock file ``_LOCK.json`` in the store root (host, pid, job name, time, a random
token), taking it, detecting a stale lock left by a dead process on this host, and releasing it.
Leaves to others: what the lock protects (`store`). Readers (``checkpoints list``/``show``/
``verify``) never take it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid

from sparkbeam.checkpoint.errors import StoreLockedError
from sparkbeam.checkpoint.filesystem import Storage

LOCK_FILE = "_LOCK.json"
log = logging.getLogger(__name__)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class StoreLock:
    """A held lock; `release` deletes the lock file if it is still ours."""

    def __init__(self, storage: Storage, job_name: str):
        self.storage = storage
        self.holder = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "job_name": job_name,
            "created": time.time(),
            "created_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "token": uuid.uuid4().hex,
        }
        self.held = False

    def acquire(self, break_lock: bool = False) -> None:
        """Take the lock or raise `StoreLockedError` naming the holder.

        A lock whose holder is a dead process on this host is stale and taken over with a
        warning; ``break_lock=True`` takes over any lock (use only when the holder is gone).
        """
        data = json.dumps(self.holder).encode()
        for _ in range(3):
            if self.storage.create_exclusive(LOCK_FILE, data):
                break
            current = read_lock(self.storage)
            if current is None:
                continue  # released meanwhile, or unreadable: try again
            stale = (
                current.get("host") == self.holder["host"]
                and isinstance(current.get("pid"), int)
                and current["pid"] != os.getpid()
                and not _pid_alive(current["pid"])
            )
            if not (stale or break_lock):
                raise StoreLockedError(self.storage.url, current)
            log.warning(
                "Taking over the lock of checkpoint store %r from %s job %r (pid %r on %r).",
                self.storage.url,
                "dead" if stale else "forcibly broken",
                current.get("job_name"),
                current.get("pid"),
                current.get("host"),
            )
            self.storage.delete(LOCK_FILE)
        else:
            raise StoreLockedError(self.storage.url, read_lock(self.storage) or {})
        if (read_lock(self.storage) or {}).get("token") != self.holder["token"]:
            raise StoreLockedError(self.storage.url, read_lock(self.storage) or {})
        self.held = True

    def release(self) -> None:
        if self.held and (read_lock(self.storage) or {}).get("token") == self.holder["token"]:
            self.storage.delete(LOCK_FILE)
        self.held = False


def read_lock(storage: Storage) -> dict | None:
    """The current holder, or None if the store is not locked (or the file is unreadable)."""
    try:
        d = json.loads(storage.read(LOCK_FILE))
    except (FileNotFoundError, ValueError):
        return None
    return d if isinstance(d, dict) else None

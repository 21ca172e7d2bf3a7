"""The store's write lock: one job writes a store at a time.

Owns: the lock file ``_LOCK.json`` in the store root (host, pid, job name, time, a random
token), taking it over from a dead process on this host, treating an unreadable one (empty or
garbage: a crash on a backend without atomic create) as held by an unknown holder, and
releasing it. Leaves to others: what it protects (`store`). Readers never take it.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import time
import uuid

from sparkbeam.checkpoint.errors import StoreAccessError, StoreLockedError
from sparkbeam.checkpoint.filesystem import Storage

LOCK_FILE = "_LOCK.json"
UNREADABLE = object()
"""`_read_holder`'s answer for an empty or garbage lock file: a lock of an unknown holder."""
_ATTEMPTS = 3
_UNREADABLE_WAIT_S = 0.2
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

    def _create(self, data: bytes) -> bool:
        """Create the lock file exclusively; a store nobody may write is one line, not a trace."""
        try:
            return self.storage.create_exclusive(LOCK_FILE, data)
        except (PermissionError, IsADirectoryError, NotADirectoryError) as e:
            reason = e.strerror or type(e).__name__
        except OSError as e:
            if e.errno != errno.EROFS or isinstance(e, StoreAccessError):
                raise
            reason = e.strerror or type(e).__name__
        raise StoreAccessError(
            f"Checkpoint store {self.storage.url!r} cannot be written ({reason}, taking its lock "
            f"{LOCK_FILE!r}): a job writes checkpoints there. Give a --checkpoint_dir this user "
            "may write, or read it with `sparkbeam checkpoints list|show|verify` (no lock)."
        )

    def acquire(self, break_lock: bool = False) -> None:
        """Take the lock or raise `StoreLockedError` naming the holder. A dead process's on
        this host is taken over with a warning; ``break_lock=True`` takes over any, even an
        unreadable one (use it only when the holder is gone)."""
        data = json.dumps(self.holder).encode()
        for attempt in range(_ATTEMPTS):
            if self._create(data):
                break
            current = _read_holder(self.storage)
            if current is None:
                continue  # released meanwhile: try again
            if current is UNREADABLE and not break_lock:
                if attempt < _ATTEMPTS - 1:
                    time.sleep(_UNREADABLE_WAIT_S)  # a backend without atomic create
                    continue
                raise StoreLockedError(self.storage.url, {}, unreadable=LOCK_FILE)
            holder: dict = current if isinstance(current, dict) else {}
            if not (self._stale(holder) or break_lock):
                raise StoreLockedError(self.storage.url, holder)
            log.warning(
                "Taking over the lock of checkpoint store %r from %s job %r (pid %r on %r).",
                self.storage.url,
                "dead" if self._stale(holder) else "forcibly broken",
                holder.get("job_name"),
                holder.get("pid"),
                holder.get("host"),
            )
            self.storage.delete(LOCK_FILE)
        # Ours, unless every attempt failed or another job took it over meanwhile.
        now = read_lock(self.storage) or {}
        if now.get("token") != self.holder["token"]:
            raise StoreLockedError(self.storage.url, now)
        self.held = True

    def _stale(self, holder: dict) -> bool:
        """The holder is a dead process on this host."""
        return (
            holder.get("host") == self.holder["host"]
            and isinstance(holder.get("pid"), int)
            and holder["pid"] != os.getpid()
            and not _pid_alive(holder["pid"])
        )

    def release(self) -> None:
        if self.held and (read_lock(self.storage) or {}).get("token") == self.holder["token"]:
            self.storage.delete(LOCK_FILE)
        self.held = False


def read_lock(storage: Storage) -> dict | None:
    """The current holder, or None if the store is not locked (or the file is unreadable)."""
    holder = _read_holder(storage)
    return holder if isinstance(holder, dict) else None


def _read_holder(storage: Storage) -> dict | None | object:
    """The holder, None if there is no lock file, `UNREADABLE` if it is empty or garbage."""
    try:
        d = json.loads(storage.read(LOCK_FILE))
    except FileNotFoundError:
        return None
    except ValueError:  # empty, torn, not UTF-8 or not JSON
        return UNREADABLE
    return d if isinstance(d, dict) else UNREADABLE

"""What the object-store backends share: one request per storage call, one client per process.

Owns: `ObjectStorage`, the base of `S3Storage`, `GcsStorage` and `AzureStorage`: the URL as a
bucket (or container) and a key prefix, each `Storage` call as one request of the backend's
(`_get`, `_put`, `_keys`, `_remove`, `_stat`), and backend errors made one `StoreAccessError`
line (the backend's `explain`); `client_for`: one client per kind for this process's
``FileSystems`` options. Leaves to the backends the requests and what each cloud's errors mean.

Object stores have no directories, no rename and no partial writes: an upload appears whole, so
a write goes straight to its final key, and the cloud's conditional create, atomic on the
server, backs the store's lock and its write-once manifests.

A wrong endpoint fails within seconds: until an endpoint has answered a request of this process
(`first_contact`), a refused connection or an unknown host (`connection_failure`) is retried
over 3.5 s, not waited out by the client's own retries (GCS 120 s, Azure 90 s); after that it is
a transient fault under the client's policy.
"""

from __future__ import annotations

import functools
import os
import socket
import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Iterable
from typing import Any

from sparkbeam.checkpoint.errors import StoreAccessError
from sparkbeam.checkpoint.filesystem import FileSystemsStorage

_LOCK = threading.Lock()
_CLIENTS: dict[str, tuple[tuple, Any]] = {}  # kind -> ((FileSystems options, env values), client)
_ANSWERED: set[str] = set()  # the endpoints that answered a request of this process
FIRST_CONTACT_PAUSES = (0.5, 1.0, 2.0)
"""Pauses between attempts of a call refused at first contact (`ObjectStorage.first_contact`)."""


def client_for(kind: str, build: Callable[[Any], Any], env: tuple[str, ...] = ()) -> Any:
    """The ``kind`` client for the ``FileSystems`` options Beam's own filesystems use here,
    built by ``build(options)`` once per options and values of the environment ``env``."""
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    options = FileSystems._pipeline_options
    key = (options, tuple(os.environ.get(name) for name in env))
    with _LOCK:
        cached = _CLIENTS.get(kind)
        if cached is None or cached[0][0] is not options or cached[0][1] != key[1]:
            cached = _CLIENTS[kind] = (key, build(options or PipelineOptions([])))
        return cached[1]


def connection_failure(error: BaseException) -> str | None:
    """Why no server was reached ("connection refused", "host not found"), if ``error`` of any
    client says so at any depth; else None (a reset, a timeout, a temporary DNS failure)."""
    seen: set[int] = set()
    todo: list[Any] = [error]
    while todo:
        e = todo.pop()
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, ConnectionRefusedError):
            return "connection refused"
        if isinstance(e, socket.gaierror) and e.errno == socket.EAI_NONAME:
            return "host not found"
        todo += [e.__cause__, e.__context__, *e.args]
        todo += [getattr(e, a, None) for a in ("reason", "cause", "inner_exception")]
    return None


def _explained(method):
    """A backend error of ``method`` as `StoreAccessError` if `ObjectStorage.explain` explains
    it; at first contact a refused connection is tried again after `FIRST_CONTACT_PAUSES`."""

    @functools.wraps(method)
    def explained(self, *args, **kwargs):
        pauses = iter(FIRST_CONTACT_PAUSES)
        try:
            while True:
                try:
                    result = method(self, *args, **kwargs)
                except (StoreAccessError, ImportError):
                    raise
                except Exception as e:
                    if connection_failure(e) is None:
                        self.answered()
                    elif self.first_contact() and (pause := next(pauses, None)) is not None:
                        time.sleep(pause)
                        continue
                    raise
                self.answered()
                return result
        except StoreAccessError:
            raise
        except ImportError as e:  # the cloud's client library
            raise StoreAccessError(
                f"Checkpoint store {self.url!r} needs the Python package of module {e.name!r}, "
                f"which is not installed: pip install 'sparkbeam[{self.extra}]'."
            ) from e
        except Exception as e:
            what = self.explain(e)
            if what is None:
                raise
            raise self.access_error(what) from e

    return explained


class ObjectStorage(FileSystemsStorage):
    """``scheme://bucket/prefix``; each call is one request (a listing, one per 1000 keys).
    ``retry=False`` makes the cloud's client fail at the first error (tests)."""

    service = ""
    """The cloud's name in messages ("S3", "GCS", "Azure Blob")."""
    extra = ""
    """sparkbeam's extra that installs the cloud's client ("aws", "gcp", "azure")."""
    bucket: str
    """The bucket (Azure: the container)."""
    prefix: str
    """The key prefix under it ('' for the whole bucket)."""

    def __init__(self, url: str, retry: bool = True):
        super().__init__(url)
        self.bucket, _, self.prefix = self.url.split("://", 1)[1].partition("/")
        if not self.bucket:
            raise ValueError(
                f"Checkpoint store URL {url!r} names no bucket; use {self.scheme}://bucket/dir."
            )
        self.retry = retry

    # The backend: one request each.
    @abstractmethod
    def _get(self, key: str, span: tuple[int, int] | None) -> bytes | None:
        """The object, or its ``(offset, length)`` span (shorter at its end); None if absent."""

    @abstractmethod
    def _put(self, key: str, data: bytes, exclusive: bool) -> bool:
        """Upload ``data``; with ``exclusive`` only if the key is absent (False if not)."""

    @abstractmethod
    def _keys(self, prefix: str) -> Iterable[str]:
        """Every key that starts with ``prefix``."""

    @abstractmethod
    def _remove(self, key: str) -> None:
        """Delete the key; absent is no error."""

    @abstractmethod
    def _stat(self, key: str) -> tuple[int, float] | None:
        """(size, modification time) of the key, None if absent."""

    @abstractmethod
    def endpoint(self) -> str:
        """Where the client sends requests (for messages)."""

    @abstractmethod
    def explain(self, error: Exception) -> str | None:
        """What a client error means and what to set, or None if not about reaching the store."""

    quick_first_contact = False
    """No client retries of a refused connection at `first_contact` (GCS's, Azure's: minutes)."""

    def first_contact(self) -> bool:
        """Until the endpoint answers here, a refused connection likely means a wrong endpoint."""
        return self.quick_first_contact and self.retry and self.endpoint() not in _ANSWERED

    def answered(self) -> None:
        """The endpoint answered (or failed otherwise than by refusing the connection)."""
        if self.quick_first_contact and self.retry:
            _ANSWERED.add(self.endpoint())

    def access_error(self, what: str) -> StoreAccessError:
        """One line: the store, the endpoint, then ``what``."""
        where = f"Checkpoint store {self.url!r} ({self.service} endpoint {self.endpoint()!r})"
        return StoreAccessError(f"{where} {what}.")

    def _key(self, path: str) -> str:
        return "/".join(p for p in (self.prefix, path) if p)

    # The Storage interface.
    @_explained
    def _fetch(self, path: str, span: tuple[int, int] | None) -> bytes:
        data = self._get(self._key(path), span)
        if data is None:
            raise FileNotFoundError(self._path(path))
        return data

    def read(self, path: str) -> bytes:
        return self._fetch(path, None)

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """One ranged GET."""
        return self._fetch(path, (offset, length)) if length > 0 else b""

    @_explained
    def _write(self, path: str, data: bytes) -> None:
        self._put(self._key(path), data, exclusive=False)

    @_explained
    def create_exclusive(self, path: str, data: bytes) -> bool:
        if not self._put(self._key(path), data, exclusive=True):
            return False
        self.bytes_written += len(data)
        return True

    def write_new(self, path: str, data: bytes) -> None:
        """Exclusive on the server: of two writers of one manifest name, one fails."""
        if not self.create_exclusive(path, data):
            raise FileExistsError(f"{self._path(path)} exists; write-once names are never reused.")

    @_explained
    def list(self, prefix: str = "") -> list[str]:
        """By key prefix: nothing checks that a "directory" exists."""
        base = self._key(prefix.strip("/"))
        root = f"{self.prefix}/" if self.prefix else ""
        keys = self._keys(f"{base}/" if base else "")
        return sorted(k[len(root) :] for k in keys if not k.endswith("/"))

    @_explained
    def delete(self, path: str) -> None:
        self._remove(self._key(path))

    @_explained
    def _stat_or_none(self, path: str) -> tuple[int, float] | None:
        return self._stat(self._key(path))

    def _stat_of(self, path: str) -> tuple[int, float]:
        stat = self._stat_or_none(path)
        if stat is None:
            raise FileNotFoundError(self._path(path))
        return stat

    def exists(self, path: str) -> bool:
        return self._stat_or_none(path) is not None

    def size(self, path: str) -> int:
        return self._stat_of(path)[0]

    def mtime(self, path: str) -> float:
        return self._stat_of(path)[1]

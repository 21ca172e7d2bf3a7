"""Byte storage under one root URL: the only place the checkpoint store touches a filesystem.

Owns: the small `Storage` interface and its backends -- `LocalStorage` (plain paths,
``file://``), `MemoryStorage` (fast unit tests), `FileSystemsStorage` over Beam's
``FileSystems`` for any other scheme, and its object-store specializations (`object_storage`:
``s3://``, ``gs://``, ``azfs://``) -- picked by `open_storage(url)`. Leaves to others: file
formats, what is written when, and filesystem options (`filesystem_options`).

Paths are relative to the root and use ``/``. Writes are atomic for readers: local files go to
a synced temp name and are renamed; an object upload appears whole, so there a write goes
straight to its final name (object stores have no atomic rename and no directories). Data files
have unique names nothing reads until a manifest names them, and the manifest, written last,
has a write-once name (`Storage.write_new`).
"""

from __future__ import annotations

import errno
import os
import socket
import threading
import time
import uuid
from abc import ABC, abstractmethod

from sparkbeam.checkpoint.errors import CheckpointCorruptError
from sparkbeam.checkpoint.ids import FileEntry

TMP_PREFIX = ".tmp-"


class Storage(ABC):
    """Bytes under a root; see the module docstring for the atomicity contract."""

    url: str

    def __init__(self) -> None:
        self.bytes_written = 0
        """Total bytes written through this object (benchmarks and tests read it)."""

    @abstractmethod
    def read(self, path: str) -> bytes:
        """The whole file; `FileNotFoundError` if absent."""

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """``length`` bytes of ``path`` from ``offset`` (by default read from the whole file)."""
        return self.read(path)[offset : offset + length]

    @abstractmethod
    def _write(self, path: str, data: bytes) -> None: ...

    def write(self, path: str, data: bytes) -> None:
        """Replace ``path`` with ``data`` atomically (readers see old or new, never a mix)."""
        self._write(path, bytes(data))
        self.bytes_written += len(data)

    @abstractmethod
    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create ``path`` only if it does not exist; False if it does."""

    def write_new(self, path: str, data: bytes) -> None:
        """Write a file whose name is never reused (a manifest), atomically; `FileExistsError`
        if it exists: checked first, as the store's lock keeps writers apart (S3, GCS and Azure
        override it with their conditional create)."""
        if self.exists(path):
            raise FileExistsError(f"{self.url}/{path} exists; write-once names are never reused.")
        self.write(path, data)

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Sorted relative paths of all files under directory ``prefix`` (recursive)."""

    @abstractmethod
    def delete(self, path: str) -> None:
        """Remove a file; absent files are ignored."""

    @abstractmethod
    def exists(self, path: str) -> bool: ...

    @abstractmethod
    def size(self, path: str) -> int: ...

    @abstractmethod
    def mtime(self, path: str) -> float:
        """Last modification, seconds since the epoch."""


class LocalStorage(Storage):
    """A local directory; writes are temp file + fsync + rename + directory fsync, and
    `create_exclusive` hard-links a synced temp file, so a crash cannot leave an empty lock
    file. `delete` removes the directories it empties (not the root) so per-round ones do not
    pile up; writers recreate one a concurrent delete removed."""

    def __init__(self, root: str):
        super().__init__()
        if root.startswith("file://"):
            root = root[len("file://") :]
        self.root = os.path.abspath(root)
        self.url = self.root
        os.makedirs(self.root, exist_ok=True)

    def _path(self, path: str) -> str:
        return os.path.join(self.root, *path.split("/"))

    def read(self, path: str) -> bytes:
        with open(self._path(path), "rb") as f:
            return f.read()

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        with open(self._path(path), "rb") as f:
            f.seek(offset)
            return f.read(length)

    def _temp(self, directory: str, data: bytes) -> str:
        """A synced temp file holding ``data`` in ``directory`` (created if needed)."""
        for attempt in range(_DIR_RETRIES):
            os.makedirs(directory, exist_ok=True)
            tmp = os.path.join(directory, f"{TMP_PREFIX}{uuid.uuid4().hex}")
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                break
            except FileNotFoundError:  # a concurrent delete removed the empty directory
                if attempt == _DIR_RETRIES - 1:
                    raise
        _write_all(fd, data, tmp)
        return tmp

    def _write(self, path: str, data: bytes) -> None:
        final = self._path(path)
        tmp = self._temp(os.path.dirname(final), data)
        try:
            os.replace(tmp, final)
        except BaseException:
            _unlink(tmp)
            raise
        _fsync_dir(os.path.dirname(final))

    def create_exclusive(self, path: str, data: bytes) -> bool:
        final = self._path(path)
        directory = os.path.dirname(final)
        tmp = self._temp(directory, data)
        try:
            os.link(tmp, final)
        except FileExistsError:
            return False
        except OSError as e:  # a filesystem without hard links: exclusive create + write
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                raise
            return self._create_unlinked(final, data)
        finally:
            _unlink(tmp)
        _fsync_dir(directory)
        self.bytes_written += len(data)
        return True

    def _create_unlinked(self, final: str, data: bytes) -> bool:
        try:
            fd = os.open(final, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        _write_all(fd, data, final)
        self.bytes_written += len(data)
        return True

    def list(self, prefix: str = "") -> list[str]:
        base = self._path(prefix) if prefix else self.root
        out = []
        for dirpath, _dirs, files in os.walk(base):
            rel = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
            for name in files:
                out.append(name if rel == "." else f"{rel}/{name}")
        return sorted(out)

    def delete(self, path: str) -> None:
        full = self._path(path)
        try:
            os.remove(full)
        except FileNotFoundError:
            return
        directory = os.path.dirname(full)
        while directory.startswith(self.root + os.sep):
            try:
                os.rmdir(directory)
            except FileNotFoundError:
                pass  # removed meanwhile: go on with its parent
            except OSError:
                return  # not empty
            directory = os.path.dirname(directory)

    def exists(self, path: str) -> bool:
        return os.path.isfile(self._path(path))

    def size(self, path: str) -> int:
        return os.path.getsize(self._path(path))

    def mtime(self, path: str) -> float:
        return os.path.getmtime(self._path(path))


_DIR_RETRIES = 5


def _unlink(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _write_all(fd: int, data: bytes, path: str) -> None:
    """All of ``data`` (``os.write`` may take part of it), synced, then closed; on any failure
    ``path`` is removed: a half-written file must not stay under its name."""
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        _unlink(path)
        raise


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


class MemoryStorage(Storage):
    """Files in a dict, for fast unit tests. ``memory://name`` URLs share one dict per name."""

    _shared: dict[str, dict[str, tuple[bytes, float]]] = {}
    _shared_lock = threading.Lock()

    def __init__(self, name: str | None = None):
        super().__init__()
        name = name or uuid.uuid4().hex
        self.url = f"memory://{name}"
        with self._shared_lock:
            self._files = self._shared.setdefault(name, {})
        self._lock = threading.Lock()

    def _file(self, path: str) -> tuple[bytes, float]:
        try:
            return self._files[path]
        except KeyError:
            raise FileNotFoundError(f"{self.url}/{path}") from None

    def read(self, path: str) -> bytes:
        return self._file(path)[0]

    def _write(self, path: str, data: bytes) -> None:
        with self._lock:
            self._files[path] = (data, time.time())

    def create_exclusive(self, path: str, data: bytes) -> bool:
        with self._lock:
            if path in self._files:
                return False
            self._files[path] = (bytes(data), time.time())
        self.bytes_written += len(data)
        return True

    def list(self, prefix: str = "") -> list[str]:
        p = prefix.rstrip("/") + "/" if prefix else ""
        return sorted(k for k in list(self._files) if k.startswith(p))

    def delete(self, path: str) -> None:
        with self._lock:
            self._files.pop(path, None)

    def exists(self, path: str) -> bool:
        return path in self._files

    def size(self, path: str) -> int:
        return len(self.read(path))

    def mtime(self, path: str) -> float:
        return self._file(path)[1]


OBJECT_STORE_SCHEMES = frozenset({"s3", "gs", "azfs"})
"""Schemes without directories whose uploads appear whole: written in place, listed by prefix."""


class FileSystemsStorage(Storage):
    """Any scheme Beam's ``FileSystems`` reaches (``hdfs://``, ...), Beam imported lazily. On
    object stores a write is one upload to the final name, elsewhere a unique temp name
    renamed. `create_exclusive` checks, then writes: the store's lock makes that safe."""

    def __init__(self, url: str):
        super().__init__()
        self.url = url.rstrip("/")
        self.scheme = self.url.split("://", 1)[0] if "://" in self.url else "file"
        self.object_store = self.scheme in OBJECT_STORE_SCHEMES

    def _fs(self):
        from apache_beam.io.filesystems import FileSystems

        return FileSystems

    def _path(self, path: str) -> str:
        return f"{self.url}/{path}" if path else self.url

    def read(self, path: str) -> bytes:
        if not self.object_store and not self.exists(path):
            raise FileNotFoundError(self._path(path))
        return self.read_range(path, 0, -1)

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """A seek on Beam's file (an object store's: a ranged GET); ``length`` -1: to the end."""
        full = self._path(path)
        try:
            with self._fs().open(full, compression_type="uncompressed") as f:
                f.seek(offset)
                return f.read(length)
        except Exception:
            if not self._fs().exists(full):
                raise FileNotFoundError(full) from None
            raise

    def _write(self, path: str, data: bytes) -> None:
        fs = self._fs()
        final = self._path(path)
        if self.object_store:
            with fs.create(final, compression_type="uncompressed") as f:
                f.write(data)
            return
        directory, name = final.rsplit("/", 1)
        tmp = f"{directory}/{TMP_PREFIX}{name}-{socket.gethostname()}-{uuid.uuid4().hex}"
        if not fs.exists(directory):
            fs.mkdirs(directory)
        with fs.create(tmp, compression_type="uncompressed") as f:
            f.write(data)
        if fs.exists(final):
            fs.delete([final])
        fs.rename([tmp], [final])

    def create_exclusive(self, path: str, data: bytes) -> bool:
        if self.exists(path):
            return False
        self.write(path, data)
        return True

    def list(self, prefix: str = "") -> list[str]:
        from apache_beam.io.filesystem import BeamIOError

        fs = self._fs()
        base = self._path(prefix.strip("/")).rstrip("/")
        if not self.object_store and not fs.exists(base):
            return []
        try:
            result = fs.match([f"{base}/**"])[0]
        except BeamIOError:
            return []  # nothing under the prefix, on filesystems that say so with an error
        root = self.url + "/"
        return sorted(m.path[len(root) :] for m in result.metadata_list if m.path.startswith(root))

    def delete(self, path: str) -> None:
        fs = self._fs()
        full = self._path(path)
        if fs.exists(full):
            fs.delete([full])

    def exists(self, path: str) -> bool:
        return bool(self._fs().exists(self._path(path)))

    def size(self, path: str) -> int:
        return int(self._fs().match([self._path(path)])[0].metadata_list[0].size_in_bytes)

    def mtime(self, path: str) -> float:
        return float(self._fs().last_updated(self._path(path)))


OBJECT_BACKENDS = {
    "s3": ("sparkbeam.checkpoint.s3_storage", "S3Storage"),
    "gs": ("sparkbeam.checkpoint.gcs_storage", "GcsStorage"),
    "azfs": ("sparkbeam.checkpoint.azure_storage", "AzureStorage"),
}
"""Scheme -> (module, class) of the object stores' own backends (one request per call)."""


def open_storage(url: str | Storage) -> Storage:
    """The storage for ``url``: local for paths and ``file://``, memory for ``memory://``, an
    object store's own backend (`OBJECT_BACKENDS`), else `FileSystemsStorage`."""
    if isinstance(url, Storage):
        return url
    if url.startswith("memory://"):
        return MemoryStorage(url[len("memory://") :] or None)
    if "://" not in url or url.startswith("file://"):
        return LocalStorage(url)
    backend = OBJECT_BACKENDS.get(url.split("://", 1)[0])
    if backend is not None:
        import importlib

        module, name = backend
        return getattr(importlib.import_module(module), name)(url)
    return FileSystemsStorage(url)


def checksum(data: bytes) -> str:
    """The checksum recorded for every file: ``crc32:`` + 8 hex digits."""
    import zlib

    return "crc32:%08x" % (zlib.crc32(data) & 0xFFFFFFFF)


def read_checked(storage: Storage, path: str, expected: FileEntry | None = None) -> bytes:
    """The bytes of ``path``, checked against the size and checksum of its entry ``expected``
    (if given); raises `CheckpointCorruptError` naming ``path`` if it is missing or differs."""
    try:
        data = storage.read(path)
    except FileNotFoundError:
        raise CheckpointCorruptError(path, "file is missing") from None
    if expected is not None:
        if len(data) != expected.size:
            raise CheckpointCorruptError(
                path, f"size is {len(data)} bytes, the manifest says {expected.size}"
            )
        actual = checksum(data)
        if actual != expected.checksum:
            raise CheckpointCorruptError(
                path, f"checksum {actual} does not match the manifest's {expected.checksum}"
            )
    return data

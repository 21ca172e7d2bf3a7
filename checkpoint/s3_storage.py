"""The store on ``s3://``: one S3 request per storage call, and a real exclusive create.

Owns: `S3Storage`, the `FileSystemsStorage` for ``s3://bucket/prefix`` URLs. It talks to S3
through the boto3 client inside Beam's own S3 client wrapper
(``apache_beam.io.aws.clients.s3.boto3_client.Client``), built from the same options as Beam's
``FileSystems`` in this process (``FileSystems.set_options``; unset values come from boto3's
environment: ``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL_S3``, roles, ...). Leaves to others: the
file formats and the commit protocol (the store), and the options (``filesystem_options``).

Why not Beam's ``S3FileSystem`` calls: they build a client per call, upload with a three-request
multipart upload, read with a HEAD before the GET, rename by copy + delete, and offer no
conditional write. Here:

- ``write`` is one ``PutObject`` to the final key. S3 makes an object visible whole when its
  PUT completes (and gives read-after-write consistency), so no temp name and no rename. A
  single PUT holds up to 5 GiB, far above any segment, snapshot or manifest.
- ``create_exclusive`` and ``write_new`` are one ``PutObject`` with ``IfNoneMatch='*'``: S3
  refuses it (412) if the key exists, atomically -- the store's lock and its write-once
  manifests rely on that. A store that does not support conditional writes (501) falls back
  to check-then-write, with a warning.
- ``list`` is ``ListObjectsV2`` under the key prefix (a page per 1000 keys): S3 has no
  directories, so nothing checks that a "directory" exists first.
- ``read`` is one ``GetObject``; ``delete`` one ``DeleteObject`` (deleting a missing key is
  not an error in S3).
"""

from __future__ import annotations

import functools
import logging
import threading

from sparkbeam.checkpoint.filesystem import FileSystemsStorage

log = logging.getLogger(__name__)

_CLIENT_LOCK = threading.Lock()
_CLIENT: tuple[object, object] | None = None  # (the FileSystems options it was built from, client)


def s3_client():
    """The boto3 S3 client for this process's ``FileSystems`` options (one per options)."""
    global _CLIENT
    from apache_beam.io.aws.clients.s3 import boto3_client
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    options = FileSystems._pipeline_options
    with _CLIENT_LOCK:
        if _CLIENT is None or _CLIENT[0] is not options:
            wrapper = boto3_client.Client(options=options or PipelineOptions([]))
            _CLIENT = (options, wrapper.client)
        return _CLIENT[1]


def explained(storage: S3Storage, error: Exception) -> Exception:
    """A botocore error as one line naming the store, the endpoint and what to set; other
    errors unchanged. The store's first request (its lock) meets these first."""
    from botocore.exceptions import (
        ClientError,
        EndpointConnectionError,
        NoCredentialsError,
        PartialCredentialsError,
    )

    from sparkbeam.checkpoint.errors import StoreAccessError

    client = s3_client()
    endpoint = getattr(client.meta, "endpoint_url", None) or "AWS's default"
    where = f"Checkpoint store {storage.url!r} (S3 endpoint {endpoint!r})"
    if isinstance(error, EndpointConnectionError):
        what = (
            "cannot connect to the S3 endpoint; set the right one with --s3_endpoint_url (or "
            "AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL)"
        )
    elif isinstance(error, (NoCredentialsError, PartialCredentialsError)):
        what = (
            "has no AWS credentials; pass --s3_access_key_id and --s3_secret_access_key (or set "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)"
        )
    elif isinstance(error, ClientError) and _code(error) == "NoSuchBucket":
        what = (
            f"names bucket {storage.bucket!r}, which does not exist there; create it, or fix the "
            "bucket in --checkpoint_dir (or --s3_endpoint_url if it is on another endpoint)"
        )
    elif isinstance(error, ClientError) and _status(error) in (401, 403):
        what = (
            f"refused the request ({_code(error) or _status(error)}): the credentials may not "
            f"read and write bucket {storage.bucket!r}; check --s3_access_key_id and "
            "--s3_secret_access_key (or AWS_ACCESS_KEY_ID / AWS_PROFILE) and the bucket's policy"
        )
    else:
        return error
    return StoreAccessError(f"{where} {what}.")


def _explain(method):
    """Raise `explained` errors from one S3 call of the storage."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Exception as e:
            error = explained(self, e)
            if error is e:
                raise
            raise error from e

    return call


def _code(error) -> str:
    response = getattr(error, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def _status(error) -> int:
    response = getattr(error, "response", None) or {}
    return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


class S3Storage(FileSystemsStorage):
    """``s3://bucket/prefix``; see the module docstring for what each call costs. A wrong
    endpoint, missing credentials or bucket, or a refused request raise `StoreAccessError`
    (one line, `explained`)."""

    def __init__(self, url: str):
        super().__init__(url)
        rest = self.url[len("s3://") :]
        self.bucket, _, self.prefix = rest.partition("/")
        if not self.bucket:
            raise ValueError(f"Checkpoint store URL {url!r} names no bucket; use s3://bucket/dir.")
        self._conditional = True  # False once the server said it cannot do conditional writes

    def _key(self, path: str) -> str:
        return "/".join(p for p in (self.prefix, path) if p)

    @_explain
    def read(self, path: str) -> bytes:
        from botocore.exceptions import ClientError

        try:
            response = s3_client().get_object(Bucket=self.bucket, Key=self._key(path))
        except ClientError as e:
            if _code(e) in ("NoSuchKey", "404") or _status(e) == 404:
                raise FileNotFoundError(self._path(path)) from None
            raise
        return response["Body"].read()

    @_explain
    def _write(self, path: str, data: bytes) -> None:
        s3_client().put_object(Bucket=self.bucket, Key=self._key(path), Body=data)

    @_explain
    def create_exclusive(self, path: str, data: bytes) -> bool:
        from botocore.exceptions import ClientError

        if not self._conditional:
            return super().create_exclusive(path, data)
        try:
            s3_client().put_object(
                Bucket=self.bucket, Key=self._key(path), Body=data, IfNoneMatch="*"
            )
        except ClientError as e:
            if _status(e) in (409, 412):  # exists / a concurrent conditional write won
                return False
            if _status(e) == 501 or _code(e) == "NotImplemented":
                log.warning(
                    "S3 endpoint of %r does not support conditional writes (IfNoneMatch); "
                    "the store lock and manifest commits fall back to check-then-write.",
                    self.url,
                )
                self._conditional = False
                return super().create_exclusive(path, data)
            raise
        self.bytes_written += len(data)
        return True

    def write_new(self, path: str, data: bytes) -> None:
        if not self.create_exclusive(path, data):
            raise FileExistsError(f"{self._path(path)} exists; write-once names are never reused.")

    @_explain
    def list(self, prefix: str = "") -> list[str]:
        base = self._key(prefix.strip("/"))
        start = f"{base}/" if base else ""
        root = f"{self.prefix}/" if self.prefix else ""
        pages = (
            s3_client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=start)
        )
        keys = (o["Key"] for page in pages for o in page.get("Contents", ()))
        return sorted(k[len(root) :] for k in keys if not k.endswith("/"))

    @_explain
    def delete(self, path: str) -> None:
        s3_client().delete_object(Bucket=self.bucket, Key=self._key(path))

    @_explain
    def _head(self, path: str) -> dict | None:
        from botocore.exceptions import ClientError

        try:
            return s3_client().head_object(Bucket=self.bucket, Key=self._key(path))
        except ClientError as e:
            if _status(e) == 404 or _code(e) in ("404", "NoSuchKey", "NotFound"):
                return None
            raise

    def exists(self, path: str) -> bool:
        return self._head(path) is not None

    def _stat(self, path: str) -> dict:
        head = self._head(path)
        if head is None:
            raise FileNotFoundError(self._path(path))
        return head

    def size(self, path: str) -> int:
        return int(self._stat(path)["ContentLength"])

    def mtime(self, path: str) -> float:
        return self._stat(path)["LastModified"].timestamp()

"""The store on ``s3://``: one S3 request per storage call, and a real exclusive create.

Owns: `S3Storage`, the `ObjectStorage` for ``s3://bucket/prefix``, over the boto3 client inside
Beam's S3 client wrapper, built from this process's ``FileSystems`` options (unset values come
from boto3's environment: ``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL_S3``, roles, ...). Leaves to
others: file formats, the commit protocol and the options (``filesystem_options``).

Not Beam's ``S3FileSystem`` calls: they build a client per call, upload in three requests, read
with a HEAD first, rename by copy + delete and have no conditional write. Here a write is one
``PutObject`` to the final key (visible whole once complete; up to 5 GiB), ``create_exclusive``
one with ``IfNoneMatch='*'`` (S3 refuses it atomically, 412, if the key exists; a store without
conditional writes, 501, falls back to check-then-write with a warning), a read one
``GetObject`` (with a ``Range`` for a span), a listing ``ListObjectsV2`` under the key prefix.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from sparkbeam.checkpoint.object_storage import ObjectStorage, client_for

log = logging.getLogger(__name__)


def s3_client():
    """The boto3 S3 client for this process's ``FileSystems`` options (one per options)."""

    def build(options):
        from apache_beam.io.aws.clients.s3 import boto3_client

        return boto3_client.Client(options=options).client

    return client_for("s3", build)


def _code(error) -> str:
    response = getattr(error, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def _status(error) -> int:
    response = getattr(error, "response", None) or {}
    return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


class S3Storage(ObjectStorage):
    """``s3://bucket/prefix``; what a user can fix raises `StoreAccessError` (`explain`)."""

    service = "S3"
    extra = "aws"

    def __init__(self, url: str, retry: bool = True):
        super().__init__(url, retry)
        self._conditional = True  # False once the server said it cannot do conditional writes

    def endpoint(self) -> str:
        return getattr(s3_client().meta, "endpoint_url", None) or "AWS's default"

    def _get(self, key: str, span: tuple[int, int] | None) -> bytes | None:
        from botocore.exceptions import ClientError

        ranged = {} if span is None else {"Range": f"bytes={span[0]}-{sum(span) - 1}"}
        try:
            response = s3_client().get_object(Bucket=self.bucket, Key=key, **ranged)
        except ClientError as e:
            if _code(e) in ("NoSuchKey", "404") or _status(e) == 404:
                return None
            if _status(e) == 416:  # the range starts at or past the end
                return b""
            raise
        return response["Body"].read()

    def _put(self, key: str, data: bytes, exclusive: bool) -> bool:
        from botocore.exceptions import ClientError

        if not exclusive:
            s3_client().put_object(Bucket=self.bucket, Key=key, Body=data)
            return True
        if not self._conditional:
            return self._stat(key) is None and self._put(key, data, exclusive=False)
        try:
            s3_client().put_object(Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*")
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
                return self._put(key, data, exclusive=True)
            raise
        return True

    def _keys(self, prefix: str) -> Iterator[str]:
        pages = (
            s3_client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        )
        return (o["Key"] for page in pages for o in page.get("Contents", ()))

    def _remove(self, key: str) -> None:
        s3_client().delete_object(Bucket=self.bucket, Key=key)

    def _stat(self, key: str) -> tuple[int, float] | None:
        from botocore.exceptions import ClientError

        try:
            head = s3_client().head_object(Bucket=self.bucket, Key=key)
        except ClientError as e:
            if _status(e) == 404 or _code(e) in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        return int(head["ContentLength"]), head["LastModified"].timestamp()

    def explain(self, error: Exception) -> str | None:
        """A botocore error as what to set (the store's first request, its lock's, meets it)."""
        from botocore.exceptions import (
            ClientError,
            EndpointConnectionError,
            NoCredentialsError,
            PartialCredentialsError,
        )

        if isinstance(error, EndpointConnectionError):
            return (
                "cannot connect to the S3 endpoint; set the right one with --s3_endpoint_url (or "
                "AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL)"
            )
        if isinstance(error, (NoCredentialsError, PartialCredentialsError)):
            return (
                "has no AWS credentials; pass --s3_access_key_id and --s3_secret_access_key (or "
                "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)"
            )
        if isinstance(error, ClientError) and _code(error) == "NoSuchBucket":
            return (
                f"names bucket {self.bucket!r}, which does not exist there; create it, or fix the "
                "bucket in --checkpoint_dir (or --s3_endpoint_url if it is on another endpoint)"
            )
        if isinstance(error, ClientError) and _status(error) in (401, 403):
            return (
                f"refused the request ({_code(error) or _status(error)}): the credentials may not "
                f"read and write bucket {self.bucket!r}; check --s3_access_key_id and "
                "--s3_secret_access_key (or AWS_ACCESS_KEY_ID / AWS_PROFILE) and the bucket's "
                "policy"
            )
        return None

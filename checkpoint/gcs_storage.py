"""The store on ``gs://``: one GCS request per storage call, and a real exclusive create.

Owns: `GcsStorage`, the `ObjectStorage` for ``gs://bucket/prefix``, over the
google-cloud-storage client Beam's GCS filesystem builds (``gcsio.create_storage_client``:
Application Default Credentials, ``--impersonate_service_account``, ``--project``; it honours
``STORAGE_EMULATOR_HOST``), with Beam's retry policy (``gcsio_retry``; at first contact without
retries of a refused connection). Leaves to others: file formats, the commit protocol and the
options (``filesystem_options``).

Not Beam's ``GCSFileSystem`` calls: they build a client per call, fetch metadata before a read,
rename by rewrite + delete and have no conditional write. Here a write is one upload to the
final name (its CRC32C checked by the server), ``create_exclusive`` one with
``ifGenerationMatch=0`` (GCS refuses it atomically, 412, if the object exists), a read one media
GET. An upload's or a listing's 404 can only mean the bucket is missing, and says so in one
line; a read's is a missing file.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from sparkbeam.checkpoint.object_storage import ObjectStorage, client_for, connection_failure

_CREDENTIALS_HELP = (
    "set GOOGLE_APPLICATION_CREDENTIALS to a key file or run `gcloud auth application-default "
    "login` (--impersonate_service_account acts as another account)"
)


def gcs_client():
    """Beam's google-cloud-storage client for this process's ``FileSystems`` options."""

    def build(options):
        from apache_beam.io.gcp import gcsio

        return gcsio.create_storage_client(options)

    return client_for("gcs", build, env=("STORAGE_EMULATOR_HOST",))


def _retry(first_contact: bool):
    """Beam's retry policy for GCS calls (google-cloud-storage's, with a throttling counter);
    at first contact, one that retries no refused connection (`ObjectStorage.first_contact`)."""
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.io.gcp import gcsio_retry
    from apache_beam.options.pipeline_options import PipelineOptions

    retry = gcsio_retry.get_retry(FileSystems._pipeline_options or PipelineOptions([]))
    if not first_contact:
        return retry
    retries = retry._predicate  # google-cloud-storage's: connection errors, 429, 5xx, ...
    return retry.with_predicate(lambda e: retries(e) and connection_failure(e) is None)


def _foreign(error: BaseException) -> str | None:
    """The status and content type of an HTTP error whose body is no JSON: GCS answers every
    error in JSON, so another service answered (a wrong port or host); else None."""
    from google.api_core.exceptions import GoogleAPICallError

    response: Any = getattr(error, "response", None)
    if not isinstance(error, GoogleAPICallError) or response is None:
        return None
    kind = response.headers.get("Content-Type") or "no content type"
    return None if "json" in kind else f"HTTP {response.status_code}, {kind}"


class GcsStorage(ObjectStorage):
    """``gs://bucket/prefix``; what a user can fix raises `StoreAccessError` (`explain`)."""

    service = "GCS"
    extra = "gcp"
    quick_first_contact = True

    def endpoint(self) -> str:
        try:
            client = gcs_client()
        except Exception:  # noqa: BLE001 - the client is what failed: say where it would go
            return os.environ.get("STORAGE_EMULATOR_HOST") or "Google's default"
        return getattr(client, "api_endpoint", None) or client._connection.API_BASE_URL

    def _calls(self) -> dict:
        return {"retry": _retry(self.first_contact()) if self.retry else None}

    def _blob(self, key: str):
        return gcs_client().bucket(self.bucket).blob(key)

    def _get(self, key: str, span: tuple[int, int] | None) -> bytes | None:
        from google.api_core.exceptions import NotFound, RequestRangeNotSatisfiable

        ranged = {} if span is None else {"start": span[0], "end": sum(span) - 1}
        try:
            return self._blob(key).download_as_bytes(**ranged, **self._calls())
        except NotFound:
            return None
        except RequestRangeNotSatisfiable:  # the range starts at or past the end
            return b""

    @contextlib.contextmanager
    def _in_bucket(self) -> Iterator[None]:
        """An upload's or a listing's 404 (GCS's, not a foreign service's): no bucket."""
        from google.api_core.exceptions import NotFound

        try:
            yield
        except NotFound as e:
            if _foreign(e):
                raise
            raise self.access_error(
                f"names bucket {self.bucket!r}, which does not exist there; create it, or fix "
                "the bucket in --checkpoint_dir"
            ) from None

    def _put(self, key: str, data: bytes, exclusive: bool) -> bool:
        from google.api_core.exceptions import PreconditionFailed

        condition = {"if_generation_match": 0} if exclusive else {}
        try:
            with self._in_bucket():
                self._blob(key).upload_from_string(
                    data, content_type="application/octet-stream", **condition, **self._calls()
                )
        except PreconditionFailed:  # it exists (or a concurrent create won)
            return False
        return True

    def _keys(self, prefix: str) -> Iterator[str]:
        blobs = gcs_client().list_blobs(self.bucket, prefix=prefix, **self._calls())
        with self._in_bucket():
            yield from (b.name for b in blobs)

    def _remove(self, key: str) -> None:
        from google.api_core.exceptions import NotFound

        try:
            self._blob(key).delete(**self._calls())
        except NotFound:
            pass

    def _stat(self, key: str) -> tuple[int, float] | None:
        blob = gcs_client().bucket(self.bucket).get_blob(key, **self._calls())
        return None if blob is None else (int(blob.size), blob.updated.timestamp())

    def explain(self, error: Exception) -> str | None:
        """A google-cloud-storage or google-auth error as what to set."""
        import requests
        from google.api_core.exceptions import Forbidden, RetryError, Unauthorized
        from google.auth.credentials import AnonymousCredentials
        from google.auth.exceptions import GoogleAuthError

        cause = error.cause if isinstance(error, RetryError) and error.cause else error
        answer = _foreign(cause)
        if answer:
            return (
                f"got an answer that is not GCS's ({answer}): another service listens there; "
                "check STORAGE_EMULATOR_HOST (set it only for an emulator)"
            )
        if isinstance(cause, requests.exceptions.ConnectionError):
            why = connection_failure(cause)
            return (
                f"cannot connect to the GCS endpoint{f' ({why})' if why else ''}; check the "
                "network, and STORAGE_EMULATOR_HOST (set it only for an emulator)"
            )
        if isinstance(cause, GoogleAuthError):
            said = cause.args[0] if cause.args and isinstance(cause.args[0], str) else str(cause)
            first = (said.strip().splitlines() or [type(cause).__name__])[0]
            return f"has no usable Google credentials ({first[:160]}); {_CREDENTIALS_HELP}"
        if isinstance(cause, (Unauthorized, Forbidden)):
            credentials = getattr(gcs_client(), "_credentials", None)
            who = "the credentials"
            if isinstance(credentials, AnonymousCredentials):
                who = "anonymous requests (Beam found no credentials)"
            return (
                f"refused the request ({cause.code}): {who} may not read and write bucket "
                f"{self.bucket!r}; {_CREDENTIALS_HELP}, with a role such as Storage Object "
                "Admin on the bucket"
            )
        return None

"""The store on ``azfs://``: one Azure Blob request per storage call, a real exclusive create.

Owns: `AzureStorage`, the `ObjectStorage` for ``azfs://account/container/prefix`` (Beam's form),
over the ``BlobServiceClient`` Beam's ``BlobStorageIO`` builds (``--azure_connection_string`` or
``AZURE_STORAGE_CONNECTION_STRING``, else ``--blob_service_endpoint`` with
``DefaultAzureCredential``), with the client's retry policy (at first contact without connect
retries). Leaves to others: file formats, the commit protocol and the options
(``filesystem_options``).

Beam's client serves one account: a URL of another account is refused here (Beam's filesystem
would write to the client's). Not Beam's ``BlobStorageFileSystem`` calls: they build a client
per call, upload through a temporary file, rename by copy + delete and have no conditional
write. Here a write is one Put Blob to the final name (its MD5 checked by the server),
``create_exclusive`` one with ``If-None-Match: *`` (Azure refuses it atomically, 409, if the blob
exists), a read one GET.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from sparkbeam.checkpoint.errors import first_line
from sparkbeam.checkpoint.object_storage import ObjectStorage, client_for, connection_failure

_ENDPOINT_FLAGS = (
    "--azure_connection_string (or AZURE_STORAGE_CONNECTION_STRING), or --blob_service_endpoint"
)


def azure_client():
    """Beam's ``BlobServiceClient`` for the ``FileSystems`` options; None if they name none."""

    def build(options):
        from apache_beam.io.azure import blobstorageio
        from apache_beam.options.pipeline_options import AzureOptions

        azure = options.view_as(AzureOptions)
        connection = azure.azure_connection_string or os.getenv("AZURE_STORAGE_CONNECTION_STRING")
        if not (connection or azure.blob_service_endpoint):
            return None
        return blobstorageio.BlobStorageIO(pipeline_options=options).client

    return client_for("azure", build, env=("AZURE_STORAGE_CONNECTION_STRING",))


def _code(error: Exception) -> str | None:
    """Azure's error code (``BlobNotFound``, ``ContainerNotFound``, ...) of an azure-core error."""
    code = getattr(error, "error_code", None)
    return getattr(code, "value", code)  # a StorageErrorCode is an enum of the code


def _foreign(error: Exception) -> bool:
    """An HTTP error without Azure Storage's ``x-ms-request-id``: another service answered."""
    response = getattr(error, "response", None)
    headers = getattr(response, "headers", None)
    return headers is not None and "x-ms-request-id" not in headers


class AzureStorage(ObjectStorage):
    """``azfs://account/container/prefix``; what a user can fix raises `StoreAccessError`."""

    service = "Azure Blob"
    extra = "azure"
    quick_first_contact = True

    def __init__(self, url: str, retry: bool = True):
        super().__init__(url, retry)
        account, _, rest = self.url.split("://", 1)[1].partition("/")
        container, _, prefix = rest.partition("/")
        self.account, self.bucket, self.prefix = account, container, prefix
        if not self.bucket:
            raise ValueError(
                f"Checkpoint store URL {url!r} names no container; use "
                "azfs://account/container/dir."
            )

    def endpoint(self) -> str:
        client = azure_client()
        return client.url if client is not None else "none set"

    def _calls(self) -> dict:
        """Per-call retry settings: none for tests; at first contact no connect retries (a
        refused connection: the policy's first is after 12-18 s; `ObjectStorage.first_contact`)."""
        if not self.retry:
            return {"retry_total": 0}
        return {"retry_connect": 0} if self.first_contact() else {}

    def _container(self):
        """The container's client; refuses options that name no account, or another one."""
        client = azure_client()
        if client is None:
            raise self.access_error(f"has no Azure Blob endpoint; pass {_ENDPOINT_FLAGS}")
        if client.account_name and client.account_name != self.account:
            raise self.access_error(
                f"names storage account {self.account!r}, but the Azure options are for account "
                f"{client.account_name!r}; fix the account in --checkpoint_dir, or "
                f"{_ENDPOINT_FLAGS}"
            )
        return client.get_container_client(self.bucket)

    def _get(self, key: str, span: tuple[int, int] | None) -> bytes | None:
        from azure.core.exceptions import HttpResponseError, ResourceNotFoundError

        offset, length = span or (None, None)
        try:
            stream = self._container().download_blob(
                key, offset=offset, length=length, **self._calls()
            )
            return stream.readall()
        except ResourceNotFoundError as e:
            if _code(e) == "BlobNotFound":
                return None
            raise
        except HttpResponseError as e:
            if e.status_code == 416:  # the range starts at or past the end
                return b""
            raise

    def _put(self, key: str, data: bytes, exclusive: bool) -> bool:
        from azure.core.exceptions import ResourceExistsError, ResourceModifiedError

        try:
            self._container().upload_blob(
                key, data, overwrite=not exclusive, validate_content=True, **self._calls()
            )
        except (ResourceExistsError, ResourceModifiedError):  # exists / a concurrent create won
            if not exclusive:
                raise
            return False
        return True

    def _keys(self, prefix: str) -> Iterator[str]:
        blobs = self._container().list_blobs(name_starts_with=prefix, **self._calls())
        return (b.name for b in blobs)

    def _remove(self, key: str) -> None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            self._container().delete_blob(key, **self._calls())
        except ResourceNotFoundError as e:
            if _code(e) != "BlobNotFound":
                raise

    def _stat(self, key: str) -> tuple[int, float] | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            props = self._container().get_blob_client(key).get_blob_properties(**self._calls())
        except ResourceNotFoundError as e:
            if _code(e) == "BlobNotFound":
                return None
            raise
        return int(props.size), props.last_modified.timestamp()

    def explain(self, error: Exception) -> str | None:
        """An azure-core error as what to set (the store's first request, its lock's, meets it)."""
        from azure.core.exceptions import (
            ClientAuthenticationError,
            HttpResponseError,
            ResourceNotFoundError,
            ServiceRequestError,
        )

        code = _code(error)
        if isinstance(error, ServiceRequestError):
            why = connection_failure(error)
            return (
                f"cannot connect to the Azure Blob endpoint{f' ({why})' if why else ''}; fix "
                f"{_ENDPOINT_FLAGS}"
            )
        if isinstance(error, ResourceNotFoundError) and code == "ContainerNotFound":
            return (
                f"names container {self.bucket!r}, which does not exist in account "
                f"{self.account!r}; create it, or fix the container in --checkpoint_dir"
            )
        status = getattr(error, "status_code", None)
        if _foreign(error) and not isinstance(error, ClientAuthenticationError):  # identity's
            return (
                f"got an answer that is not Azure Blob Storage's (HTTP {status} without "
                f"x-ms-request-id): another service listens there; fix {_ENDPOINT_FLAGS}"
            )
        if isinstance(error, ClientAuthenticationError) and status is None:
            first = first_line(error)
            return (
                f"has no usable Azure credentials ({first[:200]}); pass --azure_connection_string "
                "with the account key, or give DefaultAzureCredential an identity "
                "(--azure_managed_identity_client_id, AZURE_CLIENT_ID, ...)"
            )
        if isinstance(error, HttpResponseError) and status in (401, 403):
            return (
                f"refused the request ({code or status}): the credentials may not read and "
                f"write container {self.bucket!r}; check the account key in "
                "--azure_connection_string, or the identity's role on the container (Storage "
                "Blob Data Contributor)"
            )
        return None

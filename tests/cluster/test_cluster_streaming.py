"""Streaming on a real standalone cluster: a killed driver resumes from S3, a killed worker is
survived, and the operator CLI reads the S3 store.

The job is ``examples/streaming_recovery.py`` (offset SDF sources -> fixed-window counts ->
exactly-once files), run as its own driver process with ``--spark_master_url``. The output
files are on the local disk (one host: every executor reaches them); the checkpoint store of
the S3 tests is on the moto server, reached only through Beam's ``--s3_*`` flags (no AWS
environment variables), so the executors get the filesystem options from sparkbeam or not
at all. One driver kill and rerun serves the resume test and the CLI test.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from examples import streaming_recovery as example
from tests.cluster.drivers import (
    QUIET_CONF,
    Driver,
    python_driver,
    run_driver,
    start_driver,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

EXAMPLE = Path(__file__).parents[2] / "examples" / "streaming_recovery.py"
S3_SOURCES = "clicks:90,views:60"  # 15 a round: 6 rounds
CRASH_ROUND = 2  # SIGKILL right after round 2's checkpoint commits
WORKER_KILL_SOURCES = "clicks:180,views:120"  # 12 rounds: a worker dies around round 2


def _job(cluster, output: Path, sources: str, checkpoint_dir: str, *extra: str) -> list[str]:
    return [
        *python_driver(EXAMPLE),
        "--output", str(output), "--sources", sources, "--per_round", "15", "--delay_s", "0",
        "--runner=SparkCheckpointRunner", f"--spark_master_url={cluster.url}", "--streaming",
        f"--checkpoint_dir={checkpoint_dir}", "--checkpoint_interval_s=0.05", "--parallelism=2",
        *QUIET_CONF, *extra,
    ]  # fmt: skip


def _sources(text: str) -> list[tuple[str, int]]:
    return example.parse_sources(text)


def _s3_manifests(s3, prefix: str) -> dict[str, dict[int, int]]:
    """{pipeline: {checkpoint id: round}} from the manifests on S3 under ``prefix``."""
    from sparkbeam.checkpoint.manifest import decode_manifest

    found: dict[str, dict[int, int]] = {}
    for key in s3.keys(prefix + "/pipelines/"):
        if "/manifests/chk-" not in key or not key.endswith(".json"):
            continue
        body = s3.client().get_object(Bucket=s3.bucket, Key=key)["Body"].read()
        m = decode_manifest(body, key)
        found.setdefault(m.pipeline_id, {})[m.checkpoint_id] = int(m.metadata["round"])
    return found


@dataclass
class S3Recovery:
    """One job on an S3 store: killed after a commit, then rerun to its end."""

    store: str
    prefix: str
    output: Path
    killed: Driver
    at_kill: dict[str, dict[int, int]]
    partial: list[str]
    resumed: Driver | None  # None when the first run did not die by the kill (nothing to resume)
    at_end: dict[str, dict[int, int]]


# Session-scoped: one killed-and-resumed job for both tests, whatever order they run in.
@pytest.fixture(scope="session")
def s3_recovery(standalone_cluster, s3_server, tmp_path_factory) -> S3Recovery:
    standalone_cluster.ensure_workers()
    tmp = tmp_path_factory.mktemp("s3-recovery")
    prefix = f"cluster-recovery-{uuid.uuid4().hex[:8]}"
    store, output = s3_server.url(prefix), tmp / "out" / "counts"
    cmd = _job(standalone_cluster, output, S3_SOURCES, store, *s3_server.pipeline_flags())
    crash = {"SPARKBEAM_CRASH_AT": f"after-commit:{CRASH_ROUND}"}
    killed = run_driver(cmd, tmp, tmp / "logs", "killed", env=crash)
    at_kill = _s3_manifests(s3_server, prefix)
    partial = example.visible_lines(str(output))
    resumed = None
    if killed.proc.returncode == -signal.SIGKILL:
        resumed = run_driver(cmd, tmp, tmp / "logs", "resumed")
    at_end = _s3_manifests(s3_server, prefix)
    return S3Recovery(store, prefix, output, killed, at_kill, partial, resumed, at_end)


def test_killed_driver_resumes_from_s3_checkpoint(s3_recovery):
    """(d) SIGKILL after checkpoint N commits; the rerun goes on from N, output exact."""
    r = s3_recovery
    assert r.killed.proc.returncode == -signal.SIGKILL, r.killed.tail()
    assert r.at_kill, f"no checkpoint manifest on S3 under {r.store}\n{r.killed.tail()}"
    assert r.partial != example.expected_lines(_sources(S3_SOURCES))  # the kill interrupted it
    assert r.resumed is not None and r.resumed.proc.returncode == 0, r.resumed.tail()
    assert example.check(str(r.output), _sources(S3_SOURCES)) == ([], [])
    assert example.visible_lines(str(r.output)) == example.expected_lines(_sources(S3_SOURCES))
    for pipeline, before in r.at_kill.items():
        last = max(before)
        assert before[last] == CRASH_ROUND, before  # the kill came right after this commit
        after = {cid: rnd for cid, rnd in r.at_end[pipeline].items() if cid > last}
        assert after, f"the rerun committed no checkpoint after {last}: {r.at_end}"
        # Resumed, not restarted: checkpoint N + k holds round CRASH_ROUND + k (retention may
        # already have dropped N + 1; a restart from scratch would commit round 1 again).
        assert all(rnd == CRASH_ROUND + (cid - last) for cid, rnd in after.items()), after


def _cli(s3, *args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("sparkbeam")
    cmd = [str(exe), "checkpoints", *args, *s3.pipeline_flags(), "--json"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_cli_lists_and_verifies_the_s3_chain(s3_recovery, s3_server):
    """(f) ``sparkbeam checkpoints list|verify`` on the S3 store show the resumed chain."""
    r = s3_recovery
    assert r.resumed is not None and r.resumed.proc.returncode == 0, r.killed.tail()
    listed = _cli(s3_server, "list", f"--checkpoint_dir={r.store}")
    assert listed.returncode == 0, listed.stderr[-3000:]
    infos = json.loads(listed.stdout)
    by_pipeline: dict[str, list[int]] = {}
    for info in infos:
        assert info["error"] is None, info
        by_pipeline.setdefault(info["pipeline_id"], []).append(info["checkpoint_id"])
    assert {p: sorted(ids) for p, ids in by_pipeline.items()} == {
        p: sorted(chain) for p, chain in r.at_end.items()
    }
    for pipeline, ids in by_pipeline.items():
        assert max(ids) > max(r.at_kill[pipeline])  # the chain goes on past the kill
    verified = _cli(s3_server, "verify", f"--checkpoint_dir={r.store}")
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-3000:]
    results = json.loads(verified.stdout)
    assert results and all(v["ok"] for v in results), results
    assert sorted(v["checkpoint_id"] for v in results) == sorted(
        cid for chain in r.at_end.values() for cid in chain
    )


def _local_checkpoints(ckpt: Path) -> list[int]:
    return sorted(
        int(p.stem.removeprefix("chk-")) for p in ckpt.glob("pipelines/*/manifests/chk-*.json")
    )


def test_job_survives_a_killed_worker(cluster, tmp_path):
    """(e) SIGKILL one worker (with its executor) mid-run: the job ends exact on the other."""
    ckpt, output = tmp_path / "ckpt", tmp_path / "out" / "counts"
    sources = _sources(WORKER_KILL_SOURCES)
    # One host: the local store is shared by every executor, which the operator declares.
    cmd = _job(cluster, output, WORKER_KILL_SOURCES, str(ckpt), "--shared_filesystem")
    driver = start_driver(cmd, tmp_path, tmp_path / "logs", "worker-kill")
    try:
        wait_for(lambda: _local_checkpoints(ckpt)[-1:] >= [2], 300, "checkpoint 2", driver)
        assert driver.proc.poll() is None and example.check(str(output), sources)[0]
        cluster.kill_worker(1)
        at_kill = _local_checkpoints(ckpt)[-1]
        assert driver.wait() == 0, driver.tail()
    finally:
        driver.stop()
    assert cluster.alive_workers() == 1
    assert _local_checkpoints(ckpt)[-1] > at_kill  # rounds went on after the kill
    assert example.check(str(output), sources) == ([], [])
    assert example.visible_lines(str(output)) == example.expected_lines(sources)

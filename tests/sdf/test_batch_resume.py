"""Kill a batch job while residuals are pending; rerun it; the output is exact.

In the style of bytewax's recovery tests: SIGKILL the driver at a chosen point
(after the first committed round with pending residuals), run the same
command again with the same --checkpoint_dir, and assert the exact output —
no lost and no duplicated positions — and that the rerun resumed from the
checkpoint instead of starting over. The same lines also go through
``WriteToFilesOnCheckpoint`` fused into the SDF's stage: staged, none visible, at the kill;
each once after the rerun.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkbeam.runner.rounds.sink_files import STAGING_DIR
from sparkbeam.sdf.testing.run import committed_rounds

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = sorted(f"{n},{i}" for n, size in (("a", 12), ("b", 9), ("c", 15)) for i in range(size))


def _cmd(out: Path, ckpt: Path, *flags: str) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "tests" / "sdf" / "resumable_pipeline.py"),
        str(out),
        f"--checkpoint_dir={ckpt}",
        *flags,
    ]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _committed_rounds(ckpt: Path) -> list[dict]:
    return committed_rounds(str(ckpt))


def test_killed_batch_job_resumes_pending_residuals_exactly_once(tmp_path):
    """The killed run's store has 4 key groups; the rerun's flags would give a new one 128:
    the restored pipeline keeps 4, and so do the SDF stage's staged outputs (else the commit
    refuses them)."""
    ckpt, out, sink = tmp_path / "ckpt", tmp_path / "out.txt", tmp_path / "sink"
    proc = subprocess.Popen(
        _cmd(out, ckpt, "--max_key_groups=4", f"--sink_prefix={sink / 'out'}"),
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.time() + 300
    killed_at = None
    while time.time() < deadline and proc.poll() is None:
        rounds = _committed_rounds(ckpt)
        if any(m.get("pending_residuals", 0) > 0 and m.get("round", 0) >= 1 for m in rounds):
            os.kill(proc.pid, signal.SIGKILL)
            killed_at = max(m.get("round", 0) for m in rounds)
            break
        time.sleep(0.05)
    proc.wait(timeout=60)
    assert killed_at is not None, "the job finished before a round with pending residuals: " + (
        proc.stderr.read().decode()[-2000:] if proc.stderr else ""
    )
    assert not out.exists(), "the sink must not have run before the kill"
    assert _sink_lines(sink) == [] and _staged(sink)  # staged, nothing visible yet
    assert _outputs_kept_by_tasks(ckpt)

    # Operators see the pending residuals and the next timer of the killed job.
    shown = subprocess.run(
        [sys.executable, "-m", "sparkbeam.checkpoint.cli", "checkpoints", "show",
         "--checkpoint_dir", str(ckpt), "--pipeline", "pipeline-0", "--json"],
        env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr[-2000:]
    metadata = json.loads(shown.stdout)["metadata"]
    assert metadata["pending_residuals"] > 0 and metadata["next_timer_ms"] > 0

    rerun = subprocess.run(
        _cmd(out, ckpt, f"--sink_prefix={sink / 'out'}"),
        env=_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr[-4000:]
    assert sorted(out.read_text().split()) == EXPECTED
    assert _sink_lines(sink) == EXPECTED and _staged(sink) == []
    final = _committed_rounds(ckpt)
    resumed_rounds = [m["round"] for m in final if "round" in m]
    # The rerun continued the round numbering: it did not redo round 0.
    assert resumed_rounds and max(resumed_rounds) > killed_at
    assert any(m.get("finished") for m in final)
    assert _key_groups(ckpt) == {4}


def _sink_lines(sink: Path) -> list[str]:
    return sorted(line for f in sink.glob("out-*") for line in f.read_text().split())


def _staged(sink: Path) -> list[str]:
    return [str(p) for p in (sink / STAGING_DIR).glob("*")]


def _outputs_kept_by_tasks(ckpt: Path) -> bool:
    """The SDF stage's committed output chunks are in task-owned ranges (the driver holds
    their handles), none in the driver's own files."""
    from sparkbeam.checkpoint import open_store, state_layout
    from sparkbeam.checkpoint.layout import pipeline_dir
    from sparkbeam.checkpoint.reader import replay

    in_driver: list[str] = []
    with open_store(str(ckpt), read_only=True) as store:
        (pipeline,) = store.list_pipelines()
        manifest = store.load_manifest(pipeline, store.list_checkpoints(pipeline)[-1].checkpoint_id)
        owned = [ns for ns in manifest.task_state.namespaces if ns.startswith("stage-output/")]
        replay(
            store.storage, pipeline_dir(pipeline), manifest,
            lambda ns, *_: in_driver.append(ns), lambda *_: None, driver_only=True,
        )  # fmt: skip
    return bool(owned) and not [
        ns for ns in in_driver if ns.startswith(state_layout.STAGE_OUTPUT_PREFIX)
    ]


def _key_groups(ckpt: Path) -> set[int]:
    from sparkbeam.checkpoint import open_store

    with open_store(str(ckpt), read_only=True) as store:
        (pipeline,) = store.list_pipelines()
        return {c.max_key_groups for c in store.list_checkpoints(pipeline)}

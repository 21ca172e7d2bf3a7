"""Exactly-once across a fallback and a rescale.

The driver is killed after some rounds published their files; then the latest manifest is
cut in half, so the restart falls back to the checkpoint before it and replays the lost
round, at another ``--parallelism`` (the sources' keys move to other partitions). The files
the lost round published must not appear twice.
"""

from __future__ import annotations

import glob
import os
import signal

import pytest

from sparkbeam.checkpoint import open_store
from sparkbeam.checkpoint.errors import CheckpointCorruptError
from tests.streaming.test_recovery import _expected, _run, _visible_lines

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _cut_latest_manifests(ckpt) -> list[str]:
    """Cut the newest manifest of every pipeline in half; returns the damaged paths."""
    damaged = []
    for manifests in glob.glob(os.path.join(ckpt, "pipelines", "*", "manifests")):
        names = sorted(glob.glob(os.path.join(manifests, "chk-*.json")))
        if len(names) < 2:
            continue  # nothing to fall back to: this pipeline is not the one under test
        latest = max(names, key=lambda n: int(n.rsplit("chk-", 1)[1].split(".")[0]))
        with open(latest, "rb") as f:
            data = f.read()
        with open(latest, "wb") as f:
            f.write(data[: len(data) // 2])
        damaged.append(latest)
    return damaged


def _assert_detected_as_damaged(ckpt: str, damaged: list[str]) -> None:
    with open_store(ckpt, read_only=True) as store:
        for path in damaged:
            pipeline = os.path.basename(os.path.dirname(os.path.dirname(path)))
            cid = int(path.rsplit("chk-", 1)[1].split(".")[0])
            with pytest.raises(CheckpointCorruptError):
                store.load_manifest(pipeline, cid)


@pytest.mark.parametrize("before, after", [(2, 3), (3, 2)])
def test_fallback_then_rescale_publishes_each_window_once(tmp_path, before, after):
    killed = _run(tmp_path, before, crash_at="mid-round:6")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    published = _visible_lines(tmp_path)
    assert published and published != _expected()
    damaged = _cut_latest_manifests(str(tmp_path / "ckpt"))
    assert damaged
    _assert_detected_as_damaged(str(tmp_path / "ckpt"), damaged)  # the restart must fall back
    resumed = _run(tmp_path, after)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _visible_lines(tmp_path) == _expected()

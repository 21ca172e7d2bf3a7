"""Startpoints storage and the ``checkpoints`` CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sparkbeam.checkpoint import StartpointKind, open_store
from sparkbeam.checkpoint.cli import main
from sparkbeam.checkpoint.layout import pipeline_dir
from sparkbeam.checkpoint.state_layout import LAYOUT_VERSION


def test_startpoints_set_list_delete_never_touch_checkpoints(tmp_path):
    with open_store(str(tmp_path)) as store:
        st = store.pipeline("p")
        st.put("n", b"k", b"v")
        st.checkpoint()
        before = sorted(store.storage.list(pipeline_dir("p")))
        sps = store.startpoints
        sps.set("p", "ReadKafka", "offset", "1234")
        sps.set("p", "ReadKafka", StartpointKind.TIMESTAMP, "1700000000000", element_key=b"part-3")
        sps.set("q", "ReadFiles", StartpointKind.OLDEST)
        sps.set("p", "ReadKafka", StartpointKind.UPCOMING)  # replaces the first
        got = sps.list("p")
        assert [(s.source, s.kind, s.position, s.element_key) for s in got] == [
            ("ReadKafka", StartpointKind.UPCOMING, None, None),
            ("ReadKafka", StartpointKind.TIMESTAMP, "1700000000000", b"part-3"),
        ]
        assert {s.pipeline_id for s in sps.list()} == {"p", "q"}
        assert sps.get("p", "ReadKafka", b"part-3").position == "1700000000000"
        assert sps.delete("p", "ReadKafka", b"part-3") and not sps.delete("p", "nope")
        assert sps.get("p", "ReadKafka", b"part-3") is None
        assert sorted(store.storage.list(pipeline_dir("p"))) == before


@pytest.mark.parametrize(
    "kind,position,match",
    [
        ("offset", None, "Startpoint of kind 'offset' for source 'S' needs a position"),
        ("oldest", "5", "Startpoint of kind 'oldest' for source 'S' takes no position"),
    ],
)
def test_startpoint_errors(tmp_path, kind, position, match):
    with open_store(str(tmp_path)) as store:
        with pytest.raises(ValueError, match=match):
            store.startpoints.set("p", "S", kind, position)


@pytest.fixture
def populated(tmp_path):
    root = str(tmp_path / "store")
    with open_store(root, max_key_groups=16, materialization_files=2) as store:
        for pid in ("orders", "clicks"):
            st = store.pipeline(pid)
            for i in range(50):
                st.put("n", b"%d" % i, b"v" * 100)
            st.mark_completed("file-1")
            st.checkpoint(fingerprint="fp", parallelism=2, metadata={"round": 1})
            st.materialize()
            st.put("n", b"x", b"y")
            st.checkpoint(fingerprint="fp", parallelism=3)
    return root


def test_cli_list_show_verify(populated, capsys):
    assert main(["checkpoints", "list", "--checkpoint_dir", populated]) == 0
    out = capsys.readouterr().out
    assert "PIPELINE" in out and "MATERIALIZED" in out and "CHANGELOG" in out
    assert out.count("orders") == 2 and out.count("clicks") == 2
    assert main(["checkpoints", "list", "--checkpoint_dir", populated, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {(r["pipeline_id"], r["checkpoint_id"], r["entries"]) for r in rows} == {
        ("clicks", 1, 50), ("clicks", 2, 51), ("orders", 1, 50), ("orders", 2, 51),
    }  # fmt: skip
    assert rows[1]["materialization_bytes"] > 0 and rows[0]["materialization_bytes"] == 0
    assert main(["checkpoints", "show", "--checkpoint_dir", populated, "--pipeline", "orders"]) == 0
    out = capsys.readouterr().out
    assert "checkpoint       2" in out and "materialization" in out and "file-1" in out
    args = ["checkpoints", "show", "--checkpoint_dir", populated, "--pipeline", "orders"]
    assert main([*args, "--checkpoint", "1", "--json"]) == 0
    metadata = json.loads(capsys.readouterr().out)["metadata"]
    assert metadata == {"round": 1, "state_layout": LAYOUT_VERSION}  # the store records it
    assert main(["checkpoints", "verify", "--checkpoint_dir", populated]) == 0
    assert capsys.readouterr().out.count(" ok") == 4


def test_cli_verify_reports_damage_and_fails(populated, capsys):
    with open_store(populated, read_only=True) as store:
        name = store.load_manifest("orders", 2).materialization[0].name
    path = os.path.join(populated, pipeline_dir("orders"), name)
    with open(path, "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xfe")
    assert main(["checkpoints", "verify", "--checkpoint_dir", populated]) == 1
    out = capsys.readouterr().out
    assert "DAMAGED" in out and name in out and "checksum" in out
    assert main(["checkpoints", "verify", "--checkpoint_dir", populated, "--json"]) == 1
    bad = [r for r in json.loads(capsys.readouterr().out) if not r["ok"]]
    assert [(r["pipeline_id"], r["checkpoint_id"]) for r in bad] == [("orders", 2)]


def test_cli_clean_and_errors(populated, capsys):
    with open_store(populated) as store:
        w = store.staged_writer("orders", "s", 1, 0, 0)
        w.put("n", b"k", b"v")
        w.finish()  # never committed
    assert main(["checkpoints", "clean", "--checkpoint_dir", populated, "--grace_s", "0"]) == 0
    assert "Deleted 1 unreferenced file(s)" in capsys.readouterr().out
    with open_store(populated, job_name="running-job"):
        assert main(["checkpoints", "clean", "--checkpoint_dir", populated]) == 2
        assert "locked by job 'running-job'" in capsys.readouterr().err
    args = ["checkpoints", "show", "--checkpoint_dir", populated, "--pipeline", "none"]
    assert main(args) == 2
    assert "Pipeline 'none' has no checkpoint" in capsys.readouterr().err
    for grace in ("inf", "nan", "-1", "1e300"):
        with pytest.raises(SystemExit):
            main(["checkpoints", "clean", "--checkpoint_dir", populated, "--grace_s", grace])
        assert "--grace_s" in capsys.readouterr().err


def test_cli_runs_as_module(populated):
    out = subprocess.run(
        [sys.executable, "-m", "sparkbeam.checkpoint.cli", "checkpoints", "list",
         "--checkpoint_dir", populated],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "orders" in out


def test_cli_startpoints_set_list_delete(tmp_path, capsys):
    root = str(tmp_path / "store")
    base = ["--checkpoint_dir", root, "--pipeline", "pipeline-0", "--transform", "ReadOffsets"]
    assert main(["startpoints", "set", *base, "--kind", "offset", "--value", "42"]) == 0
    assert "applies when the job next starts" in capsys.readouterr().out
    args = ["startpoints", "set", *base, "--key", "partition-3", "--kind", "upcoming"]
    assert main(args) == 0
    capsys.readouterr()
    assert main(["startpoints", "list", "--checkpoint_dir", root]) == 0
    out = capsys.readouterr().out
    assert "TRANSFORM" in out and "AGE" in out
    assert "ReadOffsets  *            offset    42" in out and "partition-3  upcoming  -" in out
    assert main(["startpoints", "list", "--checkpoint_dir", root, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["pipeline_id"], r["element_key"], r["kind"], r["position"]) for r in rows] == [
        ("pipeline-0", None, "offset", "42"),
        ("pipeline-0", "partition-3", "upcoming", None),
    ]
    with open_store(root, read_only=True) as store:
        assert store.startpoints.get("pipeline-0", "ReadOffsets", b"partition-3") is not None
        assert store.list_pipelines() == []  # setting a startpoint writes no checkpoint
    assert main(["startpoints", "delete", *base, "--key", "partition-3"]) == 0
    assert "Deleted the startpoint of 'partition-3'" in capsys.readouterr().out
    assert main(["startpoints", "delete", *base, "--key", "partition-3"]) == 1
    assert "has no startpoint of 'partition-3' for transform 'ReadOffsets'" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--kind", "offset"], "Startpoint of kind 'offset' for source 'ReadOffsets' needs a pos"),
        (["--kind", "oldest", "--value", "3"], "kind 'oldest' for source 'ReadOffsets' takes no"),
        (["--kind", "timestamp", "--value", "yesterday"], "'yesterday' is not a timestamp: give"),
    ],
)
def test_cli_startpoints_bad_input(tmp_path, capsys, extra, match):
    base = ["--checkpoint_dir", str(tmp_path), "--pipeline", "p", "--transform", "ReadOffsets"]
    assert main(["startpoints", "set", *base, *extra]) == 2
    assert match in capsys.readouterr().err


def test_cli_startpoints_refuse_a_running_job_and_run_under_sparkbeam(tmp_path, capsys):
    from sparkbeam.runner.cli import main as sparkbeam_main

    base = ["--checkpoint_dir", str(tmp_path), "--pipeline", "p", "--transform", "T"]
    with open_store(str(tmp_path), job_name="streaming-job"):
        assert sparkbeam_main(["startpoints", "set", *base, "--kind", "oldest"]) == 2
        assert "locked by job 'streaming-job'" in capsys.readouterr().err
    assert sparkbeam_main(["startpoints", "set", *base, "--kind", "oldest"]) == 0
    assert sparkbeam_main(["startpoints", "list", "--checkpoint_dir", str(tmp_path)]) == 0
    assert "oldest" in capsys.readouterr().out

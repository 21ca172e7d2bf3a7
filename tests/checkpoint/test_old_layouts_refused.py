"""A store of an older state layout is refused at restore, by name, and left as it was.

sparkbeam is pre-1.0: it reads checkpoints of one state layout, `state_layout.LAYOUT_VERSION`,
and upgrades none. The fixtures are real stores of older layouts, each killed mid-run by the
code that wrote it: ``layout_v1_store`` (streaming, before layouts were recorded: pickled
state), ``layout_v2_store`` (streaming with a side input, values stored raw),
``layout_v5_store`` (SDF residuals in the driver's files) and ``batch_v0_store`` (a batch SDF
job of layout 2). Their ``make_*`` scripts say how they were made.

The refusal names the layout the store has, the one this sparkbeam reads, and what to do;
nothing of the store is changed by it, so the sparkbeam version that wrote it can still
drain it. A finished run's checkpoint (a drained job) passes: ``--fresh`` reruns it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from sparkbeam.checkpoint import open_store
from sparkbeam.checkpoint import state_layout as sl
from sparkbeam.checkpoint.cli import main
from sparkbeam.checkpoint.errors import StateLayoutError
from sparkbeam.checkpoint.manifest import decode_manifest, encode_manifest
from sparkbeam.runner.rounds.compatibility import FinishedJobError
from tests.conftest import spark_test_options
from tests.fixtures.layout_pipeline import build

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
STORES = {"layout_v1_store": 1, "layout_v2_store": 2, "layout_v5_store": 5, "batch_v0_store": 2}
WHERE = "Checkpoint 4 of pipeline 'p' in store '/s'"


def _what_to_do(layout: int) -> str:
    return (
        rf"state layout {layout}, older than layout {sl.LAYOUT_VERSION}, the only one this "
        r"sparkbeam reads .*drain the job with the sparkbeam version that wrote it .*rerun it "
        r"here with --fresh, or start it over with a new --checkpoint_dir"
    )


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _copy(name: str, tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    url = tmp_path / "ckpt"
    shutil.copytree(FIXTURES / name, url)
    return url, _files(url)


@pytest.mark.parametrize("layout", range(1, sl.LAYOUT_VERSION))
def test_every_older_layout_is_refused_with_what_to_do_in_one_line(layout):
    with pytest.raises(StateLayoutError, match=_what_to_do(layout)) as e:
        sl.check_restorable({sl.LAYOUT_KEY: layout} if layout > 1 else {}, WHERE)
    message = str(e.value)
    assert message.startswith(f"{WHERE} was written in state layout {layout}")  # cause first
    assert "\n" not in message and message.endswith("The store was left as it was.")


def test_the_current_layout_and_a_finished_run_of_an_older_one_pass():
    sl.check_restorable({sl.LAYOUT_KEY: sl.LAYOUT_VERSION}, WHERE)
    sl.check_restorable({sl.LAYOUT_KEY: 5, sl.FINISHED: True}, WHERE)  # --fresh reruns it
    newer = sl.LAYOUT_VERSION + 1
    with pytest.raises(StateLayoutError, match=f"state layout {newer}, newer than layout"):
        sl.check_restorable({sl.LAYOUT_KEY: newer}, WHERE)  # a newer layout: never guessed


@pytest.mark.parametrize("name", sorted(STORES))
def test_a_fixture_store_is_refused_at_restore_and_left_as_it_was(name, tmp_path):
    url, before = _copy(name, tmp_path)
    with open_store(str(url)) as store:
        state = store.pipeline("pipeline-0")
        with pytest.raises(StateLayoutError, match=_what_to_do(STORES[name])) as e:
            state.restore()
        assert f"of pipeline 'pipeline-0' in store {str(url)!r}" in str(e.value)
        state.close()
    assert _files(url) == before  # nothing read into a commit, moved, marked or swept


@pytest.mark.parametrize("name", ["layout_v1_store", "layout_v5_store"])
def test_list_and_verify_say_a_restart_is_refused_and_verify_fails(name, tmp_path, capsys):
    url, before = _copy(name, tmp_path)
    layout = STORES[name]
    assert main(["checkpoints", "list", "--checkpoint_dir", str(url)]) == 0
    out = capsys.readouterr().out
    assert out.count(f" {layout} (refused) ") == 3  # each checkpoint's layout
    assert "pipeline-0: a restart is refused: Checkpoint 4 of pipeline 'pipeline-0'" in out
    assert main(["checkpoints", "verify", "--checkpoint_dir", str(url)]) == 1
    out = capsys.readouterr().out
    assert out.count(" ok") == 3  # its files are sound ...
    assert "a restart would use" not in out  # ... but a restart fails
    assert re.search(f"pipeline-0: a restart is refused: .*{_what_to_do(layout)}", out)
    assert main(["checkpoints", "verify", "--checkpoint_dir", str(url), "--json"]) == 1
    docs = json.loads(capsys.readouterr().out)
    assert [bool(d["refused"]) for d in docs] == [False, False, True]  # the restart's
    assert _files(url) == before


def test_list_shows_the_current_layout_and_verify_passes(tmp_path, capsys):
    with open_store(str(tmp_path)) as store:
        state = store.pipeline("p")
        state.put(sl.SINK_STAGING_DIRS, *sl.encode_staging_dir("/out/0"))
        state.checkpoint()
        state.close()
    assert main(["checkpoints", "list", "--checkpoint_dir", str(tmp_path), "--json"]) == 0
    (info,) = json.loads(capsys.readouterr().out)
    assert (info["layout"], info["refused"]) == (sl.LAYOUT_VERSION, None)
    assert main(["checkpoints", "verify", "--checkpoint_dir", str(tmp_path)]) == 0
    assert "p: a restart would use checkpoint 1" in capsys.readouterr().out


def _relabel(url: Path, layout: int, finished: bool) -> None:
    """Rewrite every manifest of the store as one of ``layout`` (finished or not)."""
    for path in url.rglob("manifests/chk-*.json"):
        manifest = decode_manifest(path.read_bytes(), str(path))
        metadata = {k: v for k, v in manifest.metadata.items() if k != sl.FINISHED}
        metadata |= {sl.LAYOUT_KEY: layout, **({sl.FINISHED: True} if finished else {})}
        path.write_bytes(encode_manifest(dataclasses.replace(manifest, metadata=metadata)))


def test_a_restore_refuses_an_older_checkpoint_it_falls_back_to(tmp_path):
    url = tmp_path / "ckpt"
    with open_store(str(url)) as store:
        state = store.pipeline("p")
        for n in range(2):
            state.put(sl.SINK_STAGING_DIRS, *sl.encode_staging_dir(f"/out/{n}"))
            state.checkpoint()
        state.close()
    (older, newer) = sorted(url.rglob("manifests/chk-*.json"))
    _relabel(url, 8, finished=False)
    newer.write_bytes(b"{damaged")
    before = _files(url)
    with open_store(str(url)) as store:
        with pytest.raises(StateLayoutError, match=_what_to_do(8)):
            store.pipeline("p").restore()
    assert _files(url) == before


@pytest.mark.spark
@pytest.mark.parametrize("name", ["layout_v5_store", "batch_v0_store"])
def test_a_job_on_an_older_store_fails_before_it_runs_and_changes_nothing(spark, name, tmp_path):
    url, before = _copy(name, tmp_path)
    streaming = name.startswith("layout")
    flags = ["--streaming"] if streaming else []
    options = spark_test_options(*flags, f"--checkpoint_dir={url}", "--checkpoint_interval_s=0.05")
    with pytest.raises(StateLayoutError, match=_what_to_do(5 if streaming else 2)):
        with beam.Pipeline(options=PipelineOptions(options)) as p:
            if streaming:
                build(p, str(tmp_path / "out"))
            else:
                _ = p | beam.Create([("a", 3)]) | beam.Map(str)
    assert _files(url) == before
    assert not (tmp_path / "out").exists()  # nothing ran


def _run_batch(url: Path, out: Path, *extra: str) -> None:
    options = spark_test_options(f"--checkpoint_dir={url}", "--parallelism=2", *extra)
    with beam.Pipeline(options=PipelineOptions(options)) as p:
        _ = p | beam.Create(["a", "b"]) | beam.io.WriteToText(str(out), shard_name_template="")


@pytest.mark.spark
@pytest.mark.slow  # three batch runs
def test_a_drained_job_of_an_older_layout_reruns_with_fresh_and_an_unfinished_one_not(
    spark, tmp_path
):
    url, out = tmp_path / "ckpt", tmp_path / "out.txt"
    _run_batch(url, out)
    _relabel(url, 8, finished=True)  # what the older version left once the job finished
    out.unlink()
    with pytest.raises(FinishedJobError, match="pass --fresh"):
        _run_batch(url, out)
    assert not out.exists()
    _run_batch(url, out, "--fresh")  # run again from the beginning
    assert sorted(out.read_text().split()) == ["a", "b"]
    _relabel(url, 8, finished=False)  # as if it had been killed mid-run
    out.unlink()
    before = _files(url)
    with pytest.raises(StateLayoutError, match=_what_to_do(8)):
        _run_batch(url, out, "--fresh")
    assert not out.exists() and _files(url) == before


def test_no_fixture_store_is_of_the_current_layout():
    """The refusal tests above refuse real older stores, not a current one by mistake."""
    for name, layout in STORES.items():
        store = FIXTURES / name
        for path in store.rglob("manifests/chk-*.json"):
            manifest = decode_manifest(path.read_bytes(), str(path))
            assert sl.layout_of(manifest.metadata) == layout < sl.LAYOUT_VERSION, os.fspath(path)

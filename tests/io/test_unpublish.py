"""A fallback restore unpublishes the files of the lost checkpoints' rounds (pure, no Spark)."""

from __future__ import annotations

import os

import apache_beam as beam

from sparkbeam.io import WriteToFilesOnCheckpoint
from sparkbeam.runner.rounds import sink_files
from sparkbeam.translation.translate import translate


def test_unpublish_after_deletes_only_later_rounds_of_the_pipelines_stages(tmp_path):
    names = [
        "out-00000004-stage-6-00000-00000",  # the restored round: kept
        "out-00000005-stage-6-00001-00000",  # lost rounds: removed
        "out-00000006-stage-6-00000-00002.gz",
        "out-00000009-stage-16-00000-00000",  # another pipeline's stage: kept
        "notes.txt",
    ]
    for name in names:
        (tmp_path / name).write_text("x\n")
    removed = sink_files.unpublish_after([str(tmp_path)], ["stage-6"], 4)
    assert removed == 2
    assert sorted(os.listdir(tmp_path)) == sorted([names[0], names[3], names[4]])
    assert sink_files.unpublish_after([str(tmp_path / "never-written")], ["stage-6"], 0) == 0


def test_output_directories_come_from_the_sink_annotation_and_staging(tmp_path):
    p = beam.Pipeline()
    _ = p | beam.Create(["a"]) | WriteToFilesOnCheckpoint(str(tmp_path / "out" / "part"))
    plan = translate(p.to_runner_api())
    staging = [str(tmp_path / "old" / sink_files.STAGING_DIR)]
    found = sink_files.output_directories(plan.components, staging)
    assert found == {str(tmp_path / "out"), str(tmp_path / "old")}

"""A small streaming job for the progress tests: words counted per key, to one checkpoint dir.

``python -m tests.runner.progress_app CKPT_DIR MASTER`` (``SPARKBEAM_CRASH_AT`` kills it).
"""

from __future__ import annotations

import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

if __name__ == "__main__":
    ckpt, master = sys.argv[1], sys.argv[2]
    flags = [
        "--runner=SparkCheckpointRunner", f"--spark_master_url={master}", "--streaming",
        f"--checkpoint_dir={ckpt}", "--checkpoint_interval_s=0.05",
    ]  # fmt: skip
    p = beam.Pipeline(options=PipelineOptions(flags))
    _ = (
        p
        | beam.Create(["a", "b", "a", "c"])
        | "Pair" >> beam.Map(lambda w: (w, 1))
        | "Group" >> beam.GroupByKey()
        | "Sum" >> beam.MapTuple(lambda w, ones: (w, sum(ones)))
    )
    p.run().wait_until_finish()

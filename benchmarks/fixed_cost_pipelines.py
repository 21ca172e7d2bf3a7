"""The pipelines ``fixed_cost.py`` times: one per process, each tiny, so that the process's
wall time and CPU are the fixed cost of running a pipeline at all.

    python benchmarks/fixed_cost_pipelines.py trivial --runner=FnApiRunner
    python benchmarks/fixed_cost_pipelines.py side_inputs --runner=SparkCheckpointRunner \\
        --spark_master_url=local[2]
    python benchmarks/fixed_cost_pipelines.py bare_pyspark local[2]

Workloads (every one checks its output with ``assert_that``):
  * ``trivial``     -- ``Create(range(10)) | Map(x + 1)``;
  * ``side_inputs`` -- one Map with 10 ``AsSingleton`` side inputs, each a ``Create([i])``;
  * ``combiners``   -- 9 x ``CombineGlobally(sum)`` and 9 x ``Sample.FixedSizeGlobally(3)``
                       on the same ``Create``;
  * ``bare_pyspark``-- not Beam: a local SparkSession and one trivial RDD job, the floor of
                       any pipeline on Spark. Its one argument is the Spark master.
Every argument after the workload goes to Beam's ``PipelineOptions``.
"""

from __future__ import annotations

import sys

WORKLOADS = ("trivial", "side_inputs", "combiners")
N_SIDE_INPUTS = 10
N_COMBINES = 9


def trivial(p) -> None:
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    out = p | beam.Create(range(10)) | beam.Map(lambda x: x + 1)
    assert_that(out, equal_to(list(range(1, 11))))


def side_inputs(p) -> None:
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    sides = {
        f"s{i}": beam.pvalue.AsSingleton(p | f"Side{i}" >> beam.Create([i]))
        for i in range(N_SIDE_INPUTS)
    }
    out = p | "Main" >> beam.Create([100]) | beam.Map(lambda x, **s: x + sum(s.values()), **sides)
    assert_that(out, equal_to([100 + sum(range(N_SIDE_INPUTS))]))


def combiners(p) -> None:
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    data = list(range(10))
    pc = p | beam.Create(data)
    for i in range(N_COMBINES):
        total = pc | f"Sum{i}" >> beam.CombineGlobally(sum)
        assert_that(total, equal_to([sum(data)]), label=f"CheckSum{i}")
        sample = pc | f"Sample{i}" >> beam.combiners.Sample.FixedSizeGlobally(3)
        checked = sample | f"SampleOk{i}" >> beam.Map(
            lambda s: len(s) == 3 and len(set(s)) == 3 and set(s) <= set(data)
        )
        assert_that(checked, equal_to([True]), label=f"CheckSample{i}")


def bare_pyspark(master: str) -> None:
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.master(master).appName("fixed-cost-bare-pyspark").getOrCreate()
    try:
        got = spark.sparkContext.parallelize(range(10)).map(lambda x: x + 1).collect()
        assert got == list(range(1, 11)), got
    finally:
        spark.stop()


def _check_spark_remote(options, argv: list[str]) -> None:
    """Beam drops an unknown flag with a warning: without this check a sparkbeam that lacks
    --spark_remote would run on a local master and be timed as Spark Connect."""
    if not any(a.startswith("--spark_remote") for a in argv):
        return
    import sparkbeam.runner.options  # noqa: F401  (registers sparkbeam's flags)

    if "spark_remote" not in options.get_all_options():
        raise SystemExit(
            "this sparkbeam has no --spark_remote option; install one that has it, "
            "or leave the sparkbeam-connect system out of --systems"
        )


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in (*WORKLOADS, "bare_pyspark"):
        print(f"usage: {sys.argv[0]} {{{','.join(WORKLOADS)},bare_pyspark}} ...", file=sys.stderr)
        return 2
    workload, rest = argv[0], argv[1:]
    if workload == "bare_pyspark":
        bare_pyspark(*rest[:1] or ["local[2]"])
        return 0
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    options = PipelineOptions(rest)
    _check_spark_remote(options, rest)
    with beam.Pipeline(options=options) as p:
        globals()[workload](p)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

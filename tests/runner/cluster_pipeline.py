"""A pipeline with GroupByKey, side inputs and user state, run on the master given in argv[1].

Run in its own process by test_local_cluster.py (one SparkContext per process).
Prints the sorted result as JSON on the last line.
"""

import json
import sys

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec


class RunningTotal(beam.DoFn):
    TOTAL = ReadModifyWriteStateSpec("total", VarIntCoder())

    def process(self, kv, total=beam.DoFn.StateParam(TOTAL)):
        key, value = kv
        current = (total.read() or 0) + value
        total.write(current)
        yield key, current


def main(master: str, out: str) -> None:
    options = PipelineOptions(
        [f"--spark_master_url={master}", "--runner=SparkCheckpointRunner", "--parallelism=3"]
    )
    with beam.Pipeline(options=options) as p:
        offset = p | "Offset" >> beam.Create([100])
        nums = p | "Nums" >> beam.Create(list(range(60)))
        keyed = nums | beam.Map(lambda x, off: (x % 4, x + off), beam.pvalue.AsSingleton(offset))
        sums = keyed | beam.GroupByKey() | beam.MapTuple(lambda k, vs: ("sum", k, sum(vs)))
        totals = keyed | beam.ParDo(RunningTotal()) | beam.CombinePerKey(max)
        finals = totals | beam.MapTuple(lambda k, v: ("total", k, v))
        merged = (sums, finals) | beam.Flatten()
        merged | beam.Map(json.dumps) | beam.io.WriteToText(out, shard_name_template="")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    from pyspark import SparkContext

    SparkContext.getOrCreate().stop()  # the run's context (its SQL session was never needed)

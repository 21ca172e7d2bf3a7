"""A small batch job for the cluster tests: GroupByKey, a side input and user state.

Sums of ``range(--count)`` plus an offset read as a side input, by ``x % 5``: each key's sum
through a GroupByKey, and its running total through a stateful DoFn (the largest is the sum).
Run by the tests as a script (``python keyed_sums.py`` or ``spark-submit keyed_sums.py``);
writes ``sum key total`` and ``state key total`` lines under ``--output``. Other flags go to
Beam.
"""

import argparse

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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", required=True)
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--offset", type=int, default=1000)
    known, beam_args = parser.parse_known_args(argv)
    with beam.Pipeline(options=PipelineOptions(beam_args)) as p:
        offset = p | "Offset" >> beam.Create([known.offset])
        keyed = (
            p
            | beam.Create(list(range(known.count)))
            | beam.Map(lambda x, off: (x % 5, x + off), beam.pvalue.AsSingleton(offset))
        )
        sums = keyed | beam.GroupByKey() | beam.MapTuple(lambda k, vs: f"sum {k} {sum(vs)}")
        totals = (
            keyed
            | beam.ParDo(RunningTotal())
            | beam.CombinePerKey(max)
            | beam.MapTuple(lambda k, v: f"state {k} {v}")
        )
        (sums, totals) | beam.Flatten() | beam.io.WriteToText(known.output)


if __name__ == "__main__":
    main()

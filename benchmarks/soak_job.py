"""The streaming job ``soak.py`` runs for its whole duration, one driver process per run.

Kafka (``ReadFromKafka``, the records' create times as event times) -> 10 s fixed windows
(``--lateness-s`` allowed: a record's create time is set before it reaches the broker, so a
caught-up partition's watermark can pass it) -> a count per key and window -> one line per
pane, ``"<key> <window start> <count> <pane index> <side>"``, through the exactly-once sink.
With ``--side-input-kb K`` the count stage also reads, as an ``AsList`` side input windowed
like the main input, a ``PeriodicImpulse`` of one K KB payload a second from ``--side-start``;
``<side>`` is how many whole payloads its window held (``-`` without one).

The driver appends its pipelines' round times (``RoundLoop.round_times``) to ``--rounds``
as JSON lines every second, so a SIGKILL loses at most the last second of them; SIGTERM
stops it after the running round (the runner's own handler), as an operator stops a job.

    python benchmarks/soak_job.py --bootstrap H:P --topic T --store DIR --out DIR --rounds F
"""

from __future__ import annotations

import argparse
import json
import os
import random


def build(p, args: argparse.Namespace) -> None:
    import apache_beam as beam
    from apache_beam.transforms import window
    from apache_beam.transforms.periodicsequence import PeriodicImpulse

    from sparkbeam.io import ReadFromKafka, WriteToFilesOnCheckpoint

    config = {"bootstrap.servers": args.bootstrap, "auto.offset.reset": "earliest"}
    config.update(item.split("=", 1) for item in args.consumer)
    counts = (
        p
        | "Kafka" >> ReadFromKafka(
            config, [args.topic], timestamp_policy=ReadFromKafka.create_time_policy
        )
        | "Key" >> beam.MapTuple(lambda key, _value: (key.decode(), 1))
        | "Windows" >> beam.WindowInto(
            window.FixedWindows(args.window_s), allowed_lateness=args.lateness_s
        )
        | "Count" >> beam.CombinePerKey(sum)
    )  # fmt: skip
    side = None
    size = args.side_input_kb * 1024
    if size:
        side = beam.pvalue.AsList(
            p
            | "Ticks" >> PeriodicImpulse(start_timestamp=args.side_start, fire_interval=1.0)
            | "Payload" >> beam.Map(lambda t: random.Random(int(float(t))).randbytes(size))
            | "SideWindows" >> beam.WindowInto(window.FixedWindows(args.window_s))
        )
    lines = counts | "Line" >> beam.ParDo(_Line(size), side=side)
    _ = lines | "Write" >> WriteToFilesOnCheckpoint(os.path.join(args.out, "out"))


def _line_dofn():
    import apache_beam as beam

    class Line(beam.DoFn):
        """A pane's count as a line; with a side input, how many whole payloads it read."""

        def __init__(self, size: int) -> None:
            self.size = size

        def process(self, kv, win=beam.DoFn.WindowParam, pane=beam.DoFn.PaneInfoParam, side=None):
            seen = "-" if side is None else sum(1 for b in side if len(b) == self.size)
            yield f"{kv[0]} {int(win.start)} {kv[1]} {pane.index} {seen}"

    return Line


def _Line(size: int):  # noqa: N802 - builds the DoFn where Beam is imported (the child)
    return _line_dofn()(size)


def run(args: argparse.Namespace) -> None:
    """Run the job until it stops (SIGTERM) or fails, writing its round times as it goes."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    flags = [
        "--runner=SparkCheckpointRunner", "--streaming", f"--checkpoint_dir={args.store}",
        f"--parallelism={args.parallelism}", f"--spark_master_url={args.master}",
        *(f"--spark_conf={item}" for item in args.spark_conf),
    ]  # fmt: skip
    p = beam.Pipeline(options=PipelineOptions(flags))
    build(p, args)
    result = p.run()
    written: dict[int, int] = {}
    with open(args.rounds, "a") as f:
        done = False
        while not done:
            done = result.wait_until_finish(duration=1000) != "RUNNING"
            for i, loop in enumerate(result.executor.loops):
                for r in list(loop.round_times):
                    if r.round_no > written.get(i, -1):
                        f.write(json.dumps({"pipeline": i, **r._asdict()}) + "\n")
                        written[i] = r.round_no
            f.flush()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--store", required=True, help="--checkpoint_dir")
    ap.add_argument("--out", required=True, help="the sink's directory")
    ap.add_argument("--rounds", required=True, help="file the round times are appended to")
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--window-s", type=int, default=10)
    ap.add_argument("--lateness-s", type=int, default=10)
    ap.add_argument("--side-input-kb", type=int, default=0)
    ap.add_argument("--consumer", action="append", default=[], help="KEY=VALUE config")
    ap.add_argument("--spark_conf", action="append", default=[], help="KEY=VALUE, the runner's")
    ap.add_argument("--side-start", type=float, default=0.0, help="epoch s of the first tick")
    run(ap.parse_args(argv))


if __name__ == "__main__":
    main()

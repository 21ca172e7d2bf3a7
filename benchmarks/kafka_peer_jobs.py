"""The peers' programs: Quix Streams and bytewax reading a Kafka topic, run by the peers' python.

Runs in ``.venv-peers`` (``make bench``; ``benchmarks/peers-requirements.txt``), never in
sparkbeam's venv: it imports only the standard library and the peer it runs. One process of
``--processes`` (``--process`` is this one's index); `kafka_peers` starts them, merges their
``stats-<i>.json`` and checks their ``windows-<i>.txt``. Each peer in its idiomatic per-record
form, all its records through Python:

* ``read``: count every record (a per-record call that counts and stamps the time);
* ``windows``: a 10 s tumbling window count per key, event time = the record's timestamp (its
  create time), each closed window as ``<key> <window start ms> <count>`` appended to
  ``windows-<i>.txt`` and flushed at once (the line is then visible: no transaction, no
  commit -- the peer's fastest possible output, not an exactly-once one).

How each ends and scales:

* Quix Streams: ``--processes`` Applications in one consumer group (how Quix scales; the group
  splits the partitions), state in ``--out``, its default changelog topics on; windows
  ``.final(closing_strategy="partition")`` (a record closes every earlier window of its
  partition, as a watermark would). Bounded runs stop ``--idle-s`` after their last message
  (``Application.run(timeout=...)``): the measured time ends at the last record/window, not
  at the stop.
* bytewax: ``--processes`` cluster processes of one worker each (``cli_main`` with
  ``--addresses``), ``KafkaSource(tail=not --bounded)``: a bounded run ends at the partitions'
  ends, closing every window. Its ``EventClock`` closes a window once the system time since
  the key's latest record passes the window's end: bounded runs wait 0 s, unbounded ones
  ``STREAM_WAIT_S`` for records still on their way (with 0 the window of a record that
  arrived a few ms after its window's end had closed, and the record was dropped).

Prints nothing on success: ``stats-<i>.json`` holds ``count``, ``first`` and ``last`` (wall
epoch seconds of the first record and of the last record or window line).
"""

from __future__ import annotations

import argparse
import json
import os
import time

WINDOW_MS = 10_000
STREAM_WAIT_S = 1.0


class Stamps:
    """Count records, time the first one and the last thing done (``touch``); the first record
    creates ``ready-<i>`` (a streaming run is reading)."""

    def __init__(self, out: str, index: int) -> None:
        self.count, self.first, self.last = 0, 0.0, 0.0
        self.ready = os.path.join(out, f"ready-{index}")

    def record(self, *_args) -> None:
        if not self.count:
            self.first = time.time()
            open(self.ready, "w").close()
        self.count += 1
        self.last = time.time()

    def touch(self) -> None:
        self.last = time.time()

    def save(self, out: str, index: int) -> None:
        stats = {"count": self.count, "first": self.first, "last": self.last}
        with open(os.path.join(out, f"stats-{index}.json"), "w") as f:
            json.dump(stats, f)


class WindowLines:
    """``<key> <window start ms> <count>`` lines appended and flushed one by one."""

    def __init__(self, out: str, index: int, stamps: Stamps) -> None:
        self.file = open(os.path.join(out, f"windows-{index}.txt"), "a", buffering=1)  # noqa: SIM115
        self.stamps = stamps

    def write(self, key: str, start_ms: int, count: int) -> None:
        self.file.write(f"{key} {start_ms} {count}\n")
        self.file.flush()
        self.stamps.touch()


def quix(args, stamps: Stamps) -> None:
    from quixstreams import Application

    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        state_dir=os.path.join(args.out, f"quix-state-{args.process}"),
        loglevel="WARNING",
        # Tansu answers a group join after half the session timeout (45 s by default): start-up
        # only, outside the measured time.
        consumer_extra_config={"session.timeout.ms": "6000"},
    )
    topic = app.topic(args.topic, key_deserializer="bytes", value_deserializer="bytes")
    sdf = app.dataframe(topic)
    if args.job == "read":
        sdf = sdf.update(stamps.record)
    else:
        lines = WindowLines(args.out, args.process, stamps)
        sdf = sdf.update(stamps.record)
        sdf = sdf.tumbling_window(WINDOW_MS).count().final(closing_strategy="partition")

        def write(window: dict, key: bytes, _ts, _headers) -> None:
            lines.write(key.decode(), window["start"], window["value"])

        sdf = sdf.update(write, metadata=True)
    app.run(timeout=args.idle_s if args.bounded else 0.0)


def bytewax(args, stamps: Stamps) -> None:
    from datetime import datetime, timedelta, timezone

    import bytewax.operators as op
    from bytewax.connectors.kafka import KafkaSource
    from bytewax.dataflow import Dataflow
    from bytewax.operators.windowing import EventClock, TumblingWindower, count_window
    from bytewax.run import cli_main

    flow = Dataflow("bench")
    source = KafkaSource([args.bootstrap], [args.topic], tail=not args.bounded)
    messages = op.input("kafka", flow, source)
    if args.job == "read":
        op.inspect("count", messages, stamps.record)
    else:
        lines = WindowLines(args.out, args.process, stamps)
        counted = op.inspect("stamp", messages, stamps.record)
        epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
        windows = count_window(
            "count",
            counted,
            EventClock(
                lambda m: epoch + timedelta(milliseconds=m.timestamp[1]),
                wait_for_system_duration=timedelta(seconds=0 if args.bounded else STREAM_WAIT_S),
            ),
            TumblingWindower(length=timedelta(milliseconds=WINDOW_MS), align_to=epoch),
            key=lambda m: m.key.decode(),
        )
        op.inspect(
            "write", windows.down, lambda _s, kv: lines.write(kv[0], kv[1][0] * WINDOW_MS, kv[1][1])
        )
    addresses = args.addresses.split(";") if args.processes > 1 else None
    process_id = args.process if args.processes > 1 else None
    cli_main(flow, workers_per_process=1, process_id=process_id, addresses=addresses)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("peer", choices=("quix", "bytewax"))
    ap.add_argument("job", choices=("read", "windows"))
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--out", required=True, help="folder of stats-<i>.json, windows-<i>.txt")
    ap.add_argument("--process", type=int, default=0)
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--group", default="bench-peers", help="Quix's consumer group")
    ap.add_argument("--addresses", default="", help="bytewax: host:port;host:port ...")
    ap.add_argument("--bounded", action="store_true", help="stop at the topic's end")
    ap.add_argument("--idle-s", type=float, default=3.0, help="Quix: stop after this idle")
    args = ap.parse_args()
    stamps = Stamps(args.out, args.process)
    try:
        (quix if args.peer == "quix" else bytewax)(args, stamps)
    finally:
        stamps.save(args.out, args.process)


if __name__ == "__main__":
    main()

"""The Kafka client's own CPU a record, by consumer settings and call pattern.

Reads one topic with confluent-kafka in this process and charges its CPU (user + system,
librdkafka's threads included, from ``getrusage``) to the records: the bare loop's settings and
calls against the source's (``kafka_client.SOURCE_DEFAULTS``, a consumer per partition,
``kafka_client.poll``). Run alone on the machine; results in RESULTS.md ("Where a record's CPU
goes").

    python benchmarks/kafka_client_cpu.py --records 1000000
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = str(Path(__file__).resolve().parent.parent)
sys.path.insert(0, REPO)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def read(config: dict, topic: str, groups: list[list[int]], take) -> tuple[float, float]:
    """(records/s, CPU us a record) of reading every partition of ``groups``, a consumer each."""
    from confluent_kafka import Consumer, TopicPartition

    cpu0, t0, seen = _cpu_s(), time.perf_counter(), 0
    for partitions in groups:
        consumer = Consumer({**config, "group.id": "client-cpu"})
        tps = [TopicPartition(topic, p, 0) for p in partitions]
        consumer.assign(tps)
        want = sum(consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in tps)
        got = 0
        while got < want:
            for message in take(consumer):
                if message.error() is None:
                    _ = (message.key(), message.value(), message.offset(), message.timestamp())
                    got += 1
        seen += got
        consumer.close()
    return seen / (time.perf_counter() - t0), (_cpu_s() - cpu0) / seen * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()

    from sparkbeam.io import kafka_client
    from tests.servers import start_kafka_broker, stop_process_group

    with tempfile.TemporaryDirectory() as log_dir:
        broker = start_kafka_broker(Path(log_dir))
        try:
            broker.create_topic("cpu", 2)
            value = b"x" * 100
            broker.produce("cpu", [(b"%d" % i, value, None) for i in range(args.records)])
            bare = {**broker.config(), "enable.auto.commit": "false"}
            source = {**broker.config(), **kafka_client.SOURCE_DEFAULTS}
            consume = lambda c: c.consume(500, timeout=5)  # noqa: E731
            poll = lambda c: kafka_client.poll(c, 500, 0.05)  # noqa: E731
            cases = [
                ("defaults, one consumer, consume(500, 5) (the bare loop)", bare, [[0, 1]],
                 consume),
                ("defaults, a consumer per partition, consume(500, 5)", bare, [[0], [1]], consume),
                ("source defaults, a consumer per partition, poll (the read's)", source,
                 [[0], [1]], poll),
                ("source defaults + fetch.wait.max.ms=100, per partition, poll",
                 {**source, "fetch.wait.max.ms": "100"}, [[0], [1]], poll),
            ]  # fmt: skip
            for name, config, groups, take in cases:
                for _ in range(args.runs):
                    rate, us = read(config, "cpu", groups, take)
                    print(f"{name}: {rate:,.0f} records/s, {us:.2f} us CPU a record", flush=True)
        finally:
            stop_process_group(broker.proc)


if __name__ == "__main__":
    main()

"""Quix Streams and bytewax next to sparkbeam on the same topic, in the same run.

Owns the window workload and the peers' side of ``benchmarks/kafka.py``: the records of the
window count and their expected counts, sparkbeam's windowed pipeline (batch here, streaming
in ``kafka_sustained``), starting the peers' programs (``kafka_peer_jobs.py``) with the peers'
python, merging and checking what they report. ``kafka.py`` owns the broker, the read topic
and the printing of the read's ratios.

The peers live in their own venv, ``.venv-peers`` (``make bench``): Quix Streams pins
confluent-kafka, pydantic and pydantic-settings below ``constraints.txt``. Without it each
peer is skipped with a line saying so.

Workloads (each system on 2 cores: sparkbeam ``--parallelism=2``, each peer ``--peer-processes``
processes, 2 by default):

* ``read``: read and count every record of the read topic, timed for a peer from its first
  record to its last (start-up and the stop after excluded), for sparkbeam around its run
  (whole, and net of a 100-record run: ``kafka.sparkbeam_run``).
* ``windows``: ``records`` records over ``keys`` keys with create times spread evenly over
  ``span_s`` seconds, then one later record per key (a "closer": it closes the last windows
  of a peer that closes windows only on a later record); a 10 s tumbling-window count per
  key. sparkbeam: ``ReadFromKafka(max_num_records=all, timestamp_policy=CreateTime) |
  Map | WindowInto(FixedWindows(10)) | Count.PerElement | WriteToFilesOnCheckpoint``, timed
  like the read; a peer from its first record to its last window line. Every system's
  ``<key> <window start ms> <count>`` lines are checked against the expected counts (the
  closers' windows left out).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEERS = ("quix", "bytewax")
PEERS_PYTHON = REPO / ".venv-peers" / "bin" / "python"
PEER_JOBS = Path(__file__).resolve().with_name("kafka_peer_jobs.py")
WINDOW_S = 10
BASE_MS = 1_700_000_000_000  # the window records' first create time, on a 10 s boundary
CLOSER = b"close"


def peers_python() -> str | None:
    """The peers' venv's python, or None (after saying how to make it) if it is missing."""
    if PEERS_PYTHON.exists():
        return str(PEERS_PYTHON)
    print(f"peers: skipped, {PEERS_PYTHON} is missing (run `make bench` to set it up)")
    return None


def window_records(records: int, keys: int, span_s: float, value_bytes: int):
    """The window topic's records, ``(key, value, create time ms)``: record ``i`` has key
    ``k<i % keys>`` and time ``BASE_MS + i * span / records``; then one closer per key."""
    value, span_ms = b"x" * value_bytes, int(span_s * 1000)
    for i in range(records):
        yield b"k%d" % (i % keys), value, BASE_MS + i * span_ms // records
    for k in range(keys):
        yield b"k%d" % k, CLOSER, BASE_MS + span_ms + 3_600_000


def expected_windows(records: int, keys: int, span_s: float) -> Counter:
    """``{(key, window start ms): count}`` of `window_records`, the closers left out."""
    span_ms, window_ms = int(span_s * 1000), WINDOW_S * 1000
    expected: Counter = Counter()
    for i in range(records):
        ts = BASE_MS + i * span_ms // records
        expected[f"k{i % keys}", ts - ts % window_ms] += 1
    return expected


def check_windows(lines: list[str], expected: Counter) -> str:
    """``ok``, or what is wrong with these ``<key> <start ms> <count>`` lines."""
    last = max((start for _, start in expected), default=0)
    got: Counter = Counter()
    twice = 0
    for line in lines:
        key, start, count = line.split()
        if int(start) <= last:
            twice += (key, int(start)) in got
            got[key, int(start)] += int(count)
    if twice == 0 and got == expected:
        return "ok"
    missing = sum(1 for w in expected if w not in got)
    wrong = sum(1 for w in expected if w in got and got[w] != expected[w])
    return f"MISMATCH: {missing} windows missing, {wrong} wrong counts, {twice} emitted twice"


def window_pipeline(
    p, config: dict, topic: str, out: str, max_num_records: int | None, max_delay_s: float = 0.0
):
    """sparkbeam's windowed count: ``ReadFromKafka -> Map -> 10 s windows -> count per key ->
    WriteToFilesOnCheckpoint``, bounded by ``max_num_records`` or (None) streaming; streaming
    may wait ``max_delay_s`` for records still on their way, as bytewax waits `STREAM_WAIT_S`
    (the producer stamps a record before it reaches the broker)."""
    import apache_beam as beam

    from sparkbeam.io import ReadFromKafka, WriteToFilesOnCheckpoint

    def line(kv, window=beam.DoFn.WindowParam):
        return f"{kv[0]} {window.start.micros // 1000} {kv[1]}"

    _ = (
        p
        | ReadFromKafka(
            config, [topic], max_num_records=max_num_records,
            timestamp_policy=ReadFromKafka.create_time_policy,
            max_delay_s=max_delay_s,
        )
        | beam.MapTuple(lambda key, _value: key.decode())
        | beam.WindowInto(beam.window.FixedWindows(WINDOW_S))
        | beam.combiners.Count.PerElement()
        | beam.Map(line)
        | WriteToFilesOnCheckpoint(f"{out}/out")
    )  # fmt: skip


def sparkbeam_windows(config: dict, topic: str, total: int) -> tuple[float, float, list[str]]:
    """(seconds of the whole run, seconds of a 100-record run, the whole run's lines)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    options = PipelineOptions(["--runner=SparkCheckpointRunner", "--parallelism=2"])
    config = {**config, "auto.offset.reset": "earliest"}

    def run(n: int) -> tuple[float, list[str]]:
        with tempfile.TemporaryDirectory() as out:
            p = beam.Pipeline(options=options)
            window_pipeline(p, config, topic, out, n)
            started = time.perf_counter()
            p.run().wait_until_finish()
            seconds = time.perf_counter() - started
            return seconds, [
                ln for f in Path(out).glob("out*") for ln in f.read_text().split("\n") if ln
            ]

    run(100)  # warm
    fixed, _ = run(100)
    whole, lines = run(total)
    return whole, fixed, lines


def start_peer(
    python: str, peer: str, job: str, bootstrap: str, topic: str, out: str, processes: int,
    bounded: bool,
) -> list[subprocess.Popen]:  # fmt: skip
    """Start ``processes`` processes of a peer's program, each in its own session."""
    from tests.servers import free_port

    group = f"bench-{peer}-{job}-{topic}-{time.time_ns()}"
    addresses = ";".join(f"127.0.0.1:{free_port()}" for _ in range(processes))
    procs = []
    for i in range(processes):
        cmd = [
            python, str(PEER_JOBS), peer, job, "--bootstrap", bootstrap, "--topic", topic,
            "--out", out, "--process", str(i), "--processes", str(processes),
            "--group", group, "--addresses", addresses, *(["--bounded"] if bounded else []),
        ]  # fmt: skip
        log = open(os.path.join(out, f"log-{i}.txt"), "w")  # noqa: SIM115 - the child's
        procs.append(
            subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        )
    return procs


def stop_peer(procs: list[subprocess.Popen]) -> None:
    """Kill every process group of a peer run that is still alive."""
    from tests.servers import stop_process_group

    for proc in procs:
        stop_process_group(proc)


def run_peer(
    python: str, peer: str, job: str, bootstrap: str, topic: str, processes: int,
    timeout_s: float,
) -> dict:  # fmt: skip
    """Run a peer's bounded job to its end: ``{count, seconds, lines}`` or ``{problem}``."""
    with tempfile.TemporaryDirectory() as out:
        procs = start_peer(python, peer, job, bootstrap, topic, out, processes, bounded=True)
        deadline = time.monotonic() + timeout_s
        try:
            for proc in procs:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return {"problem": f"timed out after {timeout_s:.0f} s"}
        finally:
            stop_peer(procs)
        failed = [i for i, proc in enumerate(procs) if proc.returncode != 0]
        if failed:
            log = Path(out, f"log-{failed[0]}.txt").read_text().strip().splitlines()
            return {"problem": f"exit status {procs[failed[0]].returncode}: {log[-1:]}"}
        stats = [json.loads(Path(out, f"stats-{i}.json").read_text()) for i in range(processes)]
        lines = [
            ln for f in Path(out).glob("windows-*.txt") for ln in f.read_text().split("\n") if ln
        ]
    active = [s for s in stats if s["count"]]
    first = min((s["first"] for s in active), default=0.0)
    last = max((s["last"] for s in active), default=0.0)
    return {"count": sum(s["count"] for s in stats), "seconds": last - first, "lines": lines}


def peer_runs(bootstrap: str, topic: str, job: str, records: int, args) -> dict[str, dict]:
    """Each peer's bounded ``job`` on ``topic`` (``records`` in it): ``{peer: run_peer()}``,
    after printing a line per peer; {} without the peers' venv."""
    python = peers_python()
    if python is None:
        return {}
    runs = {}
    for peer in PEERS:
        got = run_peer(
            python, peer, job, bootstrap, topic, args.peer_processes, args.peer_timeout_s
        )
        runs[peer] = got
        if "problem" in got:
            print(f"{peer} {job}: FAILED: {got['problem']}")
            continue
        rate = got["count"] / max(got["seconds"], 1e-9)
        got["rate"] = rate
        counted = "" if got["count"] == records else f" (counted {got['count']} of {records}!)"
        print(
            f"{peer} {job} ({args.peer_processes} processes): {rate:,.0f} records/s, first "
            f"record to last {'record' if job == 'read' else 'window line'}{counted}"
        )
    return runs


def windows(broker, args) -> None:
    """The window workload on every system; prints rates, checks and ratios."""
    keys, span = args.window_keys, args.window_span_s
    broker.create_topic("windows", args.partitions, {"retention.ms": "-1"})  # for Quix
    broker.produce("windows", window_records(args.records, keys, span, args.value_bytes))
    expected = expected_windows(args.records, keys, span)
    total = args.records + keys
    whole, fixed, lines = sparkbeam_windows(broker.config(), "windows", total)
    net = total / max(whole - fixed, 1e-9)
    print(
        f"window count ({keys} keys, {len(expected)} (key, 10 s window) counts over {span:.0f} s "
        f"of create time): sparkbeam {total / whole:,.0f} records/s whole, {net:,.0f} net of a "
        f"100-record run ({fixed:.1f} s); output {check_windows(lines, expected)}"
    )
    runs = peer_runs(broker.bootstrap, "windows", "windows", total, args)
    for peer, got in runs.items():
        if "rate" in got:
            print(
                f"  {peer} windows output {check_windows(got['lines'], expected)}; sparkbeam / "
                f"{peer}: {total / whole / got['rate']:.2f}x whole, {net / got['rate']:.2f}x net"
            )


if __name__ == "__main__":
    sys.exit("run benchmarks/kafka.py (it runs the peers)")

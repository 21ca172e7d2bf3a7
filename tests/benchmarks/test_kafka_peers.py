"""benchmarks/kafka_peers.py and kafka_sustained.py: the peers' programs (Quix Streams, bytewax)
on a tiny topic of the session's broker, only where `make bench` set up their venv
(``.venv-peers``): the suite never installs them."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import kafka_peers  # noqa: E402
import kafka_sustained  # noqa: E402

needs_peers = pytest.mark.skipif(
    not kafka_peers.PEERS_PYTHON.exists(),
    reason=f"{kafka_peers.PEERS_PYTHON} is missing: `make bench` sets up the peers' venv",
)


def _topic(broker, records: int, keys: int, span_s: float) -> str:
    topic = f"peers-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, 2, {"retention.ms": "-1"})  # Quix reads it
    broker.produce(topic, kafka_peers.window_records(records, keys, span_s, 10))
    return topic


def test_the_window_check_finds_a_missing_a_wrong_and_a_doubled_window():
    expected = kafka_peers.expected_windows(30, 3, 20)
    assert sum(expected.values()) == 30 and len(expected) == 6
    lines = [f"{key} {start} {count}" for (key, start), count in expected.items()]
    closer = f"k0 {kafka_peers.BASE_MS + 3_620_000} 1"  # a closer's window is not checked
    assert kafka_peers.check_windows([*lines, closer], expected) == "ok"
    assert "1 windows missing" in kafka_peers.check_windows(lines[1:], expected)
    wrong = [lines[0].rsplit(" ", 1)[0] + " 99", *lines[1:]]
    assert "1 wrong counts" in kafka_peers.check_windows(wrong, expected)
    assert "1 emitted twice" in kafka_peers.check_windows([*lines, lines[0]], expected)


@needs_peers
@pytest.mark.parametrize("peer", kafka_peers.PEERS)
def test_each_peer_reads_every_record_and_counts_every_window(kafka_broker, peer):
    topic = _topic(kafka_broker, 300, 3, 40)
    python = str(kafka_peers.PEERS_PYTHON)
    read = kafka_peers.run_peer(python, peer, "read", kafka_broker.bootstrap, topic, 2, 120)
    assert read.get("count") == 303, read  # the 300 records and a closer per key
    windows = kafka_peers.run_peer(python, peer, "windows", kafka_broker.bootstrap, topic, 2, 120)
    assert windows.get("count") == 303, windows
    expected = kafka_peers.expected_windows(300, 3, 40)
    assert kafka_peers.check_windows(windows["lines"], expected) == "ok"


@needs_peers
@pytest.mark.slow
def test_a_sustained_step_of_a_peer_sees_every_window_it_measures(kafka_broker):
    args = SimpleNamespace(
        partitions=2, peer_processes=2, sustained_keys=3, sustained_warm_s=2.0,
        sustained_s=10.0, sustained_p99_s=2.0,
    )  # fmt: skip
    got = kafka_sustained.step("quix", kafka_broker, 200, args)
    assert got["lines"] == 3 and got["missing"] == 0 and got["wrong"] == 0, got
    assert got["behind_s"] < 0.5 and got["ok"], got

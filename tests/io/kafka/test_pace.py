"""A partition's fetch wait and stall (``kafka_pace``): the rules alone, no broker."""

from __future__ import annotations

import pytest
from apache_beam.io.restriction_trackers import OffsetRange

from sparkbeam.io import ReadFromKafka
from sparkbeam.io.errors import KafkaConfigError
from sparkbeam.io.kafka_pace import RELAX_S, WARN_EVERY_S, FetchPace, Pacing, progressed
from sparkbeam.io.kafka_restrictions import KafkaOffsetRange, KafkaRestrictionProvider

PACING = Pacing(start_ms=5, max_ms=500, stall_s=60.0)


def test_the_wait_doubles_from_the_start_up_to_the_bound():
    pace, waits = FetchPace(5), []
    while PACING.grow(pace, now=100.0):
        waits.append(pace.wait_ms)
    assert waits == [10, 20, 40, 80, 160, 320, 500]
    assert pace.stalled_since == 100.0  # the first empty poll with lag starts the streak


def test_a_grown_wait_halves_only_after_it_has_not_grown_for_a_while():
    restriction = KafkaOffsetRange(0, 10, pace=FetchPace(40, grown_at=1000.0))
    assert PACING.pace_of(restriction, 1000.0 + RELAX_S - 1).wait_ms == 40
    assert PACING.pace_of(restriction, 1000.0 + RELAX_S).wait_ms == 20
    assert PACING.pace_of(restriction, 1000.0 + RELAX_S + 1).wait_ms == 20  # grown_at moved


def test_a_restriction_without_a_pace_starts_at_the_consumer_configs_wait():
    assert PACING.pace_of(OffsetRange(0, 10), 0.0).wait_ms == 5  # a plain (older) range
    slow = Pacing.of({"fetch.wait.max.ms": "100"}, 500, 60.0)
    assert slow.pace_of(KafkaOffsetRange(0, 10, pace=FetchPace(5)), 0.0).wait_ms == 100


def test_the_residual_carries_the_pace_through_the_restriction_coder():
    range_ = KafkaOffsetRange(0, 10, pace=FetchPace(80, grown_at=5.0, stalled_since=6.0))
    primary, residual = range_.split_at(4)
    assert primary.pace is range_.pace  # the read goes on with its own
    coder = KafkaRestrictionProvider({}).restriction_coder()
    decoded = coder.decode(coder.encode(residual))
    assert (decoded.start, decoded.pace) == (4, FetchPace(80, 5.0, 6.0, None))


def test_a_stalled_partition_is_named_at_most_once_a_minute():
    pace = FetchPace(500, stalled_since=1000.0)
    assert PACING.stall_warning(pace, 1059.0, "t-3", 7, 90, 12.0) is None  # not 60 s yet
    text = PACING.stall_warning(pace, 1060.0, "t-3", 7, 90, 12.0)
    assert text == (
        "Kafka partition t-3 has made no progress for 60 s although records wait past its "
        "position: position 7, end offset 90 (83 behind); every fetch came back empty at "
        "fetch.wait.max.ms=500 (max_fetch_wait_ms=500) on a consumer made 12 s ago, so the "
        "broker takes longer than that to answer. The read goes on polling and loses nothing; "
        "check the broker's load and storage, or raise max_fetch_wait_ms of ReadFromKafka."
    )
    assert PACING.stall_warning(pace, 1060.0 + WARN_EVERY_S - 1, "t-3", 7, 90, 1.0) is None
    assert PACING.stall_warning(pace, 1060.0 + WARN_EVERY_S, "t-3", 7, 90, 1.0) is not None
    progressed(pace)  # a record: the streak ends
    assert PACING.stall_warning(pace, 9999.0, "t-3", 8, 90, 1.0) is None


@pytest.mark.parametrize(
    "settings, name",
    [
        ({"max_fetch_wait_ms": 0}, "max_fetch_wait_ms"),
        ({"max_fetch_wait_ms": 2.5}, "max_fetch_wait_ms"),
        ({"stall_warning_s": 0}, "stall_warning_s"),
        ({"consumer_config": {"fetch.wait.max.ms": "soon"}}, "fetch.wait.max.ms"),
    ],
)
def test_bad_pacing_settings_are_refused_by_name(settings, name):
    config = {"bootstrap.servers": "127.0.0.1:1", **settings.pop("consumer_config", {})}
    with pytest.raises(KafkaConfigError, match=name):
        ReadFromKafka(config, ["t"], **settings)

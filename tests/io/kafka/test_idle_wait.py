"""A caught-up partition's wait ends on its delay's wall-clock grid (partitions poll together)."""

from __future__ import annotations

import math

import pytest

from sparkbeam.io import ReadFromKafka
from sparkbeam.io.errors import KafkaConfigError
from sparkbeam.io.kafka_read import idle_wait


@pytest.mark.parametrize("now", [1000.0, 1000.3, 1000.49, 1000.51, 1000.74, 1000.76, 1000.99, 1234.5678])
def test_the_wait_is_about_the_delay_and_ends_on_its_grid(now):
    for delay in (0.1, 1.0, 4.0):
        wait = idle_wait(delay, now)
        assert delay / 4 <= wait <= 1.25 * delay  # about the delay: never a busy poll
        resume = now + wait
        assert math.isclose(resume / delay, round(resume / delay), abs_tol=1e-6)


def test_two_partitions_deferred_in_different_rounds_resume_together():
    """Each resumes at the same grid point, so one round polls both (not one round each)."""
    first = 500.02 + idle_wait(1.0, 500.02)
    second = 500.41 + idle_wait(1.0, 500.41)
    assert math.isclose(first, second)


@pytest.mark.parametrize(
    "settings",
    [
        {"idle_resume_delay_s": 0},
        {"idle_resume_delay_s": 2.0, "max_idle_resume_delay_s": 1.0},
        {"max_idle_resume_delay_s": math.inf},
    ],
)
def test_bad_delays_are_refused_by_name(settings):
    with pytest.raises(KafkaConfigError, match="idle_resume_delay_s"):
        ReadFromKafka({"bootstrap.servers": "127.0.0.1:1"}, ["t"], **settings)

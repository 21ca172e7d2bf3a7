"""The round loop's wait: a round woken by a timer starts a little after it, so timers that
tasks set for one moment, each from its own clock, fire in one round."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from sparkbeam.runner.rounds.loop import TIMER_SLACK_S, RoundLoop


class _IdleJob:
    """What ``RoundLoop.wait`` asks of a job: nothing moves before the earliest timer."""

    pipeline = SimpleNamespace(id="pipeline-0")
    sdf_stages = ()
    virtual_time = False

    def watermark_moves(self) -> bool:
        return False

    def waiting(self, loop, wait_s: float) -> None:
        self.wait_s = wait_s


def test_a_round_woken_by_a_timer_starts_after_the_timers_set_just_after_it():
    job = _IdleJob()
    loop = RoundLoop(job, SimpleNamespace(interval_s=0.0, stop=threading.Event()))
    first = time.time() * 1000 + 50  # the earliest timer; another task's lands 5 ms later
    loop.next_timer_ms = first
    loop.wait(time.monotonic())
    woke = time.time() * 1000
    assert woke >= first + 5  # the later timer is due when the round takes its clock
    assert woke < first + TIMER_SLACK_S * 1000 + 1000  # and not an interval or so longer


def test_the_interval_still_bounds_a_round_woken_by_a_timer_from_below():
    job = _IdleJob()
    loop = RoundLoop(job, SimpleNamespace(interval_s=0.3, stop=threading.Event()))
    loop.next_timer_ms = time.time() * 1000 + 10
    loop.wait(time.monotonic())
    assert job.wait_s >= 0.25

"""The round loop's wait: a round starts as soon as work is due (a moved watermark, a timer);
one woken by a timer starts a little after it, so timers that tasks set for one moment, each
from its own clock, fire in one round."""

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


def test_a_timer_due_before_the_interval_starts_the_round_at_the_timer():
    """Rounds start when work is due (issue 45): the interval no longer paces them."""
    job = _IdleJob()
    loop = RoundLoop(job, SimpleNamespace(interval_s=5.0, stop=threading.Event()))
    loop.next_timer_ms = time.time() * 1000 + 100
    loop.wait(time.monotonic())
    assert 0.05 <= job.wait_s <= 0.1 + TIMER_SLACK_S + 0.05


def test_a_moved_watermark_starts_the_next_round_at_once():
    job = _IdleJob()
    job.watermark_moves = lambda: True  # windows or event-time timers to fire
    loop = RoundLoop(job, SimpleNamespace(interval_s=5.0, stop=threading.Event()))
    loop.next_timer_ms = time.time() * 1000 + 3000
    loop.wait(time.monotonic())
    assert job.wait_s == 0.0


def test_with_nothing_known_due_the_loop_looks_again_after_the_interval():
    job = _IdleJob()
    loop = RoundLoop(job, SimpleNamespace(interval_s=0.3, stop=threading.Event()))
    started = time.monotonic()
    loop.wait(started)
    assert 0.25 <= job.wait_s <= 0.3

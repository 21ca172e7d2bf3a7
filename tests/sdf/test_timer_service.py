"""ResidualTimerService against a plain dict, through the rebuilds that drop cleared timers."""

from __future__ import annotations

import random

from sparkbeam.sdf.checkpoint_handler import ResidualTimerService


def test_random_sets_and_pops_match_a_dict_and_keep_no_cleared_entries():
    rng = random.Random(3)
    timers, model = ResidualTimerService(), {}
    now = 0
    for step in range(20_000):
        if rng.random() < 0.55:
            key = b"k%d" % rng.randrange(3_000)  # some keys are set again: the old entry dies
            model[key] = (now + rng.randrange(100), rng.randrange(10**6))
            timers.set(key, *model[key])
        else:
            now += rng.randrange(5)
            due = timers.pop_due(now, limit=rng.randrange(1, 50))
            expected = sorted((f, k) for k, (f, _) in model.items() if f <= now)[: len(due)]
            assert sorted(due) == sorted(k for _, k in expected)
            assert [model[k][0] for k in due] == sorted(model[k][0] for k in due)
            for key in due:
                del model[key]
        assert len(timers) == len(model)
        if step % 97 == 0:
            fires = [f for f, _ in model.values()]
            holds = [h for _, h in model.values()]
            assert timers.next_fire_ms() == (min(fires) if fires else None)
            assert timers.hold_micros() == (min(holds) if holds else None)
        bound = 2 * len(model) + 64
        assert len(timers._heap) <= bound and len(timers._holds) <= bound

"""``state_scale.py --simulate``: the real commit over handles, timed without tracemalloc."""

from __future__ import annotations

from benchmarks import state_scale


def test_simulation_times_commits_and_measures_the_peak_in_separate_passes(capsys):
    args = ["--simulate", "--rounds", "12", "--executors", "20", "--key_groups", "256"]
    assert state_scale.main([*args, "--sim_keys", "1e6", "--changes_per_s", "1e5"]) == 0
    out = capsys.readouterr().out.splitlines()
    head = [c.strip() for c in out[0].split("  ") if c.strip()]
    row = [c.strip() for c in out[2].split("  ") if c.strip()]
    got = dict(zip(head, row, strict=True))
    assert (got["executors"], got["key groups"], got["rounds"]) == ("20", "256", "12")
    assert 0 < float(got["commit p50 ms"]) <= float(got["commit p99 ms"])
    assert float(got["driver peak MB"]) > 0  # the traced pass ran
    assert int(got["range snapshots"]) > 0  # ranges whose tail outgrew their base

"""Key groups: a stable hash and contiguous ranges that cover every key group exactly once."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkbeam.checkpoint import (
    key_group,
    key_group_range,
    stable_hash,
    subtask_for_key_group,
)
from sparkbeam.checkpoint.keygroups import default_max_key_groups

KEYS = [b"", b"a", b"hello world", bytes(range(256)), "ünïcode".encode()]
HASH_SCRIPT = (
    "import sys\n"
    "from sparkbeam.checkpoint import stable_hash, key_group\n"
    "keys = [b'', b'a', b'hello world', bytes(range(256)), 'ünïcode'.encode()]\n"
    "print(hash('salted'))\n"
    "print(','.join('%d:%d' % (stable_hash(k), key_group(k, 128)) for k in keys))\n"
)


def test_stable_hash_is_identical_across_interpreters_with_different_hash_seeds():
    outputs = []
    for seed in ("1", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run(
            [sys.executable, "-c", HASH_SCRIPT], env=env, capture_output=True, text=True, check=True
        ).stdout.splitlines()
        outputs.append(out)
    assert outputs[0][0] != outputs[1][0], "the seeds should change Python's own hash()"
    assert outputs[0][1] == outputs[1][1]
    here = ",".join("%d:%d" % (stable_hash(k), key_group(k, 128)) for k in KEYS)
    assert outputs[0][1] == here


def test_stable_hash_known_values():
    # Pinned: changing the hash would silently reshuffle every existing checkpoint.
    assert stable_hash(b"") == 0xE4A6A0577479B2B4
    assert stable_hash(b"a") == 0x40F89E395B66422F
    assert stable_hash(b"hello world") == 0x878633AA32A3B150
    assert key_group(b"hello world", 128) == 0x878633AA32A3B150 % 128


@settings(max_examples=200, deadline=None)
@given(
    max_key_groups=st.integers(1, 1000),
    data=st.data(),
)
def test_ranges_partition_all_key_groups(max_key_groups, data):
    p = data.draw(st.integers(1, max_key_groups))
    owner = {}
    previous_stop = 0
    for sub in range(p):
        r = key_group_range(sub, p, max_key_groups)
        assert r.start == previous_stop, "ranges are contiguous and ordered"
        assert len(r) >= 1
        previous_stop = r.stop
        for kg in r:
            assert kg not in owner
            owner[kg] = sub
            assert subtask_for_key_group(kg, p, max_key_groups) == sub
    assert previous_stop == max_key_groups and len(owner) == max_key_groups


def test_key_groups_spread_keys():
    counts = [0] * 16
    for i in range(16000):
        counts[key_group(b"key-%d" % i, 16)] += 1
    assert min(counts) > 800 and max(counts) < 1200


@pytest.mark.parametrize(
    "args,match",
    [
        ((0, 0, 128), r"parallelism=0 must be in 1\.\.max_key_groups \(128\)"),
        ((0, 200, 128), r"parallelism=200 .* lower the parallelism"),
        ((5, 4, 128), r"subtask=5 must be in 0\.\.3"),
        ((0, 1, 0), r"max_key_groups=0 must be in 1\.\."),
    ],
)
def test_range_errors(args, match):
    with pytest.raises(ValueError, match=match):
        key_group_range(*args)


@pytest.mark.parametrize(
    "parallelism, expected",
    [
        (1, 128),
        (2, 128),
        (85, 128),  # 85 + 42 = 127
        (86, 256),  # 86 + 43 = 129
        (128, 256),
        (200, 512),
        (1000, 2048),
        (21845, 32768),  # 21845 + 10922 = 32767
        (30000, 32768),  # 45000 rounds up to 65536: capped
    ],
)
def test_default_max_key_groups_is_flinks_default_max_parallelism(parallelism, expected):
    """``KeyGroupRangeAssignment.computeDefaultMaxParallelism``: roundUpToPowerOfTwo(p + p/2),
    at least 128, at most 32768; every subtask then owns at least one key group."""
    assert default_max_key_groups(parallelism) == expected
    assert len(key_group_range(parallelism - 1, parallelism, expected)) >= 1

"""A streaming stateful task costs what its keys touch (``runner.streaming.stateful``).

The state servicer restores a key's stored cells when the SDK first asks for that key; a
key's stored timers are decoded when one is due (by the summary stored with them) or when
the stage sets or clears a timer of that key, so a new timer replaces or clears a stored
one; the task's report counts, holds and schedules every timer, decoded or not; only the
keys the round touched are staged. Real Beam coders, a real state servicer and a real
store; the Spark task context is the only thing stood in for (the writer it names).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pytest
from apache_beam import coders
from apache_beam.portability.api import beam_fn_api_pb2, beam_runner_api_pb2
from apache_beam.transforms import userstate
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import PANE_INFO_UNKNOWN

from sparkbeam.checkpoint import open_staged_writer, open_store, state_layout
from sparkbeam.checkpoint.layout import pipeline_dir
from sparkbeam.checkpoint.reader import replay_changelog
from sparkbeam.runner.streaming import stateful
from sparkbeam.runner.task.bundle_executor import PendingTimers
from sparkbeam.runner.task.records import CommitRecord, KeyedStateReport
from sparkbeam.runner.task.user_state import UserStateServicer

STAGE = "stage-1"
FAMILY = ("ParDo", "ts-flush")
EVENT = beam_runner_api_pb2.TimeDomain.EVENT_TIME
KEY_CODER = coders.StrUtf8Coder().get_impl()
VAR = coders.VarIntCoder().get_impl()
TIMER_CODER = coders.coders._TimerCoder(
    coders.StrUtf8Coder(), coders.coders.GlobalWindowCoder()
).get_impl()


def _cell(key: str, name: str = "count") -> beam_fn_api_pb2.StateKey:
    return beam_fn_api_pb2.StateKey(
        bag_user_state=beam_fn_api_pb2.StateKey.BagUserState(
            transform_id="ParDo", user_state_id=name, window=b"", key=KEY_CODER.encode_nested(key)
        )
    )


def _timer(key: str, fire_s: float, tag: str = "", clear: bool = False) -> userstate.Timer:
    at = None if clear else Timestamp(fire_s)
    pane = None if clear else PANE_INFO_UNKNOWN
    return userstate.Timer(key, tag, (GlobalWindow(),), clear, at, at, pane)


def _stored_timers(*timers: userstate.Timer) -> bytes:
    fires = [t.fire_timestamp.micros for t in timers]
    summary = state_layout.TimerSummary(len(timers), min(fires), min(fires), state_layout.NO_TIME)
    encoded = [(*FAMILY, TIMER_CODER.encode(t)) for t in timers]
    return state_layout.encode_user_timers(encoded, summary)


@dataclass
class _Task:
    """A stateful task of subtask 0 of 1 at a watermark, over stored state and timers."""

    url: str
    state_in: dict
    timers_in: dict
    watermark_s: float

    def start(self):
        spec = stateful.StatefulRound(
            pipeline="p", url=self.url, checkpoint_id=None, round_no=3, parallelism=1,
            max_key_groups=128, input_watermark=int(self.watermark_s * 1e6),
        )  # fmt: skip
        keyed = stateful.KeyedState(spec, STAGE, KEY_CODER, 0, self.state_in, self.timers_in)
        timers = PendingTimers({FAMILY: TIMER_CODER}, {FAMILY: EVENT})
        servicer = UserStateServicer()
        keyed.load(servicer, timers)
        return keyed, servicer, timers


@pytest.fixture
def task(tmp_path, monkeypatch):
    monkeypatch.setattr(  # the writer a Spark task would name by its partition and attempt
        stateful,
        "staged_writer_for_task",
        lambda spec, stage: open_staged_writer(spec.url, spec.pipeline, stage, spec.round_no, 0, 0),
    )
    keys = [f"k{i}" for i in range(50)]
    state_in = {
        KEY_CODER.encode_nested(k): state_layout.encode_user_state(
            {_cell(k).SerializeToString(): VAR.encode(i)}
        )
        for i, k in enumerate(keys)
    }
    timers_in = {KEY_CODER.encode_nested(k): _stored_timers(_timer(k, 100 + i)) for i, k in
                 enumerate(keys)}  # fmt: skip
    timers_in[KEY_CODER.encode_nested("k0")] = _stored_timers(_timer("k0", 5))  # due at 10
    return _Task(str(tmp_path), state_in, timers_in, watermark_s=10)


def test_a_keys_cells_are_restored_when_the_sdk_first_asks_for_it(task):
    _, servicer, _ = task.start()
    assert servicer.restored == set()
    assert servicer.get_raw(_cell("k7")) == (VAR.encode(7), None)
    servicer.append_raw(_cell("k9"), VAR.encode(1))  # an append keeps what was stored
    assert servicer.get_raw(_cell("k9"))[0] == VAR.encode(9) + VAR.encode(1)
    servicer.clear(_cell("k3"))
    assert servicer.get_raw(_cell("k3"))[0] == b""
    assert servicer.get_raw(_cell("new"))[0] == b""  # a key with nothing stored
    encoded = {KEY_CODER.encode_nested(k) for k in ("k7", "k9", "k3")}
    assert servicer.restored == encoded


def test_only_due_keys_timers_are_decoded_and_a_new_timer_loads_its_keys_first(task):
    keyed, _, timers = task.start()
    k0, k4 = KEY_CODER.encode_nested("k0"), KEY_CODER.encode_nested("k4")
    assert keyed.timers_loaded == {k0}  # fires at 5, the watermark is at 10
    assert [t.user_key for t in timers.pending.values()] == ["k0"]
    # k4's stored timer (fires at 104) is replaced by one with another tag: both stay...
    timers.add(FAMILY, [TIMER_CODER.encode(_timer("k4", 300, tag="other"))])
    assert keyed.timers_loaded == {k0, k4}
    assert sorted(t.fire_timestamp.seconds() for t in timers.pending.values()) == [5, 104, 300]
    # ... and a clear of a stored timer of a key not yet decoded removes it
    timers.add(FAMILY, [TIMER_CODER.encode(_timer("k5", 0, clear=True))])
    assert all(t.user_key != "k5" for t in timers.pending.values())


def test_the_report_counts_every_timer_and_only_touched_keys_are_staged(task):
    keyed, servicer, timers = task.start()
    fired = keyed.pop_due(timers)  # k0's timer at 5
    assert fired is not None and keyed.pop_due(timers) is None
    timers.add(FAMILY, [TIMER_CODER.encode(_timer("k5", 0, clear=True))])
    servicer.append_raw(_cell("k8"), VAR.encode(1))
    servicer.get_raw(_cell("k9"))  # read, not changed: not staged
    commit, report = list(keyed.finish(servicer, timers))
    assert isinstance(commit, CommitRecord) and isinstance(report, KeyedStateReport)
    assert report.timers == 48  # 50 stored, k0's fired, k5's cleared
    assert report.hold_micros == Timestamp(101).micros  # k1's, never decoded
    assert report.keys == 50  # every key still has state
    store = open_store(task.url)
    changed: dict = {}
    replay_changelog(
        store.storage,
        pipeline_dir("p"),
        commit.message.files,
        lambda ns, key, value, _group: changed.setdefault(ns, {}).__setitem__(key, value),
        lambda ns, key, _group: changed.setdefault(ns, {}).__setitem__(key, None),
    )
    assert set(changed[keyed.state_ns]) == {KEY_CODER.encode_nested("k8")}
    assert changed[keyed.timer_ns] == {  # deleted: no timer left for k0 and k5
        KEY_CODER.encode_nested("k0"): None,
        KEY_CODER.encode_nested("k5"): None,
    }


def test_timers_stored_without_a_summary_are_refused_by_name(task):
    blobs = [*(x.encode() for x in FAMILY), TIMER_CODER.encode(_timer("k2", 500))]
    v1 = bytes([state_layout.V1]) + struct.pack(">I", 3)  # layout 3: no summary
    v1 += b"".join(struct.pack(">I", len(b)) + b for b in blobs)
    task.timers_in[KEY_CODER.encode_nested("k2")] = v1
    with pytest.raises(state_layout.StateLayoutError, match=r"'user-timers/.*0x01.*version 2"):
        task.start()

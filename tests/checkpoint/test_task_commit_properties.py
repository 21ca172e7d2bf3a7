"""Property test of the task-owned commit path against a model dict (issue 44, 7).

Tasks of two keyed stages -- a GroupByKey (one namespace) and a stateful DoFn (cells and
timers, staged by one writer) -- run the real task-side code (`owned_tasks`: read, stage,
`TaskRange.stage`, `keep_staged`, background snapshots) against a real local store, on two
executors of two Python workers each, and the driver commits their messages
(`CheckpointChain.commit`). Random sequences of rounds, killed attempts (staged, never
committed), failed rounds, restarts at another parallelism and memory budget (past it a read
is held in RocksDB), lost workers and executors, and damaged task-owned files followed by the
driver's fallback (`restore.fall_back`) must leave every task's read, and every checkpoint
read at 1, 2 or 3 subtasks, as the model says: a dict per namespace, rolled back to the sound
checkpoint's on a fallback. Snapshot thresholds are lowered so that ranges snapshot every few
rounds: in the round, in the background (reported by a later round), when the commit asks.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)
from owned_tasks import (
    Attempt,
    Executors,
    damage,
    gbk_task,
    join_background_snapshots,
    stateful_task,
)

from sparkbeam.checkpoint import CheckpointCorruptError, key_group_range, open_store, state_layout
from sparkbeam.checkpoint.keygroups import key_group
from sparkbeam.checkpoint.layout import pipeline_dir
from sparkbeam.checkpoint.restore import fall_back
from sparkbeam.runner.task import held_state, shared_reads, staged_state

MKG = 16
NKEYS = 40
PIPELINE = "p"
GBK = state_layout.gbk("ref_PCollection_grouped")
CELLS = state_layout.user_state("stage-counts")
TIMERS = state_layout.user_timers("stage-counts")
NAMESPACES = (GBK, CELLS, TIMERS)
STAGES = {"gbk:grouped": (GBK,), "stage-counts": (CELLS, TIMERS)}
KEYS = [b"key-%d" % i for i in range(NKEYS)]
DAMAGE = ("flipped", "cut", "deleted")

TMP = "/dev/shm" if os.path.isdir("/dev/shm") else None  # a tmpfs: fsyncs cost nothing
Model = dict[str, dict[bytes, bytes]]
SEEN: Counter[str] = Counter()  # what the examples exercised (`test_..._match_the_model`)


@dataclass(frozen=True)
class Round:
    """One round: per change (namespace, key index, value seed or None: delete); the task
    attempts killed before the one that reports (stage, subtask mod parallelism, how: its
    message lost, or it died after staging); whether the round fails before its commit; where
    each task runs: on which of two executors, and which of the executor's two workers."""

    changes: list[tuple[str, int, int | None]]
    kills: list[tuple[str, int, str]] = field(default_factory=list)
    flush_bytes: int = 1 << 20
    fails: bool = False
    placement: int = 0  # a task runs on worker (subtask + attempt + this) % 4 of the four


value_st = st.integers(-30, 99).map(lambda n: None if n < 0 else n)  # a quarter deletes
memory_st = st.sampled_from((staged_state.DEFAULT_MEMORY_BYTES, 300))

rounds_st = st.lists(
    st.builds(
        Round,
        changes=st.lists(
            st.tuples(st.sampled_from(NAMESPACES), st.integers(0, NKEYS - 1), value_st),
            max_size=8,
        ),
        kills=st.lists(
            st.tuples(st.sampled_from(sorted(STAGES)), st.integers(0, 2),
                      st.sampled_from(("lost", "died"))),
            max_size=2,
        ),
        flush_bytes=st.sampled_from((1 << 20, 120)),  # one segment per attempt, or several
        fails=st.sampled_from((False, False, False, True)),
        placement=st.sampled_from((0, 0, 0, 1, 2, 3)),  # mostly where it ran before
    ),
    min_size=1,
    max_size=3,
)  # fmt: skip


def _value(namespace: str, n: int) -> bytes:
    """A value of ``n``: the namespace's version byte, then 0-150 bytes that do not compress
    (read back as bytes: only the version byte is checked)."""
    version = state_layout.V2 if namespace == TIMERS else state_layout.V1
    return bytes([version]) + b"v%d-" % n + random.Random(n).randbytes(n * 37 % 151)


def _empty() -> Model:
    return {ns: {} for ns in NAMESPACES}


class TaskCommitMachine(RuleBasedStateMachine):
    """The model: per namespace, the state as of the last committed checkpoint (what the next
    round's tasks read), and of every committed checkpoint with the round that made it."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="task-commit-prop-", dir=TMP)
        self.url = os.path.join(self.tmp, "store")
        self.executors = Executors(self.tmp)  # two, of two Python workers each
        self.memory_bytes = staged_state.DEFAULT_MEMORY_BYTES
        self.store = open_store(self.url, max_key_groups=MKG, retain=2)
        self.st = self.store.pipeline(PIPELINE)
        self.parallelism = 2
        self.model: Model = _empty()
        self.committed: dict[int, tuple[Model, int]] = {}
        self.checkpoint_id: int | None = None
        self.round_no = 0
        self.damaged: dict[str, bytes] = {}  # file name -> its bytes before the damage
        self.set_aside: set[int] = set()

    def teardown(self) -> None:
        join_background_snapshots()
        held_state.release()
        self.store.close()
        task_store = staged_state._STORES.pop(self.url, None)
        if task_store is not None:
            task_store.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- the tasks ---------------------------------------------------------------------------
    def _attempt(self, stage: str, sub: int, attempt: int, wanted, dies: bool):
        """One task attempt of ``stage``; its read must be the model's state of its groups."""
        task = Attempt(
            self.url, PIPELINE, stage, self.round_no, sub, attempt, self.checkpoint_id,
            self.parallelism, MKG, self.flush_bytes, self.memory_bytes,
        )  # fmt: skip
        self.executors.enter(*divmod((sub + attempt + self.on) % 4, 2))
        groups = key_group_range(sub, self.parallelism, MKG)
        if stage == "gbk:grouped":
            read, msg = gbk_task(task, GBK, wanted[GBK], dies)
            reads = {GBK: read}
        else:
            reads, msg = stateful_task(task, {ns: wanted[ns] for ns in STAGES[stage]}, dies)
        join_background_snapshots()  # the next attempt finds them done, in every replay
        for ns, read in reads.items():
            mine = {k: v for k, v in self.model[ns].items() if key_group(k, MKG) in groups}
            assert read == mine, f"subtask {sub}/{self.parallelism} read {ns!r} wrongly"
        return msg

    def _run_tasks(self, spec: Round) -> list:
        """Every task of both stages, after its killed attempts; the last attempts' messages."""
        self.flush_bytes, self.on = spec.flush_bytes, spec.placement
        messages = []
        for stage, spaces in STAGES.items():
            for sub in range(self.parallelism):
                groups = key_group_range(sub, self.parallelism, MKG)
                mine = {
                    ns: {k: v for k, v in self._wanted[ns].items() if key_group(k, MKG) in groups}
                    for ns in spaces
                }
                p = self.parallelism
                killed = [how for s, raw, how in spec.kills if s == stage and raw % p == sub]
                for attempt, how in enumerate(killed):  # staged, never committed
                    self._attempt(stage, sub, attempt, mine, dies=how == "died")
                messages.append(self._attempt(stage, sub, len(killed), mine, dies=False))
        return messages

    def _round(self, spec: Round) -> None:
        """The tasks stage, then the driver commits the last attempts; or the round fails
        before its commit: the loop restores the last checkpoint and runs the round again
        (the same round number, attempts from 0)."""
        self._wanted = _empty()
        for ns, i, n in spec.changes:
            self._wanted[ns][KEYS[i]] = None if n is None else _value(ns, n)
        messages = self._run_tasks(spec)
        if spec.fails:
            info = self.st.restore(fingerprint="f")
            assert (info and info.checkpoint_id) == self.checkpoint_id
            return
        cid = self.st.checkpoint(
            fingerprint="f", parallelism=self.parallelism, metadata={"round": self.round_no},
            commit_messages=messages,
        )  # fmt: skip
        SEEN.update(
            "snapshot in the round" if snap.since is None else "background snapshot"
            for msg in messages
            for snap in msg.snapshots
        )
        for ns, wanted in self._wanted.items():
            for key, value in wanted.items():
                if value is None:
                    self.model[ns].pop(key, None)
                else:
                    self.model[ns][key] = value
        self.committed[cid] = ({ns: dict(s) for ns, s in self.model.items()}, self.round_no)
        self.checkpoint_id, self.round_no = cid, self.round_no + 1
        listed = self._ids()
        assert not self.set_aside & set(listed), "a set-aside checkpoint outlived a commit"
        self.set_aside = set()
        self._check(cid, parallelisms=(1 + cid % 3,))  # 1, 2, 3 in turn
        for older in listed:  # a fallback a damaged file would need: its files are all there
            if self._sound(older):
                self._files_kept(older)

    # -- rules -------------------------------------------------------------------------------
    @initialize(memory_bytes=memory_st)
    def budget(self, memory_bytes):
        """The tasks' memory budget: past it a read is held on the executor's disk."""
        self.memory_bytes = memory_bytes

    @rule(rounds=rounds_st)
    def run_rounds(self, rounds):
        for spec in rounds:
            self._round(spec)

    @rule(parallelism=st.integers(1, 3), memory_bytes=memory_st)
    def restart(self, parallelism, memory_bytes):
        """The job restarts at ``parallelism`` (new executors) and restores the last
        checkpoint; its tasks hold a read past ``memory_bytes`` on the executor's disk."""
        self.store.close()
        self.store = open_store(self.url, max_key_groups=MKG, retain=2)
        self.st = self.store.pipeline(PIPELINE)
        info = self.st.restore(fingerprint="f")
        assert (info and info.checkpoint_id) == self.checkpoint_id
        SEEN["rescale"] += parallelism != self.parallelism
        self.parallelism, self.memory_bytes = parallelism, memory_bytes
        self.executors.restart()
        if self.checkpoint_id is not None:
            self._check(self.checkpoint_id)

    @rule(executor=st.integers(0, 1), worker=st.none() | st.integers(0, 1))
    def lose_worker(self, executor, worker):
        """A Python worker died: the reads it kept are gone; or (None) its whole executor:
        its directory too (shared reads, held ranges, finished background snapshots)."""
        self.executors.lose(executor, worker)

    @precondition(lambda self: len(self.committed) > 1)  # one checkpoint: nothing to fall to
    @rule(data=st.data(), kind=st.sampled_from(DAMAGE))
    def damage_and_fall_back(self, data, kind):
        """A task finds a task-owned file of the newest checkpoint damaged; the driver falls
        back to the newest checkpoint whose files are all sound (or finds none)."""
        ids = self._ids()
        # In the manifest's order (names hold random ids: a replay must draw the same file);
        # one an older checkpoint does not name, if there is one (else none is sound).
        files = [f.name for f in self._manifest(self.checkpoint_id).task_state.files()]
        live = [c for c in ids if c not in self.set_aside]
        everywhere = set.intersection(*(set(self._manifest(c).file_names) for c in live))
        names = [n for n in files if n not in self.damaged and n not in everywhere]
        names = names or [n for n in files if n not in self.damaged]
        if not names:
            return
        name = data.draw(st.sampled_from(names), label="damaged file")
        original = damage(os.path.join(self.url, pipeline_dir(PIPELINE), name), kind)
        self.damaged[name] = original
        sound = [c for c in ids if self._sound(c)]
        cause = f"TaskStateDamagedError: Checkpoint file {name!r} is corrupt"
        if not sound:
            SEEN["no sound checkpoint"] += 1
            with pytest.raises(CheckpointCorruptError, match="is sound"):
                fall_back(self.store, PIPELINE, cause)
            self._repair()  # from a backup: the store is whole again
            return
        got = fall_back(self.store, PIPELINE, cause)
        if sound[-1] == ids[-1]:
            assert got is None  # the newest is sound: nothing set aside
            return
        assert got == sound[-1], (got, sound)
        SEEN["fallback"] += 1
        self.set_aside |= {c for c in ids if c > got}
        info = self.st.restore(fingerprint="f")
        assert info.checkpoint_id == got
        model, made_by = self.committed[got]
        self.model = {ns: dict(s) for ns, s in model.items()}
        self.checkpoint_id, self.round_no = got, made_by + 1  # the runner's next round
        self._check(got)

    # -- checks ------------------------------------------------------------------------------
    def _check(self, cid: int, parallelisms=(1, 2, 3)) -> None:
        """``cid`` read at each parallelism, each subtask its own key groups, is the model's;
        the key counts the tasks reported add up to it."""
        expected = self.committed[cid][0]
        for parallelism in parallelisms:
            got: Model = _empty()
            for sub in range(parallelism):
                groups = key_group_range(sub, parallelism, MKG)
                for ns, key, value in self.store.read_subtask_state(
                    PIPELINE, cid, sub, parallelism
                ):
                    assert key_group(key, MKG) in groups and key not in got[ns]
                    got[ns][key] = value
            assert got == expected, f"checkpoint {cid} read at parallelism {parallelism}"
        spaces = self._manifest(cid).task_state.namespaces
        counted = {ns: spaces[ns].entries if ns in spaces else 0 for ns in NAMESPACES}
        assert counted == {ns: len(s) for ns, s in expected.items()}, f"checkpoint {cid}"

    def _files_kept(self, cid: int) -> None:
        directory = os.path.join(self.url, pipeline_dir(PIPELINE))
        for f in self._manifest(cid).files:
            path = os.path.join(directory, f.name)
            assert os.path.getsize(path) == f.size, f"checkpoint {cid} lost {f.name}"

    def _ids(self) -> list[int]:
        return [i.checkpoint_id for i in self.store.list_checkpoints(PIPELINE)]

    def _manifest(self, cid: int):
        return self.store.load_manifest(PIPELINE, cid)

    def _sound(self, cid: int) -> bool:
        """The model of `restore.sound_checkpoint`: not set aside, no damaged file named."""
        return cid not in self.set_aside and not self._manifest(cid).file_names & set(self.damaged)

    def _repair(self) -> None:
        """Write the damaged files a checkpoint names back as they were (from a backup)."""
        named = {name for c in self._ids() for name in self._manifest(c).file_names}
        for name in named & set(self.damaged):
            with open(os.path.join(self.url, pipeline_dir(PIPELINE), name), "wb") as f:
                f.write(self.damaged[name])
        self.damaged = {}


EXAMPLES = int(os.environ.get("TASK_COMMIT_PROPERTY_EXAMPLES", "200"))
STEPS = int(os.environ.get("TASK_COMMIT_PROPERTY_STEPS", "4"))


def test_task_owned_commits_match_the_model(monkeypatch):
    from sparkbeam.checkpoint import commit, staging, task_state

    monkeypatch.setattr(task_state, "SNAPSHOT_MAX_SEGMENTS", 4)  # due after 2-3 segments
    monkeypatch.setattr(task_state, "SNAPSHOT_MIN_BYTES", 256)
    monkeypatch.setattr(staging, "SPLIT_BYTES", 300)  # larger ranges snapshot in parts
    monkeypatch.setattr(commit, "SWEEP_EVERY", 3)
    monkeypatch.setenv("SPARK_LOCAL_DIRS", "")  # restored after; each example sets its own
    monkeypatch.setattr(staged_state, "_READS", OrderedDict())  # restored after, too
    monkeypatch.setattr(shared_reads, "_SEEN", {})
    SEEN.clear()
    run_state_machine_as_test(
        TaskCommitMachine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            # The same examples every run: whether they take each path below must not be luck
            # (random draws took no fallback, or no background snapshot, in 2 of 5 runs).
            # Explore other draws with derandomize=False and --hypothesis-seed.
            derandomize=True,
            report_multiple_bugs=False,  # one counterexample, shrunk in minutes, not several
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
    print(f"paths taken: {dict(SEEN)}")
    if EXAMPLES >= 200:  # the paths the model is there for were taken
        paths = ("snapshot in the round", "background snapshot", "fallback", "rescale")
        assert all(SEEN[p] for p in paths), SEEN


def test_a_background_snapshot_swept_before_a_fallback_is_not_reported(tmp_path, monkeypatch):
    """A background snapshot's files are named for the last round that may report it, and
    swept once the rounds passed it; a fallback runs the rounds after the sound checkpoint
    again, so an executor still holding such a snapshot (its range went overdue on that
    executor, the later rounds ran on another) must not report it: the commit named files the
    sweep had deleted, and the next round's read of the range failed as damaged."""
    from sparkbeam.checkpoint import commit, task_state

    monkeypatch.setattr(task_state, "SNAPSHOT_MAX_SEGMENTS", 4)  # range [0, 8) due at 2
    monkeypatch.setattr(commit, "SWEEP_EVERY", 1)
    monkeypatch.setattr(shared_reads, "_SEEN", {})
    url = str(tmp_path / "store")
    monkeypatch.setenv("SPARK_LOCAL_DIRS", "")  # restored after, as these two are
    monkeypatch.setattr(staged_state, "_READS", staged_state._READS)
    executors = Executors(str(tmp_path))
    store = open_store(url, max_key_groups=MKG, retain=20)
    st = store.pipeline(PIPELINE)
    low, high = ([k for k in KEYS if (key_group(k, MKG) < 8) == lo] for lo in (True, False))
    state: dict[bytes, bytes] = {}
    made_by = {}

    def run(r: int, on: int, cid: int | None) -> int:
        """Round ``r``: subtask 0 (a change in [0, 8)) on executor ``on``, subtask 1 (a
        change in [8, 16) in round 6 only) on executor 0."""
        messages = []
        for sub, executor, changes in (
            (0, on, {low[r % len(low)]: _value(GBK, r)}),
            (1, 0, {high[0]: _value(GBK, 99)} if r == 6 else {}),
        ):
            executors.enter(executor, 0)
            task = Attempt(url, PIPELINE, "gbk", r, sub, 0, cid, 2, MKG, 1 << 20, 1 << 28)
            messages.append(gbk_task(task, GBK, changes)[1])
            join_background_snapshots()
            state.update(changes)
        cid = st.checkpoint(fingerprint="f", parallelism=2, commit_messages=messages)
        made_by[cid] = (r, dict(state))
        return cid

    cid = None
    # Round 5 (executor 0) starts a background snapshot of [0, 8), round 6 (1) another, round
    # 7 (0) finds the range overdue and snapshots it in the round; rounds 8-12 run on 1, the
    # sweeps delete round 5's snapshot (named for round 12) on 0, which nobody reported.
    for r, on in enumerate([0, 0, 0, 0, 0, 0, 1, 0, 1, 1, 1, 1, 1]):
        cid = run(r, on, cid)
    segment = next(
        f
        for f in store.load_manifest(PIPELINE, cid).task_state.files()
        if "r00000006/p00001" in f.name
    )
    os.remove(os.path.join(url, pipeline_dir(PIPELINE), segment.name))  # damage: back to 6
    assert fall_back(store, PIPELINE, "TaskStateDamagedError: ...") == 6
    assert st.restore(fingerprint="f").checkpoint_id == 6
    r, state = made_by[6]
    cid = run(r + 1, 0, 6)  # round 6 again, subtask 0 on executor 0
    assert store.verify(PIPELINE, cid).problems == ()
    got = {k: v for sub in (0, 1) for _, k, v in store.read_subtask_state(PIPELINE, cid, sub, 2)}
    assert got == state
    store.close()

"""Property test of the task-owned commit path against a model dict (issue 44, 7).

Tasks of two keyed stages -- a GroupByKey (one namespace) and a stateful DoFn (cells and
timers, staged by one writer) -- run the real task-side code (`owned_tasks`: read, stage,
`stage_range`, `keep_staged`) against a real local store, and the driver commits their
messages (`CheckpointChain.commit`). Random sequences of rounds, killed attempts (staged,
never committed), failed rounds, restarts at another parallelism, lost workers and executors,
and damaged task-owned files followed by the driver's fallback (`restore.fall_back`) must
leave every task's read, and every checkpoint read at any parallelism, as the model says: a
dict per namespace, rolled back to the sound checkpoint's on a fallback. The snapshot
thresholds are lowered so that ranges snapshot every few rounds: in the round, in the
background (reported by a later round), and when the commit asks for a fallback.
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
from owned_tasks import Attempt, gbk_task, join_background_snapshots, stateful_task

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
    message lost, or it died after staging); whether the round fails before its commit; on
    which of its executor's two Python workers each task runs."""

    changes: list[tuple[str, int, int | None]]
    kills: list[tuple[str, int, str]] = field(default_factory=list)
    flush_bytes: int = 1 << 20
    fails: bool = False
    workers: int = 0  # a task runs on worker (subtask + attempt + this) % 2 of its executor


value_st = st.integers(-30, 99).map(lambda n: None if n < 0 else n)  # a quarter deletes
memory_st = st.sampled_from((staged_state.DEFAULT_MEMORY_BYTES, 300))

rounds_st = st.lists(
    st.builds(
        Round,
        changes=st.lists(
            st.tuples(st.sampled_from(NAMESPACES), st.integers(0, NKEYS - 1), value_st),
            max_size=10,
        ),
        kills=st.lists(
            st.tuples(st.sampled_from(sorted(STAGES)), st.integers(0, 2),
                      st.sampled_from(("lost", "died"))),
            max_size=2,
        ),
        flush_bytes=st.sampled_from((1 << 20, 120)),  # one segment per attempt, or several
        fails=st.sampled_from((False, False, False, True)),
        workers=st.integers(0, 1),
    ),
    min_size=1,
    max_size=3,
)  # fmt: skip


def _value(n: int) -> bytes:
    """A value of ``n``: its version byte, then 0-150 bytes that do not compress."""
    return bytes([state_layout.V1]) + b"v%d-" % n + random.Random(n).randbytes(n * 37 % 151)


def _empty() -> Model:
    return {ns: {} for ns in NAMESPACES}


def _worker() -> tuple[OrderedDict, dict]:
    """A Python worker's process state: its kept reads, the shared reads it has seen."""
    return OrderedDict(), {}


class TaskCommitMachine(RuleBasedStateMachine):
    """The model: per namespace, the state as of the last committed checkpoint (what the next
    round's tasks read), and of every committed checkpoint with the round that made it."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="task-commit-prop-", dir=TMP)
        self.url = os.path.join(self.tmp, "store")
        self.executor = os.path.join(self.tmp, "blockmgr")
        os.environ["SPARK_LOCAL_DIRS"] = self.executor  # background snapshots' hand-off
        self.workers = [_worker(), _worker()]  # the executor's Python workers
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
        # The worker's own reads and what it saw of the executor's shared ones.
        staged_state._READS, shared_reads._SEEN = self.workers[(sub + attempt + self.on) % 2]
        groups = key_group_range(sub, self.parallelism, MKG)
        if stage == "gbk:grouped":
            read, msg = gbk_task(task, GBK, wanted[GBK], dies)
            reads = {GBK: read}
        else:
            reads, msg = stateful_task(task, {ns: wanted[ns] for ns in STAGES[stage]}, dies)
        for ns, read in reads.items():
            mine = {k: v for k, v in self.model[ns].items() if key_group(k, MKG) in groups}
            assert read == mine, f"subtask {sub}/{self.parallelism} read {ns!r} wrongly"
        return msg

    def _run_tasks(self, spec: Round) -> list:
        """Every task of both stages, after its killed attempts; the last attempts' messages."""
        self.flush_bytes, self.on = spec.flush_bytes, spec.workers
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
        join_background_snapshots()
        return messages

    def _round(self, spec: Round) -> None:
        """The tasks stage, then the driver commits the last attempts; or the round fails
        before its commit: the loop restores the last checkpoint and runs the round again
        (the same round number, attempts from 0)."""
        self._wanted = _empty()
        for ns, i, n in spec.changes:
            self._wanted[ns][KEYS[i]] = None if n is None else _value(n)
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
        self._check(cid, parallelisms=(3,))
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

    @rule(
        parallelism=st.integers(1, 3),
        new_workers=st.booleans(),
        memory_bytes=memory_st,
    )
    def restart(self, parallelism, new_workers, memory_bytes):
        """The driver restarts at ``parallelism`` and restores the last checkpoint; its tasks
        hold a read past ``memory_bytes`` on the executor's disk."""
        self.store.close()
        self.store = open_store(self.url, max_key_groups=MKG, retain=2)
        self.st = self.store.pipeline(PIPELINE)
        info = self.st.restore(fingerprint="f")
        assert (info and info.checkpoint_id) == self.checkpoint_id
        SEEN["rescale"] += parallelism != self.parallelism
        self.parallelism, self.memory_bytes = parallelism, memory_bytes
        if new_workers:
            self.lose_worker(worker=None)
        if self.checkpoint_id is not None:
            self._check(self.checkpoint_id)

    @rule(worker=st.none() | st.integers(0, 1))
    def lose_worker(self, worker):
        """A Python worker died: the reads it kept are gone; or (None) its whole executor:
        its directory too (shared reads, held ranges, finished background snapshots)."""
        if worker is not None:
            self.workers[worker] = _worker()
            return
        held_state.release()
        self.workers = [_worker(), _worker()]
        shutil.rmtree(self.executor, ignore_errors=True)

    @precondition(lambda self: self.checkpoint_id is not None)
    @rule(data=st.data(), kind=st.sampled_from(DAMAGE))
    def damage_and_fall_back(self, data, kind):
        """A task-owned file of a checkpoint is damaged; the driver falls back to the newest
        checkpoint whose files are all sound (none newer left, or none sound at all)."""
        ids = self._ids()
        of = data.draw(st.sampled_from(ids[::-1]), label="checkpoint")
        # In the manifest's order (names hold random ids: a replay must draw the same file).
        files = self._manifest(of).task_state.files()
        names = [f.name for f in files if f.name not in self.damaged]
        if not names:
            return
        name = data.draw(st.sampled_from(names), label="damaged file")
        self._damage(name, kind)
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

    def _damage(self, name: str, kind: str) -> None:
        path = os.path.join(self.url, pipeline_dir(PIPELINE), name)
        with open(path, "rb") as f:
            data = f.read()
        self.damaged.setdefault(name, data)
        if kind == "deleted":
            os.remove(path)
            return
        damaged = bytearray(data)
        if kind == "flipped":
            damaged[len(damaged) // 2] ^= 0xFF
        else:
            del damaged[len(damaged) // 2 :]
        with open(path, "wb") as f:
            f.write(damaged)

    def _repair(self) -> None:
        """Write the damaged files a checkpoint names back as they were (from a backup)."""
        named = {name for c in self._ids() for name in self._manifest(c).file_names}
        for name in named & set(self.damaged):
            with open(os.path.join(self.url, pipeline_dir(PIPELINE), name), "wb") as f:
                f.write(self.damaged[name])
        self.damaged = {}


EXAMPLES = int(os.environ.get("TASK_COMMIT_PROPERTY_EXAMPLES", "200"))
STEPS = int(os.environ.get("TASK_COMMIT_PROPERTY_STEPS", "6"))


def test_task_owned_commits_match_the_model(monkeypatch):
    from sparkbeam.checkpoint import commit, staging, task_state

    monkeypatch.setattr(task_state, "SNAPSHOT_MAX_SEGMENTS", 4)  # due after 2-3 segments
    monkeypatch.setattr(task_state, "SNAPSHOT_MIN_BYTES", 512)
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
            report_multiple_bugs=False,  # one counterexample, shrunk in minutes, not several
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
    if EXAMPLES >= 200:  # the paths the model is there for were taken (tens of times each)
        paths = ("snapshot in the round", "background snapshot", "fallback", "rescale")
        assert all(SEEN[p] for p in paths), SEEN

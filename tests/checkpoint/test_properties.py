"""Property test: any sequence of writes, checkpoints, materializations, staged commits, crashes,
restores and rescaled reads gives the same state as a plain dict model, and the store retains
exactly the newest RETAIN checkpoints plus the newest older one sharing no file with the newest
(the fallback a damaged shared file cannot take down)."""

from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sparkbeam.checkpoint import LocalStorage, MemoryStorage, open_store

MAX_KG = 16
RETAIN = 3
namespaces = st.sampled_from(["a", "b/state", ""])
keys = st.binary(max_size=6)
values = st.binary(max_size=40)


class StoreMachine(RuleBasedStateMachine):
    state_backend = "memory"

    def __init__(self):
        super().__init__()
        self.storage = self._storage()
        self._open()
        self.working: dict[tuple[str, bytes], bytes] = {}
        self.committed: dict[int, dict[tuple[str, bytes], bytes]] = {}
        self.files: dict[int, frozenset[str]] = {}  # what each checkpoint's manifest names
        self.retained: list[int] = []
        self.round = 0

    def _open(self):
        # break_lock: the previous store object is abandoned, as after a crash, which also
        # loses its working copy (a RocksDB one in a temp directory, else left behind).
        if hasattr(self, "st"):
            self.st.table.close()
        self.store = open_store(
            self.storage,
            max_key_groups=MAX_KG,
            retain=RETAIN,
            flush_bytes=300,
            materialization_interval_s=None,
            materialization_files=3,
            state_backend=self.state_backend,
            break_lock=True,
        )
        self.st = self.store.pipeline("pipe")

    def _storage(self):
        return MemoryStorage()

    @rule(ns=namespaces, key=keys, value=values)
    def put(self, ns, key, value):
        self.st.put(ns, key, value)
        self.working[(ns, key)] = value

    @rule(data=st.data())
    def delete(self, data):
        if self.working and data.draw(st.booleans()):
            ns, key = data.draw(st.sampled_from(sorted(self.working)))
        else:
            ns, key = data.draw(namespaces), data.draw(keys)
        self.st.delete(ns, key)
        self.working.pop((ns, key), None)

    @rule(parallelism=st.integers(1, MAX_KG))
    def checkpoint(self, parallelism):
        cid = self.st.checkpoint(fingerprint="fp", parallelism=parallelism)
        self._committed(cid)

    @rule(
        writes=st.lists(st.tuples(namespaces, keys, st.none() | values), max_size=8),
        partitions=st.integers(1, 3),
        duplicate=st.booleans(),
    )
    def staged_round(self, writes, partitions, duplicate):
        """Tasks stage writes (each partition maybe twice); the driver commits one attempt."""
        self.round += 1
        msgs = []
        for p in range(partitions):
            mine = writes[p::partitions]
            attempts = [0, 1] if duplicate else [0]
            for attempt in attempts:
                w = self.store.staged_writer("pipe", "stage", self.round, p, attempt)
                for ns, key, value in mine:
                    if value is None:
                        w.delete(ns, key)
                    else:
                        w.put(ns, key, value + bytes([attempt]))
                msg = w.finish()
                if attempt == attempts[-1]:
                    msgs.append(msg)
                    for ns, key, value in mine:
                        if value is None:
                            self.working.pop((ns, key), None)
                        else:
                            self.working[(ns, key)] = value + bytes([attempt])
        cid = self.st.checkpoint(fingerprint="fp", commit_messages=msgs)
        self._committed(cid)

    def _committed(self, cid: int) -> None:
        """The model of a commit and of retention: newest RETAIN, plus the fallback."""
        self.committed[cid] = dict(self.working)
        self.files[cid] = frozenset(f.name for f in self.store.load_manifest("pipe", cid).files)
        ids = sorted([*self.retained, cid])
        older = [c for c in ids[:-1] if self.files[c].isdisjoint(self.files[cid])]
        self.retained = sorted(set(ids[-RETAIN:]) | set(older[-1:]))

    @rule()
    def materialize(self):
        self.st.materialize()

    def _retained(self):
        return self.retained

    @rule()
    def crash_and_restore_latest(self):
        self._open()
        info = self.st.restore(fingerprint="fp")
        if not self.committed:
            assert info is None
            self.working = {}
        else:
            latest = max(self.committed)
            assert info.checkpoint_id == latest
            self.working = dict(self.committed[latest])

    @precondition(lambda self: self.committed)
    @rule(data=st.data())
    def restore_older(self, data):
        cid = data.draw(st.sampled_from(self._retained()))
        self.st.restore(cid)
        self.working = dict(self.committed[cid])

    @precondition(lambda self: self.committed)
    @rule(data=st.data(), parallelism=st.integers(1, MAX_KG))
    def rescaled_read(self, data, parallelism):
        cid = data.draw(st.sampled_from(self._retained()))
        union = {}
        for sub in range(parallelism):
            for ns, key, value in self.store.read_subtask_state("pipe", cid, sub, parallelism):
                assert (ns, key) not in union, "a key in two subtasks"
                union[(ns, key)] = value
        assert union == self.committed[cid]

    @invariant()
    def working_state_matches_model(self):
        assert {(ns, k): v for ns, k, v in self.st.items()} == self.working
        assert len(self.st) == len(self.working)

    @invariant()
    def only_retained_checkpoints_are_listed(self):
        listed = [i.checkpoint_id for i in self.store.list_checkpoints("pipe")]
        assert listed == self._retained()

    def teardown(self):
        self.store.close()


class LocalRocksDBMachine(StoreMachine):
    """The same machine on real files with the RocksDB working copy."""

    state_backend = "rocksdb"

    def _storage(self):
        self.tmp = tempfile.mkdtemp(prefix="ckpt-prop-")
        return LocalStorage(self.tmp)

    def teardown(self):
        super().teardown()
        shutil.rmtree(self.tmp, ignore_errors=True)


EXAMPLES = int(os.environ.get("CHECKPOINT_PROPERTY_EXAMPLES", "60"))
StoreMachine.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
LocalRocksDBMachine.TestCase.settings = settings(
    StoreMachine.TestCase.settings, max_examples=max(5, EXAMPLES // 6)
)
TestStoreMachine = StoreMachine.TestCase
TestLocalRocksDBMachine = LocalRocksDBMachine.TestCase

"""A writer killed with SIGKILL at random points: every restore yields exactly the last
committed checkpoint (or the one whose manifest landed just before the kill)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

from crash_writer import MAX_KG, expected_state

from sparkbeam.checkpoint import key_group_range, open_store

WRITER = os.path.join(os.path.dirname(__file__), "crash_writer.py")
KILLS = int(os.environ.get("CHECKPOINT_CRASH_KILLS", "24"))


def _run_and_kill(root: str, delay: float) -> int:
    """Start the writer, SIGKILL it ``delay`` s after it is ready; last printed commit id."""
    proc = subprocess.Popen(
        [sys.executable, WRITER, root], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    lines: list[str] = []
    ready = threading.Event()

    def pump():
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("READY"):
                ready.set()
        ready.set()

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    assert ready.wait(30), "writer did not start"
    time.sleep(delay)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    t.join(5)
    err = proc.stderr.read()
    assert proc.returncode == -signal.SIGKILL, f"writer failed before the kill:\n{err}"
    complete = [x.split() for x in lines if x.endswith("\n")]  # the kill may cut the last
    committed = [int(f[1]) for f in complete if f[0] in ("COMMITTED", "READY")]
    return max(committed)


def test_sigkill_at_random_points_restores_last_committed(tmp_path):
    root = str(tmp_path / "store")
    rng = random.Random(20260)
    last = 0
    outcomes: list[int] = []
    for i in range(KILLS):
        delay = rng.choice([0.0, 0.001, 0.005]) if i % 4 == 0 else rng.uniform(0.0, 0.12)
        printed = _run_and_kill(root, delay)
        assert printed >= last, "a committed checkpoint disappeared"
        with open_store(root, max_key_groups=MAX_KG, retain=2) as store:
            st = store.pipeline("crash")
            info = st.restore(fingerprint="crash")
            restored = info.checkpoint_id if info else 0
            # The manifest of `printed + 1` may have landed just before the kill.
            assert restored in (printed, printed + 1), (restored, printed)
            expected = expected_state(restored)
            assert {(ns, k): v for ns, k, v in st.items()} == expected
            if restored:
                assert st.source_positions() == {"src": b"%d" % restored}
                assert store.verify("crash", restored).ok
                p = 1 + i % 4
                union = {}
                for sub in range(p):
                    assert key_group_range(sub, p, MAX_KG)
                    for ns, k, v in store.read_subtask_state("crash", restored, sub, p):
                        assert (ns, k) not in union
                        union[(ns, k)] = v
                assert union == expected
            outcomes.append(restored - printed)
            last = restored
    assert last >= 3, f"the writer made too little progress ({last} checkpoints)"
    print(f"{KILLS} kills, {last} checkpoints, {sum(outcomes)} kills right after a manifest")


def test_clean_after_crashes_keeps_restorable_state(tmp_path):
    root = str(tmp_path / "store")
    for delay in (0.15, 0.05, 0.1):
        printed = _run_and_kill(root, delay)
    assert printed > 0
    with open_store(root, max_key_groups=MAX_KG) as store:
        store.clean(grace_s=0)
        st = store.pipeline("crash")
        info = st.restore()
        assert info.checkpoint_id >= printed
        assert {(ns, k): v for ns, k, v in st.items()} == expected_state(info.checkpoint_id)

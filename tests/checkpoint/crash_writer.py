"""Writer process for the crash test, and the model of what each checkpoint must contain.

``python crash_writer.py ROOT`` restores pipeline "crash" (taking over the dead previous
writer's lock), then commits checkpoints n+1, n+2, ... forever, printing ``COMMITTED n`` after
each; the test kills it with SIGKILL at random moments. Round n's operations depend only on n,
so the state of checkpoint n is `expected_state(n)` however often the writer was killed.
"""

from __future__ import annotations

import sys

MAX_KG = 32


def round_ops(n: int):
    """(driver ops, staged ops per partition, materialize?) of round n."""
    driver = [
        ("put", "ns", b"k%d" % ((n * 13 + i * 7) % 200), b"%d-%d" % (n, i)) for i in range(20)
    ]
    driver.append(("delete", "ns", b"k%d" % ((n * 31) % 200), b""))
    staged = {
        p: [("put", "staged", b"s%d" % ((n * 5 + p * 3) % 50), b"%d/%d" % (n, p))]
        + [("delete", "staged", b"s%d" % ((n * 7 + p) % 50), b"")]
        for p in range(2)
    }
    return driver, staged, n % 4 == 0


def expected_state(n: int) -> dict:
    state: dict = {}
    for r in range(1, n + 1):
        driver, staged, _ = round_ops(r)
        for ops in [driver, staged[0], staged[1]]:
            for op, ns, key, value in ops:
                if op == "put":
                    state[(ns, key)] = value
                else:
                    state.pop((ns, key), None)
    return state


def main(root: str) -> None:
    from sparkbeam.checkpoint import open_store

    store = open_store(root, max_key_groups=MAX_KG, retain=2, flush_bytes=400, job_name="crash")
    st = store.pipeline("crash")
    info = st.restore(fingerprint="crash")
    n = info.checkpoint_id if info else 0
    print("READY", n, flush=True)
    while True:
        n += 1
        driver, staged, materialize = round_ops(n)
        for op, ns, key, value in driver:
            st.put(ns, key, value) if op == "put" else st.delete(ns, key)
        msgs = []
        for p, ops in staged.items():
            for attempt in (0, 1) if n % 2 else (0,):
                w = store.staged_writer("crash", "stage", n, p, attempt)
                for op, ns, key, value in ops:
                    w.put(ns, key, value) if op == "put" else w.delete(ns, key)
                msg = w.finish()
            msgs.append(msg)
        if materialize:
            st.materialize()
        st.mark_completed("split-%d" % (n % 10))
        st.set_source_position("src", b"%d" % n)
        cid = st.checkpoint(fingerprint="crash", parallelism=1 + n % 4, commit_messages=msgs)
        assert cid == n, (cid, n)
        print("COMMITTED", n, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])

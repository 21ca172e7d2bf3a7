"""A worker's read-only store does not keep every manifest it ever loaded (issue 43, 4).

Each round's tasks load that round's manifest through their worker's read-only store
(``runner.task.staged_state.task_store``), which cached every one for the life of the worker:
its heap grew by a manifest a round, and with it the full garbage collection PySpark runs after
each task. In a soak without Kafka (PeriodicImpulse in, a windowed side input) a worker's
objects went from 6,000 to 64,000 in four minutes, most of them manifests' FileEntry and
RangeState, and each collection from 5 ms to 72 ms.
"""

from __future__ import annotations

from sparkbeam.checkpoint import open_store
from sparkbeam.checkpoint import store as store_module


def test_a_read_only_store_keeps_a_bounded_number_of_manifests(tmp_path):
    url = str(tmp_path / "store")
    checkpoints = store_module.READ_ONLY_MANIFESTS * 3
    with open_store(url, retain=checkpoints) as writer:
        state = writer.pipeline("p")
        ids = []
        for i in range(checkpoints):
            state.put("sink-pending", b"k%d" % i, b"\x01v")
            ids.append(state.checkpoint(metadata={"round": i}))
    reader = open_store(url, read_only=True)
    for i, cid in enumerate(ids):  # as a worker does, a round after another
        assert reader.load_manifest("p", cid).metadata["round"] == i
        assert len(reader._manifest_cache) <= store_module.READ_ONLY_MANIFESTS
    assert reader.load_manifest("p", ids[0]).checkpoint_id == ids[0]  # read again if asked
    reader.close()

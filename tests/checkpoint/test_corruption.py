"""Damaged files are detected, reported with the file and the reason, and skipped."""

from __future__ import annotations

import logging
import os
import re

import pytest

from sparkbeam.checkpoint import CheckpointCorruptError, open_store
from sparkbeam.checkpoint.layout import pipeline_dir


def _build(root):
    """Two checkpoints whose files are disjoint: c1 = (M1, [s1]), c2 = (M2, [s2, staged])."""
    with open_store(root, max_key_groups=16, materialization_files=2) as store:
        st = store.pipeline("p")
        for i in range(100):
            st.put("n", b"%d" % i, b"one")
        st.materialize()
        st.put("n", b"extra1", b"x")
        c1 = st.checkpoint(fingerprint="f")
        state1 = dict(((ns, k), v) for ns, k, v in st.items())
        for i in range(100):
            st.put("n", b"%d" % i, b"two")
        st.materialize()
        st.put("n", b"extra2", b"y")
        w = store.staged_writer("p", "stage", 1, 0, 0)
        w.put("n", b"staged", b"z")
        c2 = st.checkpoint(fingerprint="f", commit_messages=[w.finish()])
        m2 = store.load_manifest("p", c2)
    return c1, c2, state1, m2


def _target(root, m2, kind):
    d = os.path.join(root, pipeline_dir("p"))
    if kind == "manifest":
        return os.path.join(d, "manifests", "chk-%010d.json" % m2.checkpoint_id)
    if kind == "materialization":
        return os.path.join(d, m2.materialization[-1].name)
    if kind == "changelog":
        return os.path.join(d, next(f.name for f in m2.changelog if "changelog/" in f.name))
    return os.path.join(d, next(f.name for f in m2.changelog if "staged/" in f.name))


def _damage(path, how):
    data = open(path, "rb").read()
    if how == "flip":
        i = len(data) // 2
        data = data[:i] + bytes([data[i] ^ 0x5A]) + data[i + 1 :]
    elif how == "truncate":
        data = data[: len(data) // 2]
    elif how == "empty":
        data = b""
    if how == "delete":
        os.remove(path)
    else:
        with open(path, "wb") as f:
            f.write(data)


KINDS = ["manifest", "materialization", "changelog", "staged"]
DAMAGE = ["flip", "truncate", "empty", "delete"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", DAMAGE)
def test_damage_is_detected_and_restore_falls_back(tmp_path, caplog, kind, how):
    root = str(tmp_path / "store")
    c1, c2, state1, m2 = _build(root)
    target = _target(root, m2, kind)
    _damage(target, how)
    rel = os.path.relpath(target, root)
    with open_store(root, max_key_groups=16) as store:
        if not (kind == "manifest" and how == "delete"):
            result = store.verify("p", c2)
            assert not result.ok
            assert any(rel in p for p in result.problems), result.problems
            with pytest.raises(CheckpointCorruptError, match=r"Checkpoint file .* is corrupt: "):
                store.pipeline("p").restore(c2)
            assert store.verify("p", c1).ok
        st = store.pipeline("p")
        with caplog.at_level(logging.WARNING, logger="sparkbeam.checkpoint"):
            info = st.restore(fingerprint="f")
        assert info.checkpoint_id == c1
        assert dict(((ns, k), v) for ns, k, v in st.items()) == state1
        if not (kind == "manifest" and how == "delete"):
            warning = " ".join(r.getMessage() for r in caplog.records)
            assert "Checkpoint 2 of pipeline 'p' is unusable" in warning
            assert os.path.basename(target) in warning
        # The next checkpoint after the fallback is a new id, and restores.
        st.put("n", b"after", b"fallback")
        c3 = st.checkpoint(fingerprint="f")
        # A deleted manifest leaves no trace, so its id is simply used again.
        assert c3 == (c2 if (kind, how) == ("manifest", "delete") else c2 + 1)
        assert sorted(k for _, k, _ in store.read_subtask_state("p", c3, 0, 1)) == sorted(
            [k for (_, k) in state1] + [b"after"]
        )


@pytest.mark.parametrize(
    "kind,how,reason",
    [
        ("manifest", "truncate", "manifest is not valid JSON"),
        ("manifest", "empty", "manifest is not valid JSON"),
        ("materialization", "flip", "checksum crc32:[0-9a-f]+ does not match the manifest's"),
        ("materialization", "truncate", "size is [0-9]+ bytes, the manifest says"),
        ("changelog", "flip", "checksum .* does not match"),
        ("changelog", "delete", "file is missing"),
    ],
)
def test_error_names_file_and_reason(tmp_path, kind, how, reason):
    root = str(tmp_path / "store")
    _c1, c2, _s, m2 = _build(root)
    target = _target(root, m2, kind)
    _damage(target, how)
    with open_store(root) as store:
        with pytest.raises(CheckpointCorruptError, match=reason) as err:
            store.pipeline("p").restore(c2)
    assert os.path.basename(target) in str(err.value)
    # What a restart does, not a claim that this restore fell back (it did not: it was asked
    # for this checkpoint).
    assert "A restart restores the newest checkpoint whose files are all sound" in str(err.value)


def test_flipped_manifest_byte_that_keeps_valid_json_fails_checksum(tmp_path):
    root = str(tmp_path / "store")
    _c1, c2, _s, m2 = _build(root)
    path = _target(root, m2, "manifest")
    original = open(path).read()
    text = re.sub(r'"entries": ?', '"entries":9', original, count=1)
    assert text != original
    open(path, "w").write(text)
    with open_store(root) as store:
        with pytest.raises(CheckpointCorruptError, match="manifest checksum .* does not match"):
            store.load_manifest("p", c2)


def test_segment_footer_detects_damage_without_a_manifest(tmp_path):
    from sparkbeam.checkpoint.changelog import ChangelogWriter, Op, check_segment
    from sparkbeam.checkpoint.filesystem import LocalStorage

    s = LocalStorage(str(tmp_path))
    w = ChangelogWriter(s, "d", "w")
    for i in range(50):
        w.append(Op.PUT, 0, "n", b"%d" % i, b"v")
    entry = w.flush()
    data = s.read(f"d/{entry.name}")
    assert check_segment(data, "x") == 50
    with pytest.raises(CheckpointCorruptError, match="torn changelog segment"):
        check_segment(data[:-3], "seg-file")
    flipped = data[:20] + bytes([data[20] ^ 1]) + data[21:]
    with pytest.raises(CheckpointCorruptError, match="'seg-file' is corrupt: .*crc32"):
        check_segment(flipped, "seg-file")


def test_segments_are_compressed_and_segments_written_before_still_read(tmp_path):
    """A state-key-shaped record (namespace, key, a state key repeating it, random value) takes
    about 0.6 of its bytes in a segment; a version-1 segment (uncompressed) reads the same."""
    import struct
    import zlib

    from sparkbeam.checkpoint.changelog import ChangelogWriter, Op, iter_records, read_segment
    from sparkbeam.checkpoint.filesystem import LocalStorage

    s = LocalStorage(str(tmp_path))
    w = ChangelogWriter(s, "d", "w")
    records = []
    for i in range(2000):
        key = b"key-%09d" % (i * 7919 % 100_000)
        value = b"ParDo(Remember)\x12\x05value" + key + os.urandom(100)
        records.append((Op.PUT, i % 128, "user-state/stage-5", key, value))
        w.append(*records[-1])
    for _, kg, ns, key, _ in records[:50]:  # later changes of the same keys
        records.append((Op.DELETE, kg, ns, key, b""))
        w.append(*records[-1])
    entry = w.flush()
    raw = sum(13 + len(ns) + len(k) + len(v) for _, _, ns, k, v in records)
    assert entry.size < 0.75 * raw, (entry.size, raw)
    got = list(iter_records(read_segment(s, f"d/{entry.name}", entry), "x"))
    assert sorted(got) == sorted(records)  # in key-group blocks: each key's changes in order

    def per_key(rs):
        twice = [k for _, _, _, k, _ in records[:50]]
        return {k: [(op, v) for op, _, _, k2, v in rs if k2 == k] for k in twice}

    assert per_key(got) == per_key(records)

    body = b"SBCL\x01\x00\x00\x00" + b"".join(
        struct.pack("<BHHII", op, kg, len(ns), len(k), len(v)) + ns.encode() + k + v
        for op, kg, ns, k, v in records
    )
    v1 = body + struct.pack("<QI8s", len(records), zlib.crc32(body), b"SBCLEND1")
    s.write("d/v1.seg", v1)
    assert list(iter_records(read_segment(s, "d/v1.seg"), "v1")) == records


def test_all_checkpoints_damaged_raises_instead_of_starting_empty(tmp_path):
    root = str(tmp_path / "store")
    _c1, _c2, _s, m2 = _build(root)
    d = os.path.join(root, pipeline_dir("p"), "manifests")
    for name in os.listdir(d):
        _damage(os.path.join(d, name), "truncate")
    with open_store(root) as store:
        with pytest.raises(CheckpointCorruptError, match="all 2 checkpoints .* are damaged"):
            store.pipeline("p").restore()


def test_a_segment_read_by_its_blocks_checks_what_it_reads(tmp_path):
    """A reader of some key groups reads only their blocks (ranged reads): each block and the
    block index carry a crc32, so a flipped byte in what it reads is refused, naming the file."""
    from sparkbeam.checkpoint.changelog import ChangelogWriter, Op, read_records
    from sparkbeam.checkpoint.filesystem import LocalStorage
    from sparkbeam.checkpoint.keygroups import KeyGroupRange

    s = LocalStorage(str(tmp_path))
    w = ChangelogWriter(s, "d", "w")
    for i in range(2000):
        w.append(Op.PUT, i % 64, "ns", b"k%d" % i, os.urandom(200))
    entry = w.flush()
    assert (entry.kg_start, entry.kg_stop) == (0, 64)
    low, high = KeyGroupRange(0, 32), KeyGroupRange(32, 64)
    in_low = sum(1 for i in range(2000) if i % 64 < 32)
    assert len(list(read_records(s, f"d/{entry.name}", entry, low))) == in_low
    data = open(tmp_path / "d" / entry.name, "rb").read()
    at = 100  # inside the first block (key groups 0-7)
    (tmp_path / "d" / entry.name).write_bytes(data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :])
    with pytest.raises(CheckpointCorruptError, match=r"'d/w-.*' is corrupt: a block .*crc32"):
        list(read_records(s, f"d/{entry.name}", entry, low))
    assert len(list(read_records(s, f"d/{entry.name}", entry, high))) == 2000 - in_low
    at = len(data) - 40  # inside the block index
    (tmp_path / "d" / entry.name).write_bytes(data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :])
    with pytest.raises(CheckpointCorruptError, match=r"block index is damaged"):
        list(read_records(s, f"d/{entry.name}", entry, high))

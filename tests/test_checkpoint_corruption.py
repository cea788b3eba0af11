"""Damaged checkpoints must raise CorruptCheckpointError naming the file (and the key group and
block where it applies), never return wrong or partial state: flipped bytes at every position of
a data file (blocks, footer, trailer, header) and of a manifest, truncation at every length,
appended bytes, missing and replaced files."""

from __future__ import annotations

import os
import random
import struct

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from statecore.checkpoint import CheckpointStore
from statecore.checkpoint.format import (
    HEADER_SIZE,
    TRAILER_SIZE,
    DataFileReader,
    decode_block,
    encode_block,
)
from statecore.errors import CheckpointNotFoundError, CorruptCheckpointError
from statecore.key_groups import KeyGroupRange
from support.data_files import DataFileLayout
from support.manifests import forge_manifest_file


class Snap:
    """Minimal StateSnapshot over ``data[name][kg] = {encoded_key: value}``."""

    def __init__(self, kg_range, data, max_parallelism=128):
        self.max_parallelism = max_parallelism
        self.key_group_range = KeyGroupRange(*kg_range)
        self.key_type = "int64"
        self.assigner = "spark"
        self.data = data

    def state_metas(self):
        return [{"name": n, "kind": "value", "namespace_type": "void", "value_type": "binary"}
                for n in self.data]

    def entries(self, name, kg):
        items = sorted(self.data[name].get(kg, {}).items())
        return (pa.array([k for k, _ in items], pa.binary()),
                pa.array([v for _, v in items], pa.binary()))

    def release(self):
        pass


def build(kg_range=(0, 3), per_kg=10, seed=0, states=("a", "b")):
    rng = random.Random(seed)
    data = {n: {} for n in states}
    for n in states:
        for kg in range(kg_range[0], kg_range[1] + 1):
            data[n][kg] = {bytes([kg]) + struct.pack(">q", rng.randrange(2**40)) + b"\x00":
                           rng.randbytes(rng.randint(10, 60)) for _ in range(per_kg)}
    return Snap(kg_range, data)


def read_everything(store, version):
    with store.open(version) as r:
        out = {}
        for m in r.state_metas():
            for kg in r.key_group_range:
                k, v = r.entries(m["name"], kg)
                out[(m["name"], kg)] = (k.to_pylist(), v.to_pylist())
        return out


@pytest.fixture
def small_ckpt(tmp_path):
    """A committed version 1 whose single data file has many small blocks."""
    store = CheckpointStore(tmp_path)
    snap = build(per_kg=6)
    desc = store.write_snapshot(snap, 1, block_target_bytes=150)
    store.commit(1, [desc])
    path = tmp_path / desc["path"]
    layout = DataFileLayout(path)
    assert len(layout.blocks) >= 16  # several blocks per (state, key group)
    good = read_everything(store, 1)
    return store, path, desc, layout, good


@pytest.mark.parametrize("mask", [0x01, 0x80, 0xFF])
def test_flipped_byte_anywhere_in_data_file_is_detected(small_ckpt, mask):
    store, path, desc, layout, good = small_ckpt
    original = path.read_bytes()
    size = len(original)
    filters_offset, footer_offset = layout.filters_at, layout.footer_at
    positions = range(size) if mask == 0x01 else sorted(
        set(random.Random(mask).sample(range(size), 300)) | set(range(size - TRAILER_SIZE, size))
        | set(range(HEADER_SIZE)) | {footer_offset, footer_offset + 4, filters_offset,
                                     footer_offset - 1})
    fd = os.open(path, os.O_RDWR)  # patch in place: one byte per position, restored after
    try:
        for pos in positions:
            os.pwrite(fd, bytes([original[pos] ^ mask]), pos)
            if filters_offset <= pos < footer_offset:
                # A Bloom filter: restores never read them, verification and lookups check them.
                read_everything(store, 1)
                with pytest.raises(CorruptCheckpointError) as ei:
                    store.verify(1)
                os.pwrite(fd, original[pos:pos + 1], pos)
                assert str(path) in str(ei.value) and "Bloom filter" in str(ei.value)
                continue
            with pytest.raises(CorruptCheckpointError) as ei:
                read_everything(store, 1)
            os.pwrite(fd, original[pos:pos + 1], pos)
            msg = str(ei.value)
            assert str(path) in msg, (pos, msg)
            layout.assert_names_the_damage(msg, pos)
    finally:
        os.close(fd)
        path.write_bytes(original)
    assert read_everything(store, 1) == good


def test_truncation_at_every_length_is_detected(small_ckpt):
    store, path, desc, *_ = small_ckpt
    original = path.read_bytes()
    fd = os.open(path, os.O_RDWR)
    try:
        for n in range(len(original) - 1, -1, -1):  # shrink one byte at a time
            os.ftruncate(fd, n)
            with pytest.raises(CorruptCheckpointError) as ei:
                read_everything(store, 1)
            assert str(path) in str(ei.value)
            # without the manifest's size, the file's own structure still gives it away
            with pafs.LocalFileSystem().open_input_file(str(path)) as f:
                with pytest.raises(CorruptCheckpointError):
                    DataFileReader(f, str(path))
    finally:
        os.close(fd)
        path.write_bytes(original)
    assert len(read_everything(store, 1)) == 8


@pytest.mark.parametrize("extra", [b"\x00", b"x" * 47, b"y" * 48, b"z" * 1000])
def test_appended_bytes_are_detected(small_ckpt, extra):
    store, path, *_ = small_ckpt
    original = path.read_bytes()
    path.write_bytes(original + extra)
    with pytest.raises(CorruptCheckpointError, match="size"):
        read_everything(store, 1)
    with pafs.LocalFileSystem().open_input_file(str(path)) as f:
        with pytest.raises(CorruptCheckpointError):
            DataFileReader(f, str(path))
    # also a trailer copied at the new end: the footer no longer ends where it says
    path.write_bytes(original[:-TRAILER_SIZE] + extra + original[-TRAILER_SIZE:])
    with pafs.LocalFileSystem().open_input_file(str(path)) as f:
        with pytest.raises(CorruptCheckpointError):
            DataFileReader(f, str(path))


def test_missing_data_file(small_ckpt):
    store, path, *_ = small_ckpt
    os.remove(path)
    with pytest.raises(CorruptCheckpointError, match="missing") as ei:
        read_everything(store, 1)
    assert str(path) in str(ei.value)
    with pytest.raises(CorruptCheckpointError, match="missing"):
        store.verify(1)


def test_replaced_data_file_is_detected(small_ckpt):
    store, path, desc, *_ = small_ckpt
    original = path.read_bytes()
    # same size, different content: the manifest pins the footer checksum
    with pafs.LocalFileSystem().open_input_file(str(path)) as f:
        with pytest.raises(CorruptCheckpointError, match="footer checksum differs"):
            DataFileReader(f, str(path), expected_size=len(original),
                           expected_footer_xxh64=int(desc["footer_xxh64"], 16) ^ 1)
    # a re-run of version 1 that never re-committed writes a new file: the committed version
    # is untouched
    store.write_snapshot(build(seed=42), 1, block_target_bytes=200)
    assert path.read_bytes() == original
    read_everything(store, 1)
    # a file overwritten in place behind the store's back is detected
    path.write_bytes(original[:-1] + bytes([original[-1] ^ 1]) + b"\x00")
    with pytest.raises(CorruptCheckpointError, match="size is|footer checksum differs"):
        read_everything(store, 1)
    # a file that is not a checkpoint at all, of the right size
    path.write_bytes(b"PAR1" + b"\x00" * (desc["size"] - 4))
    with pytest.raises(CorruptCheckpointError, match="bad magic"):
        read_everything(store, 1)


def test_corrupt_block_of_other_key_group_does_not_affect_disjoint_restore(tmp_path):
    store = CheckpointStore(tmp_path)
    snap = build(kg_range=(0, 31), per_kg=30)
    desc = store.write_snapshot(snap, 3, block_target_bytes=512)
    store.commit(3, [desc])
    path = tmp_path / desc["path"]
    with pafs.LocalFileSystem().open_input_file(str(path)) as f:
        r = DataFileReader(f, str(path))
        rows = r._index_rows
        victim = rows[(rows["key_group"] == 20) & (rows["state"] == 1)][0]
        r.close()
    damaged = bytearray(path.read_bytes())
    damaged[int(victim["offset"]) + int(victim["length"]) // 2] ^= 0x10
    path.write_bytes(bytes(damaged))

    class Backend:
        def __init__(self, rng):
            self.key_group_range = KeyGroupRange(*rng)

        def restore(self, reader):
            self.got = {(m["name"], kg): reader.entries(m["name"], kg)[0].to_pylist()
                        for m in reader.state_metas() for kg in self.key_group_range}

    b = Backend((0, 19))
    store.restore(b, 3)
    assert b.got[("b", 19)] == sorted(snap.data["b"][19])
    b = Backend((21, 31))
    store.restore(b, 3)
    assert b.got[("a", 21)] == sorted(snap.data["a"][21])
    with pytest.raises(CorruptCheckpointError, match="state 'b' key group 20 block"):
        store.restore(Backend((16, 23)), 3)
    with pytest.raises(CorruptCheckpointError, match="key group 20"):
        store.verify(3)
    # the other state of that key group is intact
    with store.open(3) as reader:
        assert reader.entries("a", 20)[0].to_pylist() == sorted(snap.data["a"][20])


def test_missing_file_of_one_writer_leaves_the_other_range_restorable(tmp_path):
    store = CheckpointStore(tmp_path)
    full = build(kg_range=(0, 7))
    descs = []
    for i, (s, e) in enumerate([(0, 3), (4, 7)]):
        part = Snap((s, e), {n: {kg: d for kg, d in per.items() if s <= kg <= e}
                             for n, per in full.data.items()})
        descs.append(store.write_snapshot(part, 0, f"p{i}"))
    store.commit(0, descs)
    os.remove(tmp_path / descs[1]["path"])
    with store.open(0) as r:
        assert r.entries("a", 2)[0].to_pylist() == sorted(full.data["a"][2])
        with pytest.raises(CorruptCheckpointError, match=r"p1-[0-9a-f]{12}\.sckp.*missing"):
            r.entries("a", 5)


def _manifest_path(root, v):
    return root / f"manifest-{v:020d}.json"


def test_flipped_byte_anywhere_in_manifest_is_detected(small_ckpt):
    store, path, *_ = small_ckpt
    mpath = _manifest_path(path.parents[2], 1)
    original = mpath.read_bytes()
    fd = os.open(mpath, os.O_RDWR)
    try:
        for pos in range(len(original)):
            os.pwrite(fd, bytes([original[pos] ^ 0x01]), pos)
            with pytest.raises(CorruptCheckpointError) as ei:
                store.manifest(1)
            assert str(mpath) in str(ei.value), (pos, str(ei.value))
            os.pwrite(fd, original[pos:pos + 1], pos)
    finally:
        os.close(fd)
        mpath.write_bytes(original)
    store.manifest(1)


def test_a_manifest_read_again_is_checked_again_unless_its_bytes_are_unchanged(small_ckpt):
    """Reads of unchanged bytes skip the checks (manifests._VALIDATED_MANIFESTS) but still give a
    fresh dict; a manifest damaged or re-signed with a bad structure after a good read is
    caught, by any store object of the process."""
    store, path, *_ = small_ckpt
    mpath = _manifest_path(path.parents[2], 1)
    first = store.manifest(1)
    first["files"].clear()  # the caller's copy
    again = CheckpointStore(store.uri).manifest(1)
    assert again["files"] and again == CheckpointStore(store.uri).manifest(1)
    original = mpath.read_bytes()
    mpath.write_bytes(original.replace(b'"version"', b'"versioN"', 1))
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
        store.manifest(1)
    mpath.write_bytes(original)
    forge_manifest_file(mpath, lambda d: d["files"].append(dict(d["files"][0])))
    with pytest.raises(CorruptCheckpointError, match="is listed twice"):
        CheckpointStore(store.uri).manifest(1)
    mpath.write_bytes(original)
    forge_manifest_file(mpath, lambda d: d["files"].append(
        dict(d["files"][0], path=d["files"][0]["path"] + "x")))
    with pytest.raises(CorruptCheckpointError, match="both claim key group 0"):
        CheckpointStore(store.uri).manifest(1)
    mpath.write_bytes(original)
    assert store.manifest(1) == again


def test_manifest_truncated_or_not_json(small_ckpt):
    store, path, *_ = small_ckpt
    mpath = _manifest_path(path.parents[2], 1)
    original = mpath.read_bytes()
    for n in list(range(0, len(original), 7)) + [len(original) - 1]:
        mpath.write_bytes(original[:n])
        with pytest.raises(CorruptCheckpointError, match="manifest"):
            store.open(1)
        with pytest.raises(CorruptCheckpointError):
            store.describe(1)
        with pytest.raises(CorruptCheckpointError):
            store.metadata(1)
    for junk in (b"[]", b"null", b"{}", b'{"checksum_xxh64": "zz"}', b"\xff\xfe"):
        mpath.write_bytes(junk)
        with pytest.raises(CorruptCheckpointError, match=str(mpath)):
            store.open(1)


def test_manifest_with_overlapping_files_is_corrupt(tmp_path):
    store = CheckpointStore(tmp_path)
    full = build(kg_range=(0, 7))
    descs = [store.write_snapshot(Snap(r, full.data), 0, f"p{i}")
             for i, r in enumerate([(0, 3), (4, 7)])]
    store.commit(0, descs)
    mpath = _manifest_path(tmp_path, 0)
    original = mpath.read_bytes()

    def overlap(doc):
        doc["files"][1]["key_group_range"] = [3, 7]
        doc["key_group_range"] = [0, 7]

    forge_manifest_file(mpath, overlap)
    with pytest.raises(CorruptCheckpointError, match="both claim key group 3"):
        store.open(0)

    mpath.write_bytes(original)

    def gap(doc):
        doc["files"][1]["key_group_range"] = [5, 7]

    forge_manifest_file(mpath, gap)
    with pytest.raises(CorruptCheckpointError, match="no file holds key groups 4..4"):
        store.open(0)

    mpath.write_bytes(original)

    def wrong_union(doc):
        doc["key_group_range"] = [0, 9]

    forge_manifest_file(mpath, wrong_union)
    with pytest.raises(CorruptCheckpointError, match="not the union"):
        store.open(0)

    mpath.write_bytes(original)

    def escape(doc):
        doc["files"][0]["path"] = "../elsewhere.sckp"

    forge_manifest_file(mpath, escape)
    with pytest.raises(CorruptCheckpointError, match="leaves the root"):
        store.open(0)

    mpath.write_bytes(original)

    def wrong_range(doc):  # the manifest's range disagrees with the data file's footer
        doc["files"][0]["key_group_range"] = [0, 2]
        doc["files"][1]["key_group_range"] = [3, 7]

    forge_manifest_file(mpath, wrong_range)
    with store.open(0) as r, pytest.raises(CorruptCheckpointError, match="footer says"):
        r.entries("a", 0)

    mpath.write_bytes(original)

    def other_version(doc):
        doc["version"] = 5

    forge_manifest_file(mpath, other_version)
    with pytest.raises(CorruptCheckpointError, match="version 5"):
        store.open(0)


def test_retain_refuses_to_delete_when_a_retained_manifest_is_corrupt(small_ckpt):
    store, path, desc, *_ = small_ckpt
    root = path.parents[2]
    store.commit(2, [store.write_snapshot(build(seed=2), 2)])
    store.commit(3, [store.write_snapshot(build(seed=3), 3)])
    _manifest_path(root, 3).write_bytes(b"{not json")
    before = sorted(p for p in root.rglob("*"))
    with pytest.raises(CorruptCheckpointError):
        store.retain(2)
    assert sorted(p for p in root.rglob("*")) == before


def test_corrupt_pending_descriptor(tmp_path):
    store = CheckpointStore(tmp_path)
    d = store.write_snapshot(build(), 4)
    rel = store.write_pending(4, "p0", d)
    (tmp_path / rel).write_bytes(b'{"version": 4,')
    with pytest.raises(CorruptCheckpointError, match="p0.json"):
        store.pending(4)
    with pytest.raises(CorruptCheckpointError, match="p0.json"):
        store.commit(4)
    assert store.versions() == []


def test_unknown_version_names_version_and_root(small_ckpt):
    store, path, *_ = small_ckpt
    with pytest.raises(CheckpointNotFoundError) as ei:
        store.open(12345)
    msg = str(ei.value)
    assert "12345" in msg and store.uri in msg and "1" in msg
    with pytest.raises(CheckpointNotFoundError):
        store.describe(12345)
    with pytest.raises(CheckpointNotFoundError):
        store.metadata(12345)
    with pytest.raises(LookupError):  # CheckpointNotFoundError is a LookupError too
        store.verify(12345)


def test_decode_block_rejects_inconsistent_payloads():
    koff = np.array([0, 3, 5], dtype=np.int32)
    voff = np.array([0, 1, 4], dtype=np.int32)
    good = encode_block(koff, b"abcde", voff, b"wxyz")
    keys, values = decode_block(good, 2, "t")
    assert keys.to_pylist() == [b"abc", b"de"] and values.to_pylist() == [b"w", b"xyz"]
    with pytest.raises(CorruptCheckpointError, match="entries"):
        decode_block(good, 3, "t")
    with pytest.raises(CorruptCheckpointError, match="too short"):
        decode_block(b"\x01", 1, "t")
    with pytest.raises(CorruptCheckpointError, match="truncated"):
        decode_block(good[:10], 2, "t")
    with pytest.raises(CorruptCheckpointError, match="offsets describe"):
        decode_block(good + b"!", 2, "t")
    with pytest.raises(CorruptCheckpointError, match="offsets describe"):
        decode_block(good[:-1], 2, "t")
    bad = encode_block(np.array([0, 4, 3], np.int32), b"abc", voff, b"wxyz")
    with pytest.raises(CorruptCheckpointError, match="key offsets"):
        decode_block(bad, 2, "t")
    bad = encode_block(koff, b"abcde", np.array([1, 2, 4], np.int32), b"wxyz")
    with pytest.raises(CorruptCheckpointError, match="value offsets"):
        decode_block(bad, 2, "t")

"""Checkpoint store round trips: data file format, manifests, versions, retention, pending
descriptors, lazy key-group reads, and restores into backends."""

from __future__ import annotations

import json
import os
import random
import re
import struct

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from statecore import serializers as S
from statecore.checkpoint import CheckpointStore
from statecore.checkpoint.format import (
    DEFAULT_BLOCK_TARGET_BYTES,
    TRAILER_SIZE,
    DataFileReader,
    cut_points,
)
from statecore.checkpoint.layout import redact_uri
from statecore.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    InvalidInputError,
)
from statecore.key_groups import KeyGroupRange
from support.fs_wrappers import LocalDelegatingHandler

# ------------------------------------------------------------------------------------ fakes


def encoded_key(kg: int, key: int, max_parallelism: int, suffix: bytes = b"\x00") -> bytes:
    """Encoded key as in docs/formats.md: key-group prefix | int64 key BE | void namespace."""
    prefix = bytes([kg]) if max_parallelism <= 128 else kg.to_bytes(2, "big")
    return prefix + struct.pack(">q", key) + suffix


class FakeSnapshot:
    """Minimal StateSnapshot: ``data[name][kg] = {encoded_key: value}``."""

    def __init__(self, max_parallelism, kg_range, data, metas=None, key_type="int64",
                 assigner="spark"):
        self.max_parallelism = max_parallelism
        self.key_group_range = KeyGroupRange(*kg_range)
        self.key_type = key_type
        self.assigner = assigner
        self.data = data
        self._metas = metas or [
            {"name": n, "kind": "value", "namespace_type": "void", "value_type": "binary"}
            for n in data]
        self.released = 0
        self.calls = []

    def state_metas(self):
        return [dict(m) for m in self._metas]

    def entries(self, name, kg):
        self.calls.append((name, kg))
        items = sorted(self.data.get(name, {}).get(kg, {}).items())
        return (pa.array([k for k, _ in items], pa.binary()),
                pa.array([v for _, v in items], pa.binary()))

    def release(self):
        self.released += 1


def make_snapshot(max_parallelism=128, kg_range=None, states=("count", "events"), per_kg=20,
                  seed=0, value_size=(0, 40)):
    rng = random.Random(seed)
    kg_range = kg_range or (0, max_parallelism - 1)
    data = {}
    for name in states:
        data[name] = {}
        for kg in range(kg_range[0], kg_range[1] + 1):
            n = rng.randint(0, per_kg)
            data[name][kg] = {
                encoded_key(kg, rng.randrange(-2**40, 2**40), max_parallelism):
                    rng.randbytes(rng.randint(*value_size))
                for _ in range(n)}
    return FakeSnapshot(max_parallelism, kg_range, data)


def read_all(snap_like, names=None, kgs=None):
    """{(name, kg): [(key, value), ...]} over non-empty (state, key group)s."""
    names = names or [m["name"] for m in snap_like.state_metas()]
    kgs = kgs if kgs is not None else list(snap_like.key_group_range)
    out = {}
    for name in names:
        for kg in kgs:
            k, v = snap_like.entries(name, kg)
            assert k.type == pa.binary() and v.type == pa.binary() and len(k) == len(v)
            if len(k):
                out[(name, kg)] = list(zip(k.to_pylist(), v.to_pylist()))
    return out


def expected(snap, kgs=None):
    out = {}
    for name, per_kg in snap.data.items():
        for kg, d in per_kg.items():
            if d and (kgs is None or kg in kgs):
                out[(name, kg)] = sorted(d.items())
    return out


class RecordingBackend:
    """Backend stand-in: restore() copies whatever is in its key-group range."""

    def __init__(self, kg_range):
        self.key_group_range = KeyGroupRange(*kg_range)
        self.loaded = None

    def restore(self, snap):
        mine = self.key_group_range.intersection(snap.key_group_range)
        self.loaded = read_all(snap, kgs=list(mine))
        self.metas = snap.state_metas()


class CountingHandler(LocalDelegatingHandler):
    """pyarrow filesystem over the local disk counting bytes read from input files."""

    type_name = "counting"

    def __init__(self):
        super().__init__()
        self.bytes_read = 0
        self.opened = []

    def open_input_file(self, path):
        self.opened.append(path)
        return super().open_input_file(path)

    def on_read(self, path, offset, data):
        self.bytes_read += len(data)


# ------------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("how", ["path", "uri", "explicit_fs", "pathlike"])
def test_round_trip_all_key_groups(tmp_path, how):
    root = tmp_path / "ckpt"
    store = {
        "path": lambda: CheckpointStore(str(root)),
        "uri": lambda: CheckpointStore(root.as_uri()),
        "explicit_fs": lambda: CheckpointStore(str(root), filesystem=pafs.LocalFileSystem()),
        "pathlike": lambda: CheckpointStore(root),
    }[how]()
    snap = make_snapshot()
    desc = store.write_snapshot(snap, 7)
    assert snap.released == 0
    json.dumps(desc)  # JSON-able for a driver to collect
    assert re.fullmatch(r"data/00000000000000000007/p0-[0-9a-f]{12}\.sckp", desc["path"])
    assert desc["size"] == os.path.getsize(root / desc["path"])
    manifest = store.commit(7, [desc], metadata={"batch_id": 7, "watermark_ms": 123})
    assert (root / "manifest-00000000000000000007.json").is_file()
    assert manifest["files"][0]["path"] == desc["path"]
    assert store.versions() == [7] and store.latest_version() == 7
    assert store.metadata(7) == {"batch_id": 7, "watermark_ms": 123}
    with store.open(7) as reader:
        assert reader.max_parallelism == 128
        assert reader.key_type == "int64" and reader.assigner == "spark"
        assert reader.key_group_range == KeyGroupRange(0, 127)
        assert reader.state_metas() == snap.state_metas()
        assert read_all(reader) == expected(snap)
        assert reader.metadata["batch_id"] == 7
    # no temporary file left next to the data file or the manifest
    leftovers = [p for p in root.rglob("*") if ".tmp-" in p.name]
    assert leftovers == []


def test_two_byte_prefix_and_many_blocks(tmp_path):
    store = CheckpointStore(tmp_path)
    snap = make_snapshot(max_parallelism=1024, kg_range=(500, 540), per_kg=300,
                         value_size=(100, 600))
    desc = store.write_snapshot(snap, 0, "w", block_target_bytes=4096)
    assert desc["blocks"] > 41  # key groups with more than 4 KiB were cut into several blocks
    assert sum(desc["entries"].values()) == sum(len(d) for s in snap.data.values()
                                                for d in s.values())
    store.commit(0, [desc])
    with store.open(0) as r:
        assert r.key_group_range == KeyGroupRange(500, 540)
        assert read_all(r) == expected(snap)


def test_blocks_respect_target_and_never_span_key_groups(tmp_path):
    store = CheckpointStore(tmp_path)
    snap = make_snapshot(kg_range=(0, 9), per_kg=400, value_size=(50, 300))
    # one huge value bigger than the target must form a block of its own
    snap.data["count"][3][encoded_key(3, 1, 128)] = b"x" * (3 * DEFAULT_BLOCK_TARGET_BYTES)
    desc = store.write_snapshot(snap, 1, block_target_bytes=8192)
    path = tmp_path / desc["path"]
    with pafs.LocalFileSystem().open_input_file(str(path)) as f:
        r = DataFileReader(f, str(path), expected_size=desc["size"])
        blocks, index = r._blocks, r._index_rows
        assert len(blocks) == desc["blocks"]
        for rec in index:
            b0, nb = int(rec["first_block"]), int(rec["block_count"])
            raws = [int(blocks[b]["raw_length"]) for b in range(b0, b0 + nb)]
            for b in range(b0, b0 + nb):
                if int(blocks[b]["entries"]) > 1:
                    assert int(blocks[b]["raw_length"]) <= 8192
            assert sum(int(blocks[b]["entries"]) for b in range(b0, b0 + nb)) == rec["entries"]
            if nb > 1:
                assert max(raws) > 4096  # not cut needlessly small
        kgs = [int(x) for x in index["key_group"]]
        assert kgs == sorted(kgs)
        assert read_all(r, names=["count", "events"], kgs=range(10)) == expected(snap)
        r.close()


def test_cut_points():
    import numpy as np

    koff = np.array([0, 10, 20, 30, 40], dtype=np.int32)
    voff = np.array([0, 0, 0, 100, 100], dtype=np.int32)
    # entry sizes: 18, 18, 118, 18 plus 12 bytes per block
    assert cut_points(koff, voff, 48) == [0, 2, 3, 4]
    assert cut_points(koff, voff, 47) == [0, 1, 2, 3, 4]
    assert cut_points(koff, voff, 1000) == [0, 4]
    assert cut_points(koff, voff, 1) == [0, 1, 2, 3, 4]
    assert cut_points(np.array([0], np.int32), np.array([0], np.int32), 10) == [0]


def test_empty_snapshot_and_empty_states(tmp_path):
    store = CheckpointStore(tmp_path)
    snap = FakeSnapshot(128, (0, 127), {"a": {}, "b": {}})
    desc = store.write_snapshot(snap, 0)
    assert desc["blocks"] == 0 and desc["entries"] == {"a": 0, "b": 0}
    store.commit(0, [desc])
    with store.open(0) as r:
        assert read_all(r) == {}
        k, v = r.entries("a", 5)
        assert len(k) == len(v) == 0
    # a snapshot of an EMPTY key-group range
    snap = FakeSnapshot(128, (0, -1), {"a": {}})
    store.commit(1, [store.write_snapshot(snap, 1)])
    with store.open(1) as r:
        assert r.key_group_range.is_empty()
        with pytest.raises(InvalidInputError):
            r.entries("a", 0)


def test_multiple_writers_merge_and_partial_restore(tmp_path):
    store = CheckpointStore(tmp_path)
    full = make_snapshot(kg_range=(0, 127), per_kg=15, seed=3)
    parts = [(0, 31), (32, 95), (96, 127)]
    descs = []
    for i, (s, e) in enumerate(parts):
        part = FakeSnapshot(128, (s, e), {n: {kg: d for kg, d in per.items() if s <= kg <= e}
                                          for n, per in full.data.items()})
        descs.append(store.write_snapshot(part, 5, writer=f"p{i}"))
    store.commit(5, reversed(descs))
    with store.open(5) as r:
        assert r.key_group_range == KeyGroupRange(0, 127)
        assert read_all(r) == expected(full)
    # rescale 3 -> 2: each new backend restores only its own range
    for rng in [(0, 63), (64, 127), (30, 40)]:
        b = RecordingBackend(rng)
        assert store.restore(b, 5) == 5
        assert b.loaded == expected(full, kgs=range(rng[0], rng[1] + 1))
        assert b.metas == full.state_metas()
    d = store.describe(5)
    assert d["files"] == 3 and d["key_groups"] == 128
    assert d["entries"] == {n: sum(len(x) for x in per.values()) for n, per in full.data.items()}
    assert d["bytes"] == sum(x["size"] for x in descs)
    assert [w["writer"] for w in d["writers"]] == ["p0", "p1", "p2"]
    assert store.verify(5)["files"] == 3


def test_restore_reads_only_owned_key_group_ranges(tmp_path):
    handler = CountingHandler()
    fs = pafs.PyFileSystem(handler)
    store = CheckpointStore(str(tmp_path), filesystem=fs)
    snap = make_snapshot(kg_range=(0, 127), per_kg=60, value_size=(200, 400), seed=9)
    desc = store.write_snapshot(snap, 2)
    store.commit(2, [desc])
    handler.bytes_read = 0
    backend = RecordingBackend((10, 13))
    store.restore(backend, 2)
    assert backend.loaded == expected(snap, kgs=range(10, 14))
    # 4 of 128 key groups: header + trailer + footer + those blocks, far below the file size
    with fs.open_input_file(f"{tmp_path}/{desc['path']}") as f:
        r = DataFileReader(f, "x")
        rows = r._index_rows
        owned = rows[(rows["key_group"] >= 10) & (rows["key_group"] <= 13)]
        # The Bloom filters between the blocks and the footer are not read by a restore.
        footer_len = (r.size - TRAILER_SIZE
                      - int(r._blocks["offset"][-1] + r._blocks["stored_length"][-1])
                      - r.filter_bytes)
        r.close()
    handler.bytes_read = 0
    store.restore(RecordingBackend((10, 13)), 2)
    manifest_len = os.path.getsize(tmp_path / "manifest-00000000000000000002.json")
    assert handler.bytes_read == (manifest_len + 8 + TRAILER_SIZE + footer_len
                                  + int(owned["length"].sum()))
    assert handler.bytes_read < desc["size"] / 10
    # entries() without prefetch also reads only the asked (state, key group)
    with store.open(2) as reader:
        handler.bytes_read = 0
        reader.entries("count", 0)  # opens the file: header, trailer, footer
        base = handler.bytes_read
        reader.entries("events", 77)
        rec = rows[(rows["key_group"] == 77) & (rows["state"] == 1)]
        assert handler.bytes_read - base == int(rec["length"].sum())


def test_uncommitted_version_is_invisible(tmp_path):
    store = CheckpointStore(tmp_path)
    assert store.versions() == [] and store.latest_version() is None
    store.write_snapshot(make_snapshot(kg_range=(0, 3)), 3)
    assert store.versions() == []
    with pytest.raises(CheckpointNotFoundError) as ei:
        store.open(3)
    assert "3" in str(ei.value) and str(tmp_path) in str(ei.value)
    with pytest.raises(CheckpointNotFoundError):
        store.open()
    with pytest.raises(CheckpointNotFoundError):
        store.restore(RecordingBackend((0, 3)), 3)


def test_replay_writes_new_files_and_recommits_only_with_replace(tmp_path):
    """A replayed writer (same version and writer name, other content) never touches the files
    of the committed version: until the re-commit, that version reads as before, also after a
    crash between the write and the re-commit; re-committing needs replace=True."""
    store = CheckpointStore(tmp_path)
    first = make_snapshot(kg_range=(0, 7), seed=1)
    d1 = store.write_snapshot(first, 4)
    store.commit(4, [d1], metadata={"attempt": 1})
    second = make_snapshot(kg_range=(0, 7), seed=2)
    desc = store.write_snapshot(second, 4)  # the replay's write; "crash" before its commit
    assert desc["path"] != d1["path"]
    assert CheckpointStore(tmp_path).verify(4)["runs"] == 1
    with CheckpointStore(tmp_path).open(4) as r:
        assert read_all(r) == expected(first)
    with pytest.raises(InvalidInputError, match="would replace it; pass replace=True"):
        store.commit(4, [desc], metadata={"attempt": 2})
    store.commit(4, [desc], metadata={"attempt": 2}, replace=True)
    assert store.versions() == [4]
    assert store.metadata(4) == {"attempt": 2}
    with store.open(4) as r:
        assert read_all(r) == expected(second)
    version_dir = tmp_path / "data" / "00000000000000000004"
    names = sorted(p.name for p in version_dir.iterdir())
    assert names == sorted([d1["path"].rsplit("/", 1)[1], desc["path"].rsplit("/", 1)[1]])
    store.commit(5, [store.write_snapshot(make_snapshot(kg_range=(0, 7), seed=3), 5)])
    store.retain(1)  # the replaced file is referenced by nothing any more
    assert not version_dir.exists()


def test_commit_below_a_newer_version_is_refused_and_never_breaks_it(tmp_path):
    store = CheckpointStore(tmp_path)
    snaps = {v: make_snapshot(kg_range=(0, 7), seed=v) for v in (2, 3)}
    for v in (2, 3):
        store.commit(v, [store.write_snapshot(snaps[v], v)])
    other = make_snapshot(kg_range=(0, 7), seed=9)
    with pytest.raises(InvalidInputError, match="version 2 is not above the latest committed "
                                                "version 3: committing it would replace it"):
        store.commit(2, [store.write_snapshot(other, 2)])
    with pytest.raises(InvalidInputError, match="insert it below newer ones"):
        store.commit(1, [store.write_snapshot(other, 1)])
    assert store.versions() == [2, 3]
    store.commit(2, [store.write_snapshot(other, 2)], replace=True)  # a rollback, on purpose
    with store.open(2) as r:
        assert read_all(r) == expected(other)
    with store.open(3) as r:  # untouched
        assert read_all(r) == expected(snaps[3])
    store.verify(3)


def test_latest_version_and_open_default(tmp_path):
    store = CheckpointStore(tmp_path)
    for v in (0, 1, 10, 2):
        store.commit(v, [store.write_snapshot(make_snapshot(kg_range=(0, 1), seed=v), v)],
                     replace=v == 2)
    assert store.versions() == [0, 1, 2, 10]
    assert store.latest_version() == 10
    with store.open() as r:
        assert r.version == 10


def test_retain_deletes_old_versions_but_not_needed_files(tmp_path):
    store = CheckpointStore(tmp_path)
    snaps = {}
    for v in range(6):
        snaps[v] = make_snapshot(kg_range=(0, 15), seed=v)
        descs = [store.write_snapshot(snaps[v], v, "p0")]
        if v == 2:  # an earlier attempt of version 2 left a writer the replay did not have
            store.write_snapshot(make_snapshot(kg_range=(16, 20)), v, "p9")
        store.write_pending(v, "p0", descs[0])
        store.commit(v, descs)
    in_flight = store.write_snapshot(make_snapshot(kg_range=(0, 15)), 6, "p0")
    store.write_pending(6, "p0", in_flight)
    deleted = store.retain(2)
    assert deleted == [0, 1, 2, 3]
    assert store.versions() == [4, 5]
    data_dirs = sorted(p.name for p in (tmp_path / "data").iterdir())
    assert data_dirs == ["00000000000000000004", "00000000000000000005", "00000000000000000006"]
    assert sorted(p.name for p in (tmp_path / "pending").iterdir()) == [
        "00000000000000000005", "00000000000000000006"]
    for v in (4, 5):
        with store.open(v) as r:
            assert read_all(r) == expected(snaps[v])
    store.commit(6, None)  # from pending: still intact
    assert store.versions() == [4, 5, 6]
    assert store.retain(5) == []
    assert store.retain(1) == [4, 5]
    with store.open(6) as r:
        assert r.version == 6
    with pytest.raises(InvalidInputError):
        store.retain(0)
    assert CheckpointStore(tmp_path / "nothing").retain(3) == []


def test_retain_keeps_files_referenced_across_versions(tmp_path):
    store = CheckpointStore(tmp_path)
    snap = make_snapshot(kg_range=(0, 3))
    d0 = store.write_snapshot(snap, 0)
    store.commit(0, [d0])
    # version 1 reuses version 0's unchanged data file (as an incremental checkpoint would)
    d1 = dict(d0, version=1)
    store.commit(1, [d1])
    store.retain(1)
    assert store.versions() == [1]
    with store.open(1) as r:
        assert read_all(r) == expected(snap)


def test_pending_descriptors(tmp_path):
    store = CheckpointStore(tmp_path)
    full = make_snapshot(kg_range=(0, 63), seed=4)
    for i, (s, e) in enumerate([(0, 20), (21, 63)]):
        part = FakeSnapshot(128, (s, e), {n: {kg: d for kg, d in per.items() if s <= kg <= e}
                                          for n, per in full.data.items()})
        store.write_pending(9, f"p{i}", store.write_snapshot(part, 9, f"p{i}"))
        # a task retry overwrites its own pending file
        store.write_pending(9, f"p{i}", store.write_snapshot(part, 9, f"p{i}"))
    assert [d["writer"] for d in store.pending(9)] == ["p0", "p1"]
    assert store.pending(8) == []
    store.commit(9)
    with store.open(9) as r:
        assert read_all(r) == expected(full)
    store.clear_pending(9)
    assert store.pending(9) == []
    store.clear_pending(9)  # idempotent
    with pytest.raises(InvalidInputError):
        store.commit(10)  # nothing pending
    with pytest.raises(InvalidInputError):
        store.write_pending(9, "p0", {"version": 8, "writer": "p0"})


class RacingListingHandler(LocalDelegatingHandler):
    """Directory listings fail ``races`` times with FileNotFoundError, as LocalFileSystem's do
    when a temporary file is renamed between the directory read and its stat; ``vanish`` names
    files deleted right after they were listed (a concurrent clear_pending)."""

    type_name = "racing-listing"

    def __init__(self, races: int):
        super().__init__()
        self.races = races
        self.vanish: set = set()

    def get_file_info_selector(self, selector):
        if self.races > 0:
            self.races -= 1
            raise FileNotFoundError(f"{selector.base_dir}/x.json.tmp-0: vanished during listing")
        infos = self.fs.get_file_info(selector)
        for i in infos:
            if i.base_name in self.vanish:
                self.fs.delete_file(i.path)
        return infos


def test_listings_survive_concurrent_renames_and_deletes(tmp_path):
    handler = RacingListingHandler(races=0)
    store = CheckpointStore(str(tmp_path), filesystem=pafs.PyFileSystem(handler))
    snap = make_snapshot(kg_range=(0, 15), seed=2)
    for v in range(3):
        desc = store.write_snapshot(snap, v, "p0")
        store.write_pending(v, "p0", desc)
        store.write_pending(v, "p1", dict(desc, writer="p1"))
        store.commit(v, [desc])
    handler.races = 3
    assert [d["writer"] for d in store.pending(2)] == ["p0", "p1"]
    handler.races = 3
    assert store.versions() == [0, 1, 2]
    handler.races = 2
    assert store.retain(2) == [0]
    handler.vanish = {"p0.json"}
    assert [d["writer"] for d in store.pending(2)] == ["p1"]
    # a listing that keeps failing is a real error, not a race
    handler.races = 10**6
    with pytest.raises(FileNotFoundError):
        store.pending(2)


def test_commit_rejects_inconsistent_descriptors(tmp_path):
    store = CheckpointStore(tmp_path)
    a = store.write_snapshot(make_snapshot(kg_range=(0, 9)), 1, "a")
    b = store.write_snapshot(make_snapshot(kg_range=(5, 20)), 1, "b")
    c = store.write_snapshot(make_snapshot(kg_range=(12, 20)), 1, "c")
    with pytest.raises(InvalidInputError, match="both claim key group 5"):
        store.commit(1, [a, b])
    with pytest.raises(InvalidInputError, match="no file holds key groups 10..11"):
        store.commit(1, [a, c])
    with pytest.raises(InvalidInputError, match="version"):
        store.commit(2, [a])
    other = FakeSnapshot(256, (10, 11), {"count": {}})
    d = store.write_snapshot(other, 1, "d")
    with pytest.raises(InvalidInputError, match="max_parallelism"):
        store.commit(1, [a, d])
    metas = FakeSnapshot(128, (10, 11), {"count": {}}, metas=[{"name": "count", "kind": "list"}])
    e = store.write_snapshot(metas, 1, "e")
    with pytest.raises(InvalidInputError, match="meta of state 'count'"):
        store.commit(1, [a, e])
    with pytest.raises(InvalidInputError, match="duplicate writers"):
        store.commit(1, [a, a])
    with pytest.raises(InvalidInputError, match="JSON"):
        store.commit(1, [a], metadata={"x": object()})
    with pytest.raises(InvalidInputError):
        store.commit(1, [a], metadata=[1])
    with pytest.raises(InvalidInputError, match="relative"):
        store.commit(1, [dict(a, path="/etc/passwd")])
    with pytest.raises(InvalidInputError, match="malformed"):
        store.commit(1, [{"version": 1}])
    with pytest.raises(CorruptCheckpointError, match="is 1 bytes|bytes, its descriptor"):
        store.commit(1, [dict(a, size=1)])
    os.remove(tmp_path / a["path"])
    with pytest.raises(CorruptCheckpointError, match="missing"):
        store.commit(1, [a])
    assert store.versions() == []


def test_bad_arguments(tmp_path):
    store = CheckpointStore(tmp_path)
    snap = make_snapshot(kg_range=(0, 1))
    for v in (-1, 1.5, True, "3", 10**20):
        with pytest.raises(InvalidInputError):
            store.write_snapshot(snap, v)
    for w in ("", "../x", "a/b", ".hidden", 3):
        with pytest.raises(InvalidInputError):
            store.write_snapshot(snap, 0, writer=w)
    with pytest.raises(InvalidInputError):
        CheckpointStore("")
    with pytest.raises(InvalidInputError):
        CheckpointStore(tmp_path, filesystem="local")
    store.commit(0, [store.write_snapshot(snap, 0)])
    with store.open(0) as r:
        with pytest.raises(InvalidInputError, match="no state"):
            r.entries("nope", 0)
        with pytest.raises(InvalidInputError, match="outside"):
            r.entries("count", 2)
        with pytest.raises(InvalidInputError):
            r.entries("count", "0")
    with pytest.raises(CheckpointError, match="released"):
        r.entries("count", 0)
    r.release()  # idempotent


@pytest.mark.parametrize("broken", ["unsorted", "duplicate", "prefix", "short_key", "lengths",
                                    "nulls", "type", "range", "metas"])
def test_write_rejects_broken_snapshots_without_leaving_files(tmp_path, broken):
    store = CheckpointStore(tmp_path)
    good = make_snapshot(kg_range=(0, 3), per_kg=5)
    k1, k2 = encoded_key(2, 1, 128), encoded_key(2, 2, 128)

    class Broken(FakeSnapshot):
        def entries(self, name, kg):
            if kg != 2:
                return super().entries(name, kg)
            b = pa.binary()
            return {
                "unsorted": (pa.array([k2, k1], b), pa.array([b"", b""], b)),
                "duplicate": (pa.array([k1, k1], b), pa.array([b"", b""], b)),
                "prefix": (pa.array([encoded_key(3, 1, 128)], b), pa.array([b""], b)),
                "short_key": (pa.array([b""], b), pa.array([b""], b)),
                "lengths": (pa.array([k1, k2], b), pa.array([b""], b)),
                "nulls": (pa.array([k1, None], b), pa.array([b"", b""], b)),
                "type": (pa.array([1, 2]), pa.array([b"", b""], b)),
            }.get(broken, super().entries(name, kg))

    snap = Broken(128, (0, 3), good.data)
    if broken == "range":
        snap.key_group_range = KeyGroupRange(100, 200)
    if broken == "metas":
        snap._metas = [{"name": "count"}, {"name": "count"}]
    with pytest.raises(InvalidInputError):
        store.write_snapshot(snap, 0)
    assert not (tmp_path / "data" / "00000000000000000000" / "p0.sckp").exists()
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_large_binary_and_chunked_inputs_are_accepted(tmp_path):
    store = CheckpointStore(tmp_path)
    base = make_snapshot(kg_range=(0, 3), per_kg=10)

    class Large(FakeSnapshot):
        def entries(self, name, kg):
            k, v = super().entries(name, kg)
            return k.cast(pa.large_binary()), pa.chunked_array([v])

    snap = Large(128, (0, 3), base.data)
    store.commit(0, [store.write_snapshot(snap, 0)])
    with store.open(0) as r:
        assert read_all(r) == expected(base)


def test_sliced_input_arrays(tmp_path):
    """Arrays that are slices of bigger arrays (non-zero offsets) are written correctly."""
    store = CheckpointStore(tmp_path)
    base = make_snapshot(kg_range=(0, 3), per_kg=10)

    class Sliced(FakeSnapshot):
        def entries(self, name, kg):
            k, v = super().entries(name, kg)
            pad = pa.array([b"zz" * 5], pa.binary())
            k = pa.concat_arrays([pad, k, pad]).slice(1, len(k))
            v = pa.concat_arrays([pad, v, pad]).slice(1, len(v))
            return k, v

    store.commit(0, [store.write_snapshot(Sliced(128, (0, 3), base.data), 0)])
    with store.open(0) as r:
        assert read_all(r) == expected(base)


def test_hypothesis_round_trip(tmp_path_factory):
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies

    @hypothesis.settings(max_examples=40, deadline=None)
    @hypothesis.given(
        entries=st.dictionaries(
            st.tuples(st.integers(0, 7), st.binary(min_size=0, max_size=12)),
            st.binary(max_size=200), max_size=60),
        target=st.integers(1, 2000),
    )
    def check(entries, target):
        root = tmp_path_factory.mktemp("h")
        data = {"s": {}}
        ser = S.key_serializer("binary")  # valid encoded keys: verify decodes them
        for (kg, suffix), v in entries.items():
            data["s"].setdefault(kg, {})[bytes([kg]) + ser.serialize(suffix) + b"\x00"] = v
        snap = FakeSnapshot(128, (0, 7), data, key_type="binary")
        store = CheckpointStore(root)
        store.commit(0, [store.write_snapshot(snap, 0, block_target_bytes=target)])
        with store.open(0) as r:
            assert read_all(r) == expected(snap)
        assert store.verify(0)["entries"] == {"s": len(entries)}

    check()


# --------------------------------------------------------------- through the real backends


def _python_backend_available():
    try:
        from statecore.backends import create_backend  # noqa: F401
        from statecore.backends.python import PythonBackend  # noqa: F401

        return True
    except ImportError:
        return False


def _filled_python_backend(key_type, max_parallelism, n_keys):
    from statecore.backends import create_backend
    from statecore.descriptors import (
        ListStateDescriptor,
        MapStateDescriptor,
        ReducingStateDescriptor,
        ValueStateDescriptor,
    )

    b = create_backend("python", key_type=key_type, max_parallelism=max_parallelism)
    descs = {
        "count": ValueStateDescriptor("count", "int64"),
        "events": ListStateDescriptor("events", "string"),
        "attrs": MapStateDescriptor("attrs", "string", "int64"),
        "total": ReducingStateDescriptor("total", "sum", "int64"),
    }
    count = b.get_state(descs["count"])
    events = b.get_state(descs["events"], namespace_type="int64")
    attrs = b.get_state(descs["attrs"])
    total = b.get_state(descs["total"])
    keys = [k if key_type == "int64" else f"user-{k}" for k in range(n_keys)]
    for i, k in enumerate(keys):
        b.set_current_key(k)
        count.update(i * 3)
        events.set_current_namespace(i % 3)
        events.add_all([f"e{i}", "x" * (i % 50)])
        if i % 2:
            attrs.put_all({"a": i, "b": -i})
        total.add(i)
        total.add(1)
        if i % 5 == 0:
            b.timers.register_event_time_timer(1000 + i)
    return b, descs, keys


def _entries_by_kg(snap, kgs):
    return {(m["name"], kg): tuple(a.to_pylist() for a in snap.entries(m["name"], kg))
            for m in snap.state_metas() for kg in kgs}


@pytest.mark.skipif(not _python_backend_available(),
                    reason="pure-Python backend not importable yet")
@pytest.mark.parametrize("key_type,max_parallelism", [("int64", 128), ("string", 1024)])
def test_round_trip_through_python_backend(tmp_path, key_type, max_parallelism):
    from statecore.backends import create_backend
    from statecore.key_groups import KeyGroupRange as KGR
    from statecore.key_groups import key_group_range_for_operator

    store = CheckpointStore(tmp_path)
    src, descs, keys = _filled_python_backend(key_type, max_parallelism, 400)
    kg_of = {k: src.key_group_of(k) for k in keys}
    snap = src.snapshot()
    try:
        # written by 3 writers (parallelism 3), as the Spark tasks of one micro-batch would
        descs_written = []
        for i in range(3):
            r = key_group_range_for_operator(max_parallelism, 3, i)

            class Part:
                max_parallelism = snap.max_parallelism
                key_group_range = r
                key_type = snap.key_type
                assigner = snap.assigner
                state_metas = snap.state_metas
                entries = snap.entries

            descs_written.append(store.write_snapshot(Part, 8, f"p{i}"))
        store.commit(8, descs_written, metadata={"batch_id": 8})
        want = _entries_by_kg(snap, range(max_parallelism))
    finally:
        snap.release()
    assert store.verify(8)["entries"]["count"] == 400
    # restore with parallelism 1 and 2 (rescaling 3 -> 1, 3 -> 2)
    for parallelism in (1, 2):
        for i in range(parallelism):
            r = key_group_range_for_operator(max_parallelism, parallelism, i)
            dst = create_backend("python", key_type=key_type, max_parallelism=max_parallelism,
                                 key_group_range=r)
            store.restore(dst, 8)
            got_snap = dst.snapshot()
            got = _entries_by_kg(got_snap, r)
            got_snap.release()
            assert got == {k: v for k, v in want.items() if k[1] in r}
            count = dst.get_state(descs["count"])
            total = dst.get_state(descs["total"])
            attrs = dst.get_state(descs["attrs"])
            seen = 0
            for idx, k in enumerate(keys):
                if kg_of[k] in r:
                    dst.set_current_key(k)
                    assert count.value() == idx * 3
                    assert total.get() == idx + 1
                    assert dict(attrs.items()) == ({"a": idx, "b": -idx} if idx % 2 else {})
                    seen += 1
            assert seen == sum(1 for k in keys if kg_of[k] in r) > 0
            fired = dst.timers.advance_watermark(10**6)
            assert sorted(ts for ts, _, _ in fired) == sorted(
                1000 + idx for idx, k in enumerate(keys)
                if idx % 5 == 0 and kg_of[k] in r)
            dst.close()
    src.close()
    assert KGR(0, max_parallelism - 1) == store.open(8).key_group_range


@pytest.mark.skipif(not _python_backend_available(),
                    reason="pure-Python backend not importable yet")
def test_restore_into_incompatible_backend_raises_state_migration_error(tmp_path):
    from statecore.backends import create_backend
    from statecore.descriptors import ListStateDescriptor
    from statecore.errors import StateMigrationError

    store = CheckpointStore(tmp_path)
    src, _, _ = _filled_python_backend("int64", 128, 50)
    snap = src.snapshot()
    store.commit(1, [store.write_snapshot(snap, 1)])
    snap.release()
    dst = create_backend("python", key_type="int64", max_parallelism=128)
    lst = dst.get_state(ListStateDescriptor("count", "int64"))  # "count" was a ValueState
    dst.set_current_key(7)
    lst.add(1)
    with pytest.raises(StateMigrationError):
        store.restore(dst, 1)
    assert lst.get() == [1]
    other = create_backend("python", key_type="string", max_parallelism=128)
    with pytest.raises(StateMigrationError):
        store.restore(other, 1)


def test_importing_statecore_does_not_import_pandas():
    # pyarrow imports pandas on its first pa.array call; a module-level pa.array made that
    # ~0.5 s of every `import statecore` (CLI, Spark workers), for a library statecore never uses.
    import subprocess
    import sys

    code = ("import sys, statecore, statecore.checkpoint, statecore.spark.operator; "
            "print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_credentials_in_a_root_uri_stay_out_of_messages():
    """``s3://KEY:SECRET@bucket/...`` and secret query parameters are redacted wherever the
    root is named: ``CheckpointStore.uri`` and the error for a URI pyarrow refuses."""
    assert redact_uri("s3://AK:SK@bucket/p?endpoint_override=h:1&scheme=http") == \
        "s3://***@bucket/p?endpoint_override=h:1&scheme=http"
    assert redact_uri("s3://b/p?access_key=AK&secret_key=SK&region=r") == \
        "s3://b/p?access_key=***&secret_key=***&region=r"
    assert redact_uri("failed: gs://u@b/x?session_token=T (retry)") == \
        "failed: gs://***@b/x?session_token=*** (retry)"
    for plain in ("/data/a@b/ckpt", "s3://bucket/prefix", "relative/x"):
        assert redact_uri(plain) == plain
    store = CheckpointStore("s3://AKX:SKX@bucket/p?endpoint_override=127.0.0.1:9&scheme=http"
                            "&region=us-east-1")
    assert "SKX" not in store.uri and "AKX" not in store.uri
    with pytest.raises(InvalidInputError) as exc:
        CheckpointStore("s3://AKX:SKX@bucket/p?region=us-east-1&no_such_option=1")
    assert "SKX" not in str(exc.value) and "***@bucket" in str(exc.value)


def test_a_reader_adopts_the_open_files_another_version_shares(tmp_path):
    """CheckpointReader.adopt_open_files: the data files an earlier version's reader has open
    and the later version lists unchanged move over open (the same objects, still readable
    after the earlier reader's release, closed by the later one's); files the later version
    does not list, readers of another root object and released readers give nothing."""
    import statecore
    from statecore import ValueStateDescriptor

    store = CheckpointStore(str(tmp_path), max_runs=None)
    b = statecore.create_backend("python", key_type="int64")
    st = b.get_state(ValueStateDescriptor("v", "int64"))
    for k in range(200):
        b.set_current_key(k)
        st.update(k)
    store.checkpoint(b, 1, incremental=False)
    b.set_current_key(3)
    st.update(-3)
    store.checkpoint(b, 2)
    r1, r2 = store.open(1), store.open(2)
    [run1] = r1.manifest["files"]
    assert {f["path"] for f in r2.manifest["files"]} > {run1["path"]}
    opened = r1.data_file(run1)
    assert r2.adopt_open_files(r1) == {run1["path"]}
    assert r2.adopt_open_files(r1) == set()  # nothing open left to take
    r1.release()
    assert r2.data_file(run1) is opened
    with store.open(2) as fresh:
        assert r2.entries("v", 0)[1].to_pylist() == fresh.entries("v", 0)[1].to_pylist()
    r2.release()
    with pytest.raises(CheckpointError):
        r2.data_file(run1)
    # Another root object, or a released reader: nothing moves.
    other = CheckpointStore(str(tmp_path), max_runs=None)
    a, b = store.open(1), other.open(2)
    a.data_file(run1)
    assert b.adopt_open_files(a) == set()
    c = store.open(2)
    a.release()
    assert c.adopt_open_files(a) == set()
    for r in (b, c):
        r.release()

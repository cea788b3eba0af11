"""A committed version is never lost or silently changed: incremental runs name their base
version, commits and restores refuse a chain whose base is missing, and a commit is durable
(fsync order) before it returns."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

import statecore
from statecore import ValueStateDescriptor
from statecore.checkpoint import CheckpointStore
from statecore.errors import CorruptCheckpointError, InvalidInputError
from support.manifests import forge_manifest

BACKENDS = ["python", "native"]


def _backend(kind):
    b = statecore.create_backend(kind, key_type="int64", max_parallelism=16)
    return b, b.get_state(ValueStateDescriptor("v", "int64"))


def _put(st, keys, value):
    st.put_batch(pa.array(keys, pa.int64()), pa.array([value] * len(keys), pa.int64()))


def _contents(store, version, kind):
    b, st = _backend(kind)
    store.restore(b, version)
    out = {}
    for k in b.keys("v"):
        b.set_current_key(k)
        out[k] = st.value()
    return out


def _checkpoint(store, b, version, incremental=True):
    snap = b.snapshot(incremental=incremental)
    try:
        store.commit(version, [store.write_snapshot(snap, version)])
        b.notify_checkpoint_complete(snap.snapshot_id, version)
    finally:
        snap.release()


@pytest.mark.parametrize("kind", BACKENDS)
def test_incremental_commit_over_a_missing_base_is_refused(tmp_path, kind):
    """The base version's manifest disappears outside the store: the next incremental commit
    would be chained onto the version below and lose the base's changes. It is refused, naming
    the missing version; version 1 stays as it was."""
    store = CheckpointStore(tmp_path, max_runs=None)
    b, st = _backend(kind)
    _put(st, range(10), 1)
    _checkpoint(store, b, 1, incremental=False)
    _put(st, range(10, 20), 2)
    _checkpoint(store, b, 2)
    assert b.base_version == 2
    os.remove(tmp_path / store.manifest_name(2))
    _put(st, range(20, 30), 3)
    snap = b.snapshot(incremental=True)
    assert snap.incremental and snap.base_version == 2
    desc = store.write_snapshot(snap, 3)
    assert desc["base_version"] == 2
    with pytest.raises(InvalidInputError, match=r"changes since version 2 \(version 2 is not "
                                                r"committed\), but it would be chained onto "
                                                r"version 1"):
        store.commit(3, [desc])
    snap.release()
    assert store.versions() == [1]
    assert _contents(store, 1, kind) == {k: 1 for k in range(10)}
    # what the message suggests works: a full snapshot
    _checkpoint(store, b, 3, incremental=False)
    assert _contents(store, 3, kind) == {**{k: 1 for k in range(10)},
                                         **{k: 2 for k in range(10, 20)},
                                         **{k: 3 for k in range(20, 30)}}


@pytest.mark.parametrize("kind", BACKENDS)
def test_base_version_follows_restores_and_notifications(tmp_path, kind):
    store = CheckpointStore(tmp_path, max_runs=None)
    b, st = _backend(kind)
    assert b.base_version is None
    _put(st, range(5), 1)
    _checkpoint(store, b, 4, incremental=False)
    assert b.base_version == 4
    r, _ = _backend(kind)
    store.restore(r, 4)
    assert r.base_version == 4
    store.restore(r, 4)  # again from the same version: still that version
    assert r.base_version == 4
    _put(st, range(5, 8), 2)
    _checkpoint(store, b, 5)
    c, _ = _backend(kind)  # a change set applied on top makes its version the base
    store.restore(c, 4)
    changes = store.open_changes(5, store.run_path(4, "p0"), 0, 15)
    c.apply_changes(changes)
    changes.release()
    assert c.base_version == 5
    store.restore(r, 5)  # another version on top: no one version is the base any more
    assert r.base_version is None
    snap = r.snapshot(incremental=True)
    with pytest.raises(InvalidInputError, match="does not record the checkpoint version"):
        store.commit(6, [store.write_snapshot(snap, 6)])
    snap.release()
    # a notification without the version leaves it unknown; the same id with it sets it
    snap = b.snapshot()
    b.notify_checkpoint_complete(snap.snapshot_id)
    assert b.base_version is None
    b.notify_checkpoint_complete(snap.snapshot_id, 6)
    assert b.base_version == 6
    snap.release()
    with pytest.raises(InvalidInputError, match="version must be an int >= 0"):
        b.notify_checkpoint_complete(snap.snapshot_id, -1)
    # a restored backend continues incrementally from the version it restored
    fresh, st2 = _backend(kind)
    store.restore(fresh, 5)
    st2.put_batch(pa.array([100], pa.int64()), pa.array([9], pa.int64()))
    _checkpoint(store, fresh, 6)
    assert [f["kind"] for f in store.manifest(6)["files"]][0] == "incremental"
    assert store.manifest(6)["files"][0]["base_version"] == 5
    assert _contents(store, 6, kind) == {**{k: 1 for k in range(5)},
                                         **{k: 2 for k in range(5, 8)}, 100: 9}


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_base_of_another_store_with_the_same_version_number_is_refused(tmp_path, kind):
    """Restored from version 2 of store A, an incremental run is committed into store B whose
    latest version is also 2: the numbers agree, the contents do not. The run records the commit
    id of its base and B refuses it; B's versions stay as they were, and a full snapshot goes
    in."""
    a = CheckpointStore(tmp_path / "a", max_runs=None)
    other = CheckpointStore(tmp_path / "b", max_runs=None)
    for store, value in ((a, 1), (other, 7)):
        b, st = _backend(kind)
        _put(st, range(10), value)
        _checkpoint(store, b, 1, incremental=False)
        _put(st, range(10, 20), value)
        _checkpoint(store, b, 2)
    assert a.manifest(2)["commit_id"] != other.manifest(2)["commit_id"]
    r, st = _backend(kind)
    a.restore(r, 2)
    assert (r.base_version, r.base_commit_id) == (2, a.manifest(2)["commit_id"])
    _put(st, [100], 3)
    snap = r.snapshot(incremental=True)
    assert snap.incremental and snap.base_commit_id == a.manifest(2)["commit_id"]
    desc = other.write_snapshot(snap, 3)
    with pytest.raises(InvalidInputError, match=r"changes since a version 2 committed as "
                                                r"[0-9a-f]{32}, but version 2 of this store"):
        other.commit(3, [desc])
    snap.release()
    assert other.versions() == [1, 2]
    assert _contents(other, 2, kind) == {k: 7 for k in range(20)}
    # into A, where it belongs, it goes
    a.commit(3, [a.write_snapshot(snap2 := r.snapshot(incremental=True), 3)])
    snap2.release()
    assert a.manifest(3)["files"][0]["base_commit_id"] == a.manifest(2)["commit_id"]
    assert _contents(a, 3, kind) == {**{k: 1 for k in range(20)}, 100: 3}


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_base_committed_again_is_not_the_base_any_more(tmp_path, kind):
    """Version 2 is committed again (replace=True, a replayed micro-batch with other content)
    after a backend restored it: that backend's incremental run is refused, while compaction of
    a version keeps its commit id (same contents) and the one-call checkpoint records the id."""
    store = CheckpointStore(tmp_path, max_runs=None)
    b, st = _backend(kind)
    _put(st, range(10), 1)
    store.checkpoint(b, 1, incremental=False)
    _put(st, range(10, 20), 2)
    store.checkpoint(b, 2)
    assert b.base_commit_id == store.manifest(2)["commit_id"]
    r, rst = _backend(kind)
    store.restore(r, 2)
    before = store.manifest(2)["commit_id"]
    store.compact(2, max_runs=1)
    assert store.manifest(2)["commit_id"] == before
    # the writer of version 2 commits it again with other content
    _put(st, range(10, 20), 5)
    snap = b.snapshot()
    store.commit(2, [store.write_snapshot(snap, 2)], replace=True)
    snap.release()
    assert store.manifest(2)["commit_id"] != before
    _put(rst, [100], 3)
    snap = r.snapshot(incremental=True)
    with pytest.raises(InvalidInputError, match="committed again since"):
        store.commit(3, [store.write_snapshot(snap, 3)])
    snap.release()
    assert store.versions() == [1, 2]
    with pytest.raises(InvalidInputError, match="commit_id must be a non-empty str"):
        b.notify_checkpoint_complete(snap.snapshot_id, 2, commit_id=5)
    with pytest.raises(InvalidInputError, match="pass version= too"):
        b.notify_checkpoint_complete(snap.snapshot_id, commit_id=before)


def test_restore_refuses_a_chain_whose_base_is_missing(tmp_path):
    """A manifest whose incremental run sits on a run of another version than its base (runs
    dropped by hand, or by a buggy writer) reads as corrupt instead of silently missing the
    base's changes."""
    store = CheckpointStore(tmp_path, max_runs=None)
    b, st = _backend("native")
    _put(st, range(10), 1)
    _checkpoint(store, b, 1, incremental=False)
    _put(st, range(10, 20), 2)
    _checkpoint(store, b, 2)
    _put(st, range(20, 30), 3)
    _checkpoint(store, b, 3)

    def drop_version_2(doc):
        doc["files"] = [f for f in doc["files"] if f["version"] != 2]

    forge_manifest(store, 3, drop_version_2)
    fresh = CheckpointStore(tmp_path)
    with pytest.raises(CorruptCheckpointError, match="holds the changes since version 2, but "
                                                     "the run below it"):
        fresh.open(3)
    with pytest.raises(CorruptCheckpointError, match="the runs of version 2 are missing"):
        fresh.restore(_backend("native")[0], 3)

    def bad_base(doc):
        doc["files"][0]["base_version"] = "2"

    forge_manifest(store, 2, bad_base)
    with pytest.raises(CorruptCheckpointError, match="bad base_version"):
        CheckpointStore(tmp_path).open(2)


@pytest.fixture
def fsyncs(monkeypatch):
    """``[(path, is_dir), ...]`` of every ``os.fsync`` from the moment it is used, in order
    (the real fsync still runs)."""
    synced = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        synced.append((path, os.path.isdir(path)))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    return synced


def test_commit_is_durable_before_it_returns(tmp_path, fsyncs):
    """On the local filesystem every published file is fsynced before its rename and its
    directories after it; the manifest, last. Recorded through os.fsync on the real files."""
    synced = fsyncs
    store = CheckpointStore(tmp_path / "ckpt")
    b, st = _backend("native")
    _put(st, range(100), 1)
    snap = b.snapshot()
    desc = store.write_snapshot(snap, 0)
    root = str(tmp_path / "ckpt")
    data = os.path.join(root, desc["path"])
    files = [p for p, is_dir in synced if not is_dir]
    assert len(files) == 1 and ".tmp-" in files[0] and files[0].startswith(data + ".tmp-")
    dirs = [p for p, is_dir in synced if is_dir]
    assert dirs == [os.path.dirname(data), os.path.join(root, "data"), root]
    synced.clear()
    store.commit(0, [desc])
    manifest = os.path.join(root, store.manifest_name(0))
    assert [p.split(".tmp-")[0] for p, is_dir in synced] == [manifest, root]
    assert synced[0][0] != manifest  # the temporary file, before the rename
    synced.clear()
    fut = store.write_snapshot_async(snap, 1, release_snapshot=True)
    d1 = fut.result(timeout=60)
    assert [p.split(".tmp-")[0] for p, _ in synced][:1] == [os.path.join(root, d1["path"])]


def test_retain_removes_temporary_files_of_killed_manifest_writes(tmp_path):
    store = CheckpointStore(tmp_path)
    b, st = _backend("python")
    _put(st, range(3), 1)
    _checkpoint(store, b, 0, incremental=False)
    leftover = tmp_path / (store.manifest_name(1) + ".tmp-0123456789abcdef")
    leftover.write_bytes(b'{"half": ')
    assert store.versions() == [0]
    store.retain(1)
    assert not leftover.exists()
    assert store.versions() == [0]
    assert _contents(store, 0, "python") == {0: 1, 1: 1, 2: 1}


# ------------------------------------------------------------------ forged manifests and footers


def _two_state_checkpoint(tmp_path):
    store = CheckpointStore(tmp_path, max_runs=None)
    b = statecore.create_backend("native", key_type="int64", max_parallelism=16)
    a = b.get_state(ValueStateDescriptor("a", "int64"))
    z = b.get_state(ValueStateDescriptor("z", "int64"))
    _put(a, range(10), 1)
    _put(z, range(5), 2)
    _checkpoint(store, b, 0, incremental=False)
    return store


@pytest.mark.parametrize("edit, what", [
    (lambda d: d["files"][0].update(key_groups_nonempty={"a": 1}), "key_groups_nonempty"),
    (lambda d: d["states"].append([1, 2]), "state meta is not an object"),
    (lambda d: d["states"][0].pop("namespace_type"), "namespace_type is not a string"),
    (lambda d: d["states"].append(dict(d["states"][0])), "states are listed twice"),
    (lambda d: d["files"][0].update(states=["a", "a"]), "repeat a name"),
    (lambda d: d["files"][0].update(states=["nope"]), "does not describe"),
    (lambda d: d["files"][0].update(entries=[1]), "entries is not an object of counts"),
    (lambda d: d["files"][0].update(footer_xxh64=12), "footer_xxh64"),
    (lambda d: d["files"][0].update(version=7), "newer than the manifest"),
    (lambda d: d.update(max_parallelism=0), "max_parallelism"),
    (lambda d: d.update(files={"x": 1}), "files is not a list"),
    (lambda d: d.update(commit_id="XYZ"), "commit_id is not 32 lowercase hex"),
])
def test_forged_manifests_are_corrupt_not_type_errors(tmp_path, edit, what):
    store = _two_state_checkpoint(tmp_path)
    forge_manifest(store, 0, edit)
    with pytest.raises(CorruptCheckpointError, match=what):
        CheckpointStore(tmp_path).open(0)


def _forge_footer(store, version, edit_meta):
    """Rewrite the footer metadata of ``version``'s run with ``edit_meta`` and re-sign the file
    and the manifest, as a buggy writer would: every checksum is right."""
    from support.data_files import rewrite_footer_meta

    run = store.manifest(version)["files"][0]
    path = os.path.join(store.root, run["path"])
    with open(path, "rb") as f:
        raw = f.read()
    data, fsum = rewrite_footer_meta(raw, edit_meta)
    with open(path, "wb") as f:
        f.write(data)
    forge_manifest(store, version, lambda d: d["files"][0].update(size=len(data),
                                                          footer_xxh64=f"{fsum:016x}"))


@pytest.mark.parametrize("edit, what", [
    (lambda m: m["states"].reverse(), "footer holds states"),
    (lambda m: m["states"][0].update(name="b"), "footer holds states"),
    (lambda m: m["states"][0].update(value_type="float64"), "in the footer but"),
])
def test_a_footer_that_disagrees_with_the_manifest_is_corrupt(tmp_path, edit, what):
    """Entries are found by the footer's state positions: a renamed or reordered state would
    read as empty or as another state's entries."""
    store = _two_state_checkpoint(tmp_path)
    _forge_footer(store, 0, edit)
    fresh = CheckpointStore(tmp_path)
    with pytest.raises(CorruptCheckpointError, match=what):
        fresh.restore(statecore.create_backend("native", key_type="int64", max_parallelism=16), 0)
    with pytest.raises(CorruptCheckpointError, match=what):
        fresh.verify(0)


class _Snap:
    """A StateSnapshot of one int64 -> int64 value state over raw entries."""

    def __init__(self, data, kind="value"):
        self.max_parallelism, self.key_type, self.assigner = 16, "int64", "spark"
        from statecore.key_groups import KeyGroupRange

        self.key_group_range = KeyGroupRange(0, 15)
        self.data = data  # kg -> [(key bytes, value bytes)]
        self.kind = kind

    def state_metas(self):
        return [{"name": "v", "kind": self.kind, "namespace_type": "void", "value_type": "int64"}]

    def entries(self, name, kg):
        items = self.data.get(kg, [])
        return (pa.array([k for k, _ in items], pa.binary()),
                pa.array([v for _, v in items], pa.binary()))

    def release(self):
        pass


def _ekey(kg, k):
    return bytes([kg]) + k.to_bytes(8, "big", signed=True) + b"\x00"


@pytest.mark.parametrize("entries, what", [
    ({3: [(_ekey(3, 1)[:6], b"\x00" * 8)]}, "is 6 bytes, not 10"),
    ({3: [(b"\x03", b"\x00" * 8)]}, "not longer than its key-group prefix"),
    ({3: [(_ekey(3, 1), b"\x00" * 5)]}, "a value is not 8 bytes"),
])
def test_verify_is_as_strict_as_restore(tmp_path, entries, what):
    store = CheckpointStore(tmp_path)
    store.commit(0, [store.write_snapshot(_Snap(entries), 0)])
    with pytest.raises(CorruptCheckpointError, match=what):
        store.verify(0)
    for kind in BACKENDS:  # what verify refuses, a restore refuses too
        with pytest.raises((CorruptCheckpointError, InvalidInputError)):
            store.restore(_backend(kind)[0], 0)


def test_a_block_table_claiming_more_than_lz4_can_produce_is_corrupt(tmp_path):
    """Decoding allocates the raw length a block claims: a forged block table (every checksum
    right) claiming 2 GB from a few stored bytes is refused before anything is allocated (found
    by the data_file fuzz target, which grew to 2 GB of RSS)."""
    import struct

    from fuzz.targets import with_valid_checksums
    from statecore.checkpoint import format as fmt

    store = _two_state_checkpoint(tmp_path)
    run = store.manifest(0)["files"][0]
    with open(os.path.join(store.root, run["path"]), "rb") as f:
        raw = bytearray(f.read())
    f_off, f_len = struct.unpack_from("<QQ", raw, len(raw) - fmt.TRAILER_SIZE)
    (mlen,) = struct.unpack_from("<I", raw, f_off)
    first_block = f_off + 4 + mlen + 16
    struct.pack_into("<I", raw, first_block + 12, 2**31 - 1)  # raw_length of block 0
    forged = with_valid_checksums(bytes(raw))
    with pytest.raises(CorruptCheckpointError, match="more than LZ4 can produce"):
        fmt.DataFileReader(pa.BufferReader(forged), "forged.sckp")


def test_a_second_file_in_an_existing_directory_syncs_only_that_directory(tmp_path, fsyncs):
    """Directories that already exist were made durable when they were created: a later file
    syncs its own directory, not every ancestor again."""
    store = CheckpointStore(tmp_path / "ckpt")
    b, st = _backend("native")
    _put(st, range(10), 1)
    snap = b.snapshot()
    store.write_snapshot(snap, 0)
    fsyncs.clear()  # what the second file syncs
    synced = fsyncs
    d = store.write_snapshot(snap, 0, writer="p1")
    snap.release()
    dirs = [p for p, is_dir in synced if is_dir]
    assert dirs == [os.path.dirname(os.path.join(str(tmp_path / "ckpt"), d["path"]))]

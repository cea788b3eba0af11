"""A restore over a chain of runs (a full run and incremental runs on top): the native backend
loads the oldest run into empty maps and applies each newer one as upserts and removals
(``CheckpointReader.run_chunks``) instead of merging them first. The pairs applied in order give
exactly the merged entries (``entries_chunks``); both backends restore the same state through
full and incremental chains, also into fewer or more tasks; a damaged run leaves the backend as
it was. Fixed seeds."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from statecore import (
    CheckpointStore,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
    create_backend,
)
from statecore.errors import CorruptCheckpointError
from statecore.key_groups import assign_key_group, key_group_range_for_operator

pytest.importorskip("statecore._native")

MAX_P = 32
N_KEYS = 3000
KEY_GROUP = np.array([assign_key_group(k, "int64", MAX_P) for k in range(N_KEYS)])


def _descriptors():
    return (ValueStateDescriptor("v", "string"), ReducingStateDescriptor("r", "sum", "int64"),
            MapStateDescriptor("m", "int64", "int64"))


def _chain(tmp_path, seed: int, versions: int = 4, writers: int = 1):
    """A store whose versions 1.. are a full checkpoint then incremental ones of ``writers``
    native tasks, each version changing random keys (updates, new keys, removals). Returns the
    store and the expected ``{version: {state: {key: value}}}`` of the value and reducing
    states."""
    rng = np.random.default_rng(seed)
    store = CheckpointStore(str(tmp_path / f"s{seed}-{writers}"))
    tasks = [create_backend("native", key_type="int64", max_parallelism=MAX_P,
                            key_group_range=key_group_range_for_operator(MAX_P, writers, i))
             for i in range(writers)]
    owner = {k: i for i, t in enumerate(tasks) for k in _keys_of(t).tolist()}
    want: dict = {"v": {}, "r": {}}
    expected = {}
    for version in range(1, versions + 1):
        keys = rng.choice(N_KEYS, size=N_KEYS // (1 if version == 1 else 5), replace=False)
        gone = rng.choice(N_KEYS, size=0 if version == 1 else N_KEYS // 20, replace=False)
        for i, t in enumerate(tasks):
            v, r, m = (t.get_state(d) for d in _descriptors())
            mine = np.array([k for k in keys.tolist() if owner[k] == i], np.int64)
            dead = np.array([k for k in gone.tolist() if owner[k] == i], np.int64)
            ka = pa.array(mine)
            v.put_batch(ka, pa.array([f"x{version}-{k}" for k in mine.tolist()]))
            r.add_batch(ka, pa.array(np.full(len(mine), version, np.int64)))
            for k in mine[:20].tolist():
                t.set_current_key(k)
                m.put(version, k)
            if len(dead):
                v.clear_batch(pa.array(dead))
                r.clear_batch(pa.array(dead))
        for k in keys.tolist():
            want["v"][k] = f"x{version}-{k}"
            want["r"][k] = want["r"].get(k, 0) + version
        for k in gone.tolist():
            want["v"].pop(k, None)
            want["r"].pop(k, None)
        expected[version] = {s: dict(d) for s, d in want.items()}
        descs = []
        snaps = [t.snapshot(incremental=version > 1) for t in tasks]
        for i, snap in enumerate(snaps):
            descs.append(store.write_snapshot(snap, version, f"p{i}"))
        store.commit(version, descs)
        for t, snap in zip(tasks, snaps):
            t.notify_checkpoint_complete(snap.snapshot_id, version)
            snap.release()
    for t in tasks:
        t.close()
    return store, expected


def _keys_of(backend) -> np.ndarray:
    """The keys 0 .. N_KEYS-1 whose key groups ``backend`` owns (int64)."""
    kgr = backend.key_group_range
    mask = (KEY_GROUP >= kgr.start) & (KEY_GROUP <= kgr.end)
    return np.nonzero(mask)[0].astype(np.int64)


def _values(backend, name: str) -> dict:
    """``{key: value}`` of the value (``v``) or reducing (``r``) state over the backend's keys."""
    st = backend.get_state(next(d for d in _descriptors() if d.name == name))
    keys = _keys_of(backend)
    got = st.get_batch(pa.array(keys)).to_pylist()
    return {k: g for k, g in zip(keys.tolist(), got) if g is not None}


def _maps(backend) -> dict:
    """``{key: [(user key, value), ...]}`` of the map state, in its iteration order."""
    m = backend.get_state(_descriptors()[2])
    out = {}
    for k in _keys_of(backend).tolist():
        backend.set_current_key(k)
        items = list(m.items())
        if items:
            out[k] = items
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_run_chunks_applied_in_order_are_the_merged_entries(tmp_path, seed):
    store, _ = _chain(tmp_path, seed)
    for version in (1, 2, 4):
        with store.open(version) as reader:
            for name in ("v", "r", "m"):
                merged = list(reader.entries_chunks(name, 0, MAX_P - 1, max_bytes=4096))
                runs = list(reader.run_chunks(name, 0, MAX_P - 1, max_bytes=4096))
                assert len(runs) == len(merged)
                assert max(len(parts) for parts in runs) == (1 if version == 1 else version)
                for (mk, mv), parts in zip(merged, runs):
                    applied: dict = {}
                    for keys, vals in parts:
                        for k, val in zip(keys.to_pylist(), vals.to_pylist()):
                            if val is None:
                                applied.pop(k, None)
                            else:
                                applied[k] = val
                    assert sorted(applied.items()) == list(zip(mk.to_pylist(), mv.to_pylist()))
            assert list(reader.run_chunks("no such state", 0, MAX_P - 1)) == []


@pytest.mark.parametrize("writers,readers", [(1, 1), (2, 3), (3, 2)])
def test_both_backends_restore_a_chain_alike(tmp_path, writers, readers):
    store, expected = _chain(tmp_path, 5, writers=writers)
    for version in (1, 3, 4):
        for impl in ("python", "native"):
            got: dict = {"v": {}, "r": {}}
            maps: dict = {}
            for i in range(readers):
                b = create_backend(impl, key_type="int64", max_parallelism=MAX_P,
                                   key_group_range=key_group_range_for_operator(MAX_P, readers, i))
                for d in _descriptors():
                    b.get_state(d)
                store.restore(b, version)
                for name in got:
                    got[name].update(_values(b, name))
                maps.update(_maps(b))
                b.close()
            assert got == expected[version], (impl, version)
            if impl == "python":
                want_maps = maps
            else:
                assert maps == want_maps


def test_a_damaged_incremental_run_leaves_the_backend_unchanged(tmp_path):
    store, expected = _chain(tmp_path, 7, versions=3)
    b = create_backend("native", key_type="int64", max_parallelism=MAX_P)
    store.restore(b, 1)
    before = {name: _values(b, name) for name in ("v", "r")}
    newest = max(store.describe(3)["run_list"], key=lambda r: r["seq"])
    path = tmp_path / "s7-1" / newest["path"]
    raw = bytearray(path.read_bytes())
    raw[20] ^= 0x01  # inside the first block
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptCheckpointError, match="block checksum mismatch"):
        store.restore(b, 3)
    assert {name: _values(b, name) for name in ("v", "r")} == before == {
        s: expected[1][s] for s in ("v", "r")}
    store.restore(b, 2)
    assert {name: _values(b, name) for name in ("v", "r")} == {
        s: expected[2][s] for s in ("v", "r")}


@pytest.fixture
def small_stream_chunks(monkeypatch):
    """Restores into new tables load chunks of about 4 KiB of decoded blocks as they decode
    them: many chunks per state even for these small checkpoints."""
    from statecore.backends import native

    monkeypatch.setattr(native, "_STREAM_CHUNK_BYTES", 4096)


@pytest.mark.parametrize("readers", [1, 2])
def test_a_restore_into_new_tables_loads_as_it_decodes(tmp_path, small_stream_chunks, readers):
    # No state registered before the restore: its tables are new, loaded chunk by chunk.
    store, expected = _chain(tmp_path, 11)
    for version in (1, 2, 4):
        for impl in ("python", "native"):
            got: dict = {"v": {}, "r": {}}
            for i in range(readers):
                b = create_backend(impl, key_type="int64", max_parallelism=MAX_P,
                                   key_group_range=key_group_range_for_operator(MAX_P, readers, i))
                store.restore(b, version)
                for name in got:
                    got[name].update(_values(b, name))
                b.close()
            assert got == expected[version], (impl, version)


def test_a_damaged_block_in_a_later_chunk_leaves_new_tables_out(tmp_path, small_stream_chunks):
    # The last block of state "r" fails after "v" and the first chunks of "r" were loaded into
    # their new tables: neither is registered, the backend keeps only what it held.
    store, expected = _chain(tmp_path, 13, versions=1)
    with store.open(1) as reader:
        run = reader.manifest["files"][0]
        data = reader.data_file(run)
        state = [m["name"] for m in data.state_metas()].index("r")
        rows = data._rows_of("r", MAX_P - 1, MAX_P - 1)
        assert len(rows) and rows["state"][0] == state
        last = data._blocks[int(rows["first_block"][-1] + rows["block_count"][-1] - 1)]
        chunks = len(list(reader.run_chunks("r", 0, MAX_P - 1, max_bytes=4096)))
    assert chunks > 3
    path = tmp_path / "s13-1" / run["path"]
    raw = bytearray(path.read_bytes())
    raw[int(last["offset"]) + int(last["stored_length"]) // 2] ^= 0x10
    path.write_bytes(bytes(raw))
    b = create_backend("native", key_type="int64", max_parallelism=MAX_P)
    other = b.get_state(ValueStateDescriptor("o", "int64"))
    other.put_batch(pa.array([1, 2, 3], pa.int64()), pa.array([7, 8, 9], pa.int64()))
    with pytest.raises(CorruptCheckpointError, match=f"state 'r' key group {MAX_P - 1} block"):
        store.restore(b, 1)
    assert b.num_entries() == 3
    assert other.get_batch(pa.array([1, 2, 3], pa.int64())).to_pylist() == [7, 8, 9]
    assert _values(b, "v") == {} and _values(b, "r") == {}
    b.close()

"""statecore.offline.read_state: a state of a checkpoint version as Arrow record batches, equal
to what the backend that wrote it holds, over incremental chains, in bounded batches, for a part
of the key groups, and with clear errors for what it cannot read."""

import pyarrow as pa
import pytest

from statecore import (
    CheckpointStore,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
    create_backend,
)
from statecore.errors import CheckpointNotFoundError, InvalidInputError
from statecore.offline import read_state, state_schema
from statecore.ttl import ManualClock

BACKENDS = ["python", "native"]


def _backend(kind):
    if kind == "native":
        pytest.importorskip("statecore._native")
    clock = ManualClock(1_000)
    return create_backend(kind, key_type="string", ttl_clock=clock), clock


def _write(kind, root):
    """Three versions (full, then incremental twice) of value, TTL value, namespaced reducing,
    list and map state over 300 keys; returns the store and the expected rows per state of the
    last version: {state: {(key, namespace, user_key): (value, ttl timestamp)}}."""
    b, clock = _backend(kind)
    value = b.get_state(ValueStateDescriptor("value", "int64"))
    ttl = b.get_state(ValueStateDescriptor("ttl", "string").enable_time_to_live(
        StateTtlConfig(10**9)))
    red = b.get_state(ReducingStateDescriptor("sums", "sum", "int64"), namespace_type="int64")
    lst = b.get_state(ListStateDescriptor("list", "float64"))
    mp = b.get_state(MapStateDescriptor("map", "string", "pickle"))
    expect = {n: {} for n in ("value", "ttl", "sums", "list", "map")}
    store = CheckpointStore(root)
    for version in range(3):
        clock.now = 1_000 + version
        for i in range(version * 50, 300):
            k = f"k{i}"
            b.set_current_key(k)
            value.update(i * 10 + version)
            expect["value"][(k, None, None)] = (i * 10 + version, None)
            ttl.update(f"t{version}")
            expect["ttl"][(k, None, None)] = (f"t{version}", 1_000 + version)
            red.set_current_namespace(i % 3)
            red.add(version + 1)
            old = expect["sums"].get((k, i % 3, None), (0, None))[0]
            expect["sums"][(k, i % 3, None)] = (old + version + 1, None)
            lst.add(i + version / 10)
            seq = sum(1 for key in expect["list"] if key[0] == k)
            expect["list"][(k, None, seq)] = (i + version / 10, None)
            mp.put(f"u{version}", {"v": version})
            expect["map"][(k, None, f"u{version}")] = ({"v": version}, None)
        if version == 2:
            for i in range(0, 20):
                k = f"k{i}"
                b.set_current_key(k)
                value.clear()
                del expect["value"][(k, None, None)]
                mp.remove("u0")
                del expect["map"][(k, None, "u0")]
        desc = store.write_snapshot(b.snapshot(incremental=version > 0), version)
        store.commit(version, [desc])
        b.notify_checkpoint_complete(desc["snapshot_id"], version)
    b.dispose()
    return store, expect


def _rows(batches, pickled=False):
    import pickle

    out = {}
    for batch in batches:
        for r in batch.to_pylist():
            v = pickle.loads(r["value"]) if pickled else r["value"]
            out[(r["key"], r["namespace"], r["user_key"])] = (v, r["ttl_timestamp_ms"])
    return out


@pytest.mark.parametrize("kind", BACKENDS)
def test_read_state_equals_what_was_written(tmp_path, kind):
    store, expect = _write(kind, str(tmp_path / "c"))
    assert len(store.manifest(2)["files"]) == 3  # an incremental chain
    for name in ("value", "ttl", "sums", "list", "map"):
        batches = list(read_state(store, name))
        assert all(b.schema == batches[0].schema for b in batches)
        assert _rows(batches, pickled=name == "map") == expect[name], name
    lst = pa.Table.from_batches(list(read_state(str(tmp_path / "c"), "list")))
    assert lst.schema.field("user_key").type == pa.uint64()
    # A list's elements come in list order, within its key's rows.
    k177 = [r for r in lst.to_pylist() if r["key"] == "k177"]
    assert [(r["user_key"], r["value"]) for r in k177] == [(0, 177.0), (1, 177.1), (2, 177.2)]


@pytest.mark.parametrize("kind", BACKENDS)
def test_read_state_batches_key_groups_and_older_versions(tmp_path, kind):
    store, expect = _write(kind, str(tmp_path / "c"))
    batches = list(read_state(store, "value", batch_rows=7))
    assert max(b.num_rows for b in batches) == 7 and sum(b.num_rows for b in batches) == 280
    kgs = pa.concat_arrays([b.column("key_group") for b in batches]).to_pylist()
    assert kgs == sorted(kgs)
    part = list(read_state(store, "value", key_group_range=(0, 63)))
    rest = list(read_state(store, "value", key_group_range=(64, 500)))
    assert {**_rows(part), **_rows(rest)} == expect["value"]
    assert all(0 <= kg <= 63 for b in part for kg in b.column("key_group").to_pylist())
    v0 = _rows(read_state(store, "value", version=0))
    assert v0 == {(f"k{i}", None, None): (i * 10, None) for i in range(300)}


def test_read_state_errors(tmp_path):
    store, _ = _write("python", str(tmp_path / "c"))
    with pytest.raises(InvalidInputError, match="no state 'nope'"):
        read_state(store, "nope")
    with pytest.raises(InvalidInputError, match="batch_rows"):
        read_state(store, "value", batch_rows=0)
    with pytest.raises(InvalidInputError, match="empty"):
        read_state(store, "value", key_group_range=(5, 4))
    with pytest.raises(CheckpointNotFoundError):
        read_state(store, "value", version=9)
    with pytest.raises(CheckpointNotFoundError):
        read_state(str(tmp_path / "empty"), "value")
    with pytest.raises(InvalidInputError, match="timers"):
        state_schema({"name": "__timers__", "kind": "timers"}, "string")


@pytest.mark.parametrize("kind", BACKENDS)
def test_read_changes_between_versions(tmp_path, kind):
    """The change feed from v1 to v2 holds exactly the entries that differ: the keys v2 wrote
    (updates) and the value and map entries it removed (deletes); from a version to itself,
    nothing; applied to v1's rows it gives v2's."""
    from statecore.offline import read_changes

    store, expect = _write(kind, str(tmp_path / "c"))
    for name in ("value", "map", "list", "ttl"):
        v1 = _rows(read_state(store, name, version=1))
        rows = pa.Table.from_batches(list(read_changes(store, name, 1, 2, batch_rows=13)))
        assert rows.schema.names[0] == "change_type"
        got = dict(v1)
        for r in rows.to_pylist():
            k = (r["key"], r["namespace"], r["user_key"])
            if r["change_type"] == "delete":
                assert r["value"] is None
                del got[k]
            else:
                assert r["change_type"] == "update"
                got[k] = (r["value"], r["ttl_timestamp_ms"])
        assert got == _rows(read_state(store, name, version=2)), name
        n_changed = {r["key"] for r in rows.to_pylist()}
        # v2 wrote keys k100..k299 and removed from k0..k19: nothing else changed.
        assert n_changed <= {f"k{i}" for i in list(range(100, 300)) + list(range(20))}, name
    deletes = [r for r in read_changes(store, "value", 1, 2)
               for r in r.to_pylist() if r["change_type"] == "delete"]
    assert sorted(r["key"] for r in deletes) == sorted(f"k{i}" for i in range(20))
    assert list(read_changes(store, "value", 2, 2)) == []
    with pytest.raises(InvalidInputError, match="start_version"):
        read_changes(store, "value", 3, 2)


def test_read_changes_reads_only_the_key_groups_that_changed(tmp_path, monkeypatch):
    """One key changed in an incremental version: the change feed decodes its key group only."""
    from statecore.checkpoint.readers import CheckpointReader
    from statecore.offline import read_changes

    b, _ = _backend("python")
    st = b.get_state(ValueStateDescriptor("value", "int64"))
    store = CheckpointStore(str(tmp_path / "c"))
    for version, keys in ((0, [f"k{i}" for i in range(500)]), (1, ["k7"])):
        for k in keys:
            b.set_current_key(k)
            st.update(version)
        desc = store.write_snapshot(b.snapshot(incremental=version > 0), version)
        store.commit(version, [desc])
        b.notify_checkpoint_complete(desc["snapshot_id"], version)
    read = []
    entries = CheckpointReader.entries

    def counting(self, name, kg):
        read.append(kg)
        return entries(self, name, kg)

    monkeypatch.setattr(CheckpointReader, "entries", counting)
    (batch,) = list(read_changes(store, "value", 0, 1))
    kg = batch["key_group"][0].as_py()
    assert batch.to_pylist() == [{"change_type": "update", "key_group": kg, "key": "k7",
                                  "namespace": None, "user_key": None, "value": 1,
                                  "ttl_timestamp_ms": None}]
    assert read == [kg, kg]  # both versions, one key group

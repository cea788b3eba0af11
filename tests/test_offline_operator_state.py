"""statecore.offline.read_operator_state: each old task's operator state of a version as a
table, in both backends' checkpoints, and what it refuses."""

import pyarrow as pa
import pytest

from statecore import CheckpointStore, MapStateDescriptor, create_backend
from statecore.errors import CheckpointNotFoundError, CorruptCheckpointError, InvalidInputError
from statecore.key_groups import key_group_range_for_operator
from statecore.offline import read_operator_state
from statecore.offline.entry_snapshot import EntrySnapshot


def _version(kind, root, writers=3, mp=16):
    """Version 0 of ``writers`` tasks; task i holds offsets [10i, 10i + i], union list
    ["t<i>"], broadcast {"a": i} only on tasks 0 and 2, a pickled list ["x", i]."""
    if kind == "native":
        pytest.importorskip("statecore._native")
    store = CheckpointStore(root)
    descs = []
    for i in range(writers):
        r = key_group_range_for_operator(mp, writers, i)
        b = create_backend(kind, key_type="int64", max_parallelism=mp,
                           key_group_range=(r.start, r.end))
        ops = b.operator_state
        ops.get_list_state("offsets", "int64").add_all(range(10 * i, 10 * i + i + 1))
        ops.get_union_list_state("seen", "string").add(f"t{i}")
        ops.get_list_state("blobs").add(["x", i])
        if i != 1:
            ops.get_broadcast_state(MapStateDescriptor("rules", "string", "int64")).put("a", i)
        descs.append(store.write_snapshot(b.snapshot(), 0, f"p{i}"))
    store.commit(0, descs)
    return store


@pytest.mark.parametrize("kind", ["python", "native"])
def test_every_old_task_copy_as_a_table(kind, tmp_path):
    store = _version(kind, str(tmp_path / "ck"))
    t = read_operator_state(store, "offsets")
    assert t.schema == pa.schema([("operator_index", pa.int32()), ("position", pa.uint64()),
                                  ("value", pa.int64())])
    assert t.to_pylist() == [
        {"operator_index": 0, "position": 0, "value": 0},
        {"operator_index": 1, "position": 0, "value": 10},
        {"operator_index": 1, "position": 1, "value": 11},
        {"operator_index": 2, "position": 0, "value": 20},
        {"operator_index": 2, "position": 1, "value": 21},
        {"operator_index": 2, "position": 2, "value": 22}]
    assert read_operator_state(store.uri, "__operator__.seen", 0).column("value").to_pylist() \
        == ["t0", "t1", "t2"]
    rules = read_operator_state(store, "rules")
    assert rules.schema.field("user_key").type == pa.string()
    assert rules.to_pylist() == [{"operator_index": 0, "user_key": "a", "value": 0},
                                 {"operator_index": 2, "user_key": "a", "value": 2}]
    # Pickled values come back as their pickle bytes, never unpickled.
    blobs = read_operator_state(store, "blobs")
    assert blobs.schema.field("value").type == pa.binary()
    import pickle
    assert [pickle.loads(v) for v in blobs.column("value").to_pylist()] == \
        [["x", 0], ["x", 1], ["x", 2]]


def test_refusals(tmp_path):
    store = _version("python", str(tmp_path / "ck"))
    with pytest.raises(InvalidInputError, match=r"no operator state 'nope'.*offsets"):
        read_operator_state(store, "nope")
    for bad in ("", None, 3):
        with pytest.raises(InvalidInputError):
            read_operator_state(store, bad)
    with pytest.raises(CheckpointNotFoundError):
        read_operator_state(store, "offsets", 7)
    with pytest.raises(CheckpointNotFoundError):
        read_operator_state(str(tmp_path / "empty"), "offsets")


def test_malformed_list_entry_is_a_corrupt_checkpoint(tmp_path):
    """A run whose list keys skip a sequence number (written with valid checksums)."""
    meta = {"name": "__operator__.offsets", "kind": "operator_list", "namespace_type": "void",
            "value_type": "int64"}
    entries = [(bytes([0]) + i.to_bytes(8, "big"), (7).to_bytes(8, "little", signed=True))
               for i in (0, 2)]
    snap = EntrySnapshot(16, 0, 15, "int64", "spark", [meta], {meta["name"]: {0: entries}})
    store = CheckpointStore(str(tmp_path / "ck"))
    store.commit(0, [store.write_snapshot(snap, 0)])
    with pytest.raises(CorruptCheckpointError, match=r"operator state 'offsets'.*sequence"):
        read_operator_state(store, "offsets")

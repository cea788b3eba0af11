"""statecore.offline.rewrite_max_parallelism: a version re-partitioned into another number of
key groups restores, under the new max parallelism, to the same state and timers in both
backends, in one pass or several, and what it refuses."""

import pytest

from statecore import (
    CheckpointStore,
    ListStateDescriptor,
    MapStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
    create_backend,
)
from statecore.cli import main
from statecore.errors import InvalidInputError, StateError
from statecore.key_groups import assign_key_group
from statecore.offline import read_state
from statecore.offline.rewrite import rewrite_max_parallelism
from statecore.ttl import ManualClock

BACKENDS = ["python", "native"]


def _descriptors():
    return (ValueStateDescriptor("value", "int64"),
            ListStateDescriptor("list", "string"),
            MapStateDescriptor("map", "int64", "float64"),
            ValueStateDescriptor("ttl", "string").enable_time_to_live(StateTtlConfig(10**9)))


def _backend(kind, mp, assigner="spark"):
    if kind == "native":
        pytest.importorskip("statecore._native")
    return create_backend(kind, key_type="string", max_parallelism=mp, assigner=assigner,
                          ttl_clock=ManualClock(5))


def _fill(b):
    value, lst, mp, ttl = (b.get_state(d) for d in _descriptors())
    for i in range(400):
        k = f"user-{i}"
        b.set_current_key(k)
        value.update(i)
        lst.add_all([f"a{i}", f"b{i}"])
        mp.put(i % 7, i / 2)
        ttl.update(k.upper())
        if i % 10 == 0:
            b.timers.register_event_time_timer(1_000 + i)
    return b


def _contents(b):
    value, lst, mp, ttl = (b.get_state(d) for d in _descriptors())
    out = {}
    for i in range(400):
        k = f"user-{i}"
        b.set_current_key(k)
        out[k] = (value.value(), list(lst.get()), dict(mp.items()), ttl.value())
    timers = sorted((ts, key) for _, ts, key, _ in b.timers.all_timers())
    return out, timers


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("new_mp,memory", [(256, 256 << 20), (32, 8192), (1000, 4096)])
def test_rewritten_version_restores_to_the_same_state(tmp_path, kind, new_mp, memory):
    src = _fill(_backend(kind, 128))
    want = _contents(src)
    store = CheckpointStore(str(tmp_path / "src"))
    store.commit(3, [store.write_snapshot(src.snapshot(), 3)],
                 metadata={"max_parallelism": 128, "batch_id": 3})
    src.dispose()
    raw = sum(f["raw_bytes"] for f in store.manifest(3)["files"])
    m = rewrite_max_parallelism(store, str(tmp_path / "new"), new_mp, memory_bytes=memory)
    assert m["version"] == 3 and m["max_parallelism"] == new_mp
    assert m["metadata"] == {"max_parallelism": new_mp, "batch_id": 3}
    assert len(m["files"]) == min(new_mp, max(1, -(-raw // memory)))  # a run per pass
    assert memory > raw or len(m["files"]) > 1
    restored = _backend(kind, new_mp)
    CheckpointStore(str(tmp_path / "new")).restore(restored, 3)
    assert _contents(restored) == want
    # Every key sits in the key group the new max parallelism assigns it.
    for batch in read_state(str(tmp_path / "new"), "value"):
        for r in batch.to_pylist():
            assert r["key_group"] == assign_key_group(r["key"], "string", new_mp, "spark")
    restored.dispose()
    with pytest.raises(StateError):  # the old max parallelism no longer fits
        CheckpointStore(str(tmp_path / "new")).restore(_backend(kind, 128), 3)


def test_rewrite_under_flink_assigner_and_from_the_command_line(tmp_path, capsys):
    src = _fill(_backend("python", 64, assigner="flink"))
    want = _contents(src)
    store = CheckpointStore(str(tmp_path / "src"))
    store.commit(0, [store.write_snapshot(src.snapshot(), 0)])
    assert main(["rewrite", str(tmp_path / "src"), "--max-parallelism", "300",
                 "--output", str(tmp_path / "new")]) == 0
    assert "version 0" in capsys.readouterr().out
    restored = _backend("python", 300, assigner="flink")
    CheckpointStore(str(tmp_path / "new")).restore(restored, 0)
    assert _contents(restored) == want


def test_rewrite_refuses(tmp_path):
    b = _fill(_backend("python", 128))
    store = CheckpointStore(str(tmp_path / "src"))
    store.commit(0, [store.write_snapshot(b.snapshot(), 0)])
    with pytest.raises(InvalidInputError, match="max_parallelism"):
        rewrite_max_parallelism(store, str(tmp_path / "a"), 0)
    with pytest.raises(InvalidInputError, match="memory_bytes"):
        rewrite_max_parallelism(store, str(tmp_path / "a"), 64, memory_bytes=0)
    rewrite_max_parallelism(store, str(tmp_path / "a"), 64)
    with pytest.raises(InvalidInputError, match="already holds versions"):
        rewrite_max_parallelism(store, str(tmp_path / "a"), 64)
    part = create_backend("python", key_type="string", key_group_range=(0, 63))
    part.get_state(ValueStateDescriptor("value", "int64"))
    half = CheckpointStore(str(tmp_path / "half"))
    half.commit(0, [half.write_snapshot(part.snapshot(), 0)])
    with pytest.raises(InvalidInputError, match="not all of them"):
        rewrite_max_parallelism(half, str(tmp_path / "b"), 64)


def test_rewrite_refuses_operator_state(tmp_path):
    b = _fill(_backend("python", 128))
    b.operator_state.get_list_state("offsets", "int64").add(1)
    store = CheckpointStore(str(tmp_path / "src"))
    store.commit(0, [store.write_snapshot(b.snapshot(), 0)])
    with pytest.raises(InvalidInputError, match="operator state"):
        rewrite_max_parallelism(store, str(tmp_path / "a"), 64)
    assert CheckpointStore(str(tmp_path / "a")).versions() == []

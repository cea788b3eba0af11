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


def _writers_with_operator_state(kind, tmp_path, writers=3, mp=128):
    """A version 0 written by ``writers`` tasks of ``mp`` key groups: the keyed state of
    :func:`_fill` split by key group, and per task an even-split list of task-specific length,
    a union list and a broadcast state (equal copies)."""
    from statecore.key_groups import key_group_range_for_operator

    store = CheckpointStore(str(tmp_path / "src"))
    full = _fill(_backend(kind, mp))
    snap = full.snapshot()
    descs = []
    for i in range(writers):
        r = key_group_range_for_operator(mp, writers, i)
        b = create_backend(kind, key_type="string", max_parallelism=mp, assigner="spark",
                           ttl_clock=ManualClock(5), key_group_range=(r.start, r.end))
        b.restore(snap)
        ops = b.operator_state
        ops.get_list_state("offsets", "int64").add_all(range(10 * i, 10 * i + 2 + 3 * i))
        ops.get_union_list_state("seen", "string").add_all([f"t{i}-a", f"t{i}-b"])
        rules = ops.get_broadcast_state(MapStateDescriptor("rules", "string", "int64"))
        rules.put_all({"delay": 30, "gate": 7})
        descs.append(store.write_snapshot(b.snapshot(), 0, f"p{i}"))
    store.commit(0, descs)
    return store, full


def _operator_view(kind, root, mp, index, parallelism):
    b = create_backend(kind, key_type="string", max_parallelism=mp, assigner="spark",
                       ttl_clock=ManualClock(5))
    CheckpointStore(root).restore(b, 0, operator_index=index, parallelism=parallelism)
    ops = b.operator_state
    return (list(ops.get_list_state("offsets", "int64").get()),
            list(ops.get_union_list_state("seen", "string").get()),
            dict(ops.get_broadcast_state(MapStateDescriptor("rules", "string", "int64")).items()))


@pytest.mark.parametrize("kind", BACKENDS)
def test_rewrite_carries_operator_state_per_old_task(kind, tmp_path):
    """As many passes as old tasks: every task, at every parallelism, restores the same
    operator state from the rewritten version as from the source; keyed state moves too."""
    store, full = _writers_with_operator_state(kind, tmp_path)
    m = rewrite_max_parallelism(store, str(tmp_path / "new"), 64)
    assert len(m["files"]) == 3
    for p in (1, 2, 3, 5):
        for i in range(p):
            assert (_operator_view(kind, str(tmp_path / "new"), 64, i, p)
                    == _operator_view(kind, store.uri, 128, i, p)), (p, i)
    # At the old parallelism every task gets its own even-split list back.
    assert [_operator_view(kind, str(tmp_path / "new"), 64, i, 3)[0] for i in range(3)] == \
        [[0, 1], [10, 11, 12, 13, 14], [20, 21, 22, 23, 24, 25, 26, 27]]
    b = _backend(kind, 64)
    CheckpointStore(str(tmp_path / "new")).restore(b)
    assert _contents(b) == _contents(full)


@pytest.mark.parametrize("kind", BACKENDS)
def test_rewrite_below_the_old_parallelism_merges_the_last_tasks(kind, tmp_path):
    """Two new key groups for three old tasks: the second pass holds tasks 1 and 2, their
    lists concatenated; union lists and broadcast state restore as from the source, and
    even-split lists hold the same elements in the same order across the tasks."""
    store, _ = _writers_with_operator_state(kind, tmp_path)
    rewrite_max_parallelism(store, str(tmp_path / "new"), 2)
    new = str(tmp_path / "new")
    assert _operator_view(kind, new, 2, 0, 1) == _operator_view(kind, store.uri, 128, 0, 1)
    views = [_operator_view(kind, new, 2, i, 2) for i in range(2)]
    assert views[0][0] == [0, 1]
    assert views[1][0] == [10, 11, 12, 13, 14, 20, 21, 22, 23, 24, 25, 26, 27]
    for i in range(2):
        source = _operator_view(kind, store.uri, 128, i, 2)
        assert views[i][1:] == source[1:]


def test_rewrite_in_more_passes_than_old_tasks_keeps_operator_state(tmp_path):
    """Memory for one key group a pass: the extra passes hold no operator state; lists keep
    their elements and order, union and broadcast restore as from the source."""
    store, _ = _writers_with_operator_state("python", tmp_path)
    m = rewrite_max_parallelism(store, str(tmp_path / "new"), 8, memory_bytes=1)
    assert len(m["files"]) == 8
    new = str(tmp_path / "new")
    for p in (1, 3, 8):
        views = [_operator_view("python", new, 8, i, p) for i in range(p)]
        source = [_operator_view("python", store.uri, 128, i, p) for i in range(p)]
        assert [x for v in views for x in v[0]] == [x for v in source for x in v[0]]
        assert [v[1:] for v in views] == [v[1:] for v in source]

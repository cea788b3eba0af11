"""Flink's rescaling matrix at max parallelism 128 (4->2, 2->4, 2->2, 15->77, 77->15): state
written by n operator instances, each owning its key-group range (Flink
KeyGroupRangeAssignment.computeKeyGroupRangeForOperatorIndex), through a full and an
incremental checkpoint, restores into m instances so that every key's value, list, map, TTL
timestamp and timer is in exactly the instance that owns its key group now, nothing lost,
nothing twice, in both backends."""

import pytest

from statecore import (
    CheckpointStore,
    ListStateDescriptor,
    MapStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
    create_backend,
)
from statecore.key_groups import (
    assign_key_group,
    key_group_range_for_operator,
    operator_index_for_key_group,
)
from statecore.ttl import ManualClock

MAX_P = 128
KEYS = [f"key-{i}" for i in range(600)]


def _descriptors():
    return (ValueStateDescriptor("value", "int64"), ListStateDescriptor("list", "int64"),
            MapStateDescriptor("map", "string", "int64"),
            ValueStateDescriptor("ttl", "int64").enable_time_to_live(StateTtlConfig(10**6)))


def _instances(kind, n, clock):
    return [create_backend(kind, key_type="string", max_parallelism=MAX_P,
                           key_group_range=key_group_range_for_operator(MAX_P, n, i),
                           ttl_clock=clock) for i in range(n)]


def _owner(key, n):
    return operator_index_for_key_group(MAX_P, n, assign_key_group(key, "string", MAX_P))


def _write(b, key, round_):
    value, lst, mp, ttl = (b.get_state(d) for d in _descriptors())
    b.set_current_key(key)
    value.update(len(key) * 100 + round_)
    lst.add(round_)
    mp.put(f"r{round_}", round_)
    ttl.update(round_)
    b.timers.register_event_time_timer(1_000 * round_ + len(key))


def _read(b, key):
    value, lst, mp, ttl = (b.get_state(d) for d in _descriptors())
    b.set_current_key(key)
    return value.value(), list(lst.get()), dict(mp.items()), ttl.value()


@pytest.mark.parametrize("kind", ["python", "native"])
@pytest.mark.parametrize("n,m", [(4, 2), (2, 4), (2, 2), (15, 77), (77, 15)])
def test_rescale(tmp_path, kind, n, m):
    if kind == "native":
        pytest.importorskip("statecore._native")
    clock = ManualClock(10)
    old = _instances(kind, n, clock)
    store = CheckpointStore(str(tmp_path / "c"))
    for version in range(2):  # a full checkpoint, then an incremental one
        clock.now = 10 + version
        for key in (KEYS if version == 0 else KEYS[::3]):
            _write(old[_owner(key, n)], key, version)
        descs = [store.write_snapshot(b.snapshot(incremental=version > 0), version, f"p{i}")
                 for i, b in enumerate(old)]
        store.commit(version, descs)
        for b, d in zip(old, descs):
            b.notify_checkpoint_complete(d["snapshot_id"], version)
    want = {k: _read(old[_owner(k, n)], k) for k in KEYS}
    want_timers = sorted((ts, k) for b in old for _, ts, k, _ in b.timers.all_timers())
    new = _instances(kind, m, clock)
    for b in new:
        store.restore(b, 1)
    got_timers = []
    for i, b in enumerate(new):
        owned = [k for k in KEYS if _owner(k, m) == i]
        assert {k: _read(b, k) for k in owned} == {k: want[k] for k in owned}
        timers = b.timers.all_timers()
        assert all(_owner(k, m) == i for _, _, k, _ in timers)
        got_timers += [(ts, k) for _, ts, k, _ in timers]
        assert sum(1 for _ in b.keys("value")) == len(owned)  # nothing of other instances
    assert sorted(got_timers) == want_timers

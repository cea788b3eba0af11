"""Catching a backend up from a committed run to a later version (CheckpointStore.open_changes +
backend.apply_changes), differentially against a restore of that version, on both backends:
same contents (timers included), same next incremental snapshot, and the cases where a change
set cannot be built (the base run compacted away, a full run above it, another base)."""

from __future__ import annotations

import random

import pytest

import statecore
from statecore.checkpoint.store import CheckpointStore
from statecore.descriptors import ValueStateDescriptor
from statecore.errors import InvalidInputError, StateMigrationError
from statecore.ttl import StateTtlConfig
from test_async_snapshot import BACKENDS, _contents, _States

_RANGE = (0, 31)


def _backend(kind, max_parallelism=32):
    return statecore.create_backend(kind, key_type="int64", max_parallelism=max_parallelism,
                                    key_group_range=_RANGE)


def _checkpoint(store, b, version, incremental):
    snap = b.snapshot(incremental=incremental)
    d = store.write_snapshot(snap, version, f"p0-v{version}")
    snap.release()
    store.commit(version, [d])
    b.notify_checkpoint_complete(d["snapshot_id"], d["version"])
    return d


def _ops(st, rnd, n, start):
    for i in range(start, start + n):
        st.op(rnd, i)


def _two_versions(kind, store, seed, n):
    """A backend after ``n`` random ops, checkpointed full as version 0, then ``n // 2`` more
    ops checkpointed incrementally as version 1: (backend, states, rnd, descriptor 0, 1)."""
    rnd = random.Random(seed)
    b = _backend(kind)
    st = _States(b)
    _ops(st, rnd, n, 0)
    d0 = _checkpoint(store, b, 0, incremental=False)
    _ops(st, rnd, n // 2, 10**5)
    d1 = _checkpoint(store, b, 1, incremental=True)
    return b, st, rnd, d0, d1


def _restored(kind, store, version):
    b = _backend(kind)
    _States(b)  # registers the states as a task's processor.open would
    store.restore(b, version)
    return b


def _snapshot_contents(b, incremental=False):
    snap = b.snapshot(incremental=incremental)
    try:
        return _contents(snap)
    finally:
        snap.release()


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("seed", [1, 2])
def test_catch_up_equals_restore(tmp_path, kind, seed):
    store = CheckpointStore(str(tmp_path), max_runs=None)
    rnd = random.Random(seed)
    writer = _backend(kind)
    st = _States(writer)
    _ops(st, rnd, 3000, 0)
    base = _checkpoint(store, writer, 0, incremental=False)
    _ops(st, rnd, 1500, 10**5)
    v1_run = _checkpoint(store, writer, 1, incremental=True)["path"]
    stale = _restored(kind, store, 1)  # a worker that ran version 1 and then lost the partition
    for v in (2, 3):
        _ops(st, rnd, 1500, 10**5 * (v + 1))  # removals, clears, map removes, timer deletes
        if v == 2:
            assert writer.timers.advance_watermark(300_000)  # timers the stale copy still has
        _checkpoint(store, writer, v, incremental=True)

    changes = store.open_changes(3, v1_run, *_RANGE)
    assert changes is not None
    assert [r["seq"] for r in changes.runs] == sorted(r["seq"] for r in changes.runs)
    assert len(changes.runs) == 2 and changes.base_seq < changes.runs[0]["seq"]
    assert any(sum(r["tombstones"].values()) for r in changes.runs)
    stale.apply_changes(changes)
    changes.release()
    fresh = _restored(kind, store, 3)
    assert _snapshot_contents(stale) == _snapshot_contents(fresh) == _contents(store.open(3))
    assert stale.timers.all_timers() == fresh.timers.all_timers()
    assert fresh.timers.num_timers() > 0
    # The caught-up state is the incremental base: the next version's changes are the same.
    for b in (stale, fresh):
        _ops(_States(b), random.Random(seed + 10), 700, 10**6)
    assert (_snapshot_contents(stale, incremental=True)
            == _snapshot_contents(fresh, incremental=True))
    # From the full run of version 0 the change set is every later run.
    assert len(store.open_changes(3, base["path"], *_RANGE).runs) == 3


@pytest.mark.parametrize("kind", BACKENDS)
def test_no_change_set_without_a_plain_incremental_chain(tmp_path, kind):
    store = CheckpointStore(str(tmp_path), max_runs=None)
    b, st, rnd, d0, d1 = _two_versions(kind, store, 5, 1000)
    # The base's own version: nothing to apply.
    same = store.open_changes(1, d1["path"], *_RANGE)
    assert same is not None and same.runs == []
    assert store.open_changes(1, "data/1/elsewhere.sckp", *_RANGE) is None
    # A full run above the base: its removals left no tombstones.
    _ops(st, rnd, 500, 2 * 10**5)
    _checkpoint(store, b, 2, incremental=False)
    assert store.open_changes(2, d1["path"], *_RANGE) is None
    # The base run compacted into a full one: it is no longer in the chain.
    _ops(st, rnd, 500, 3 * 10**5)
    d3 = _checkpoint(store, b, 3, incremental=True)
    assert store.open_changes(3, d3["path"], *_RANGE).runs == []
    _ops(st, rnd, 500, 4 * 10**5)
    _checkpoint(store, b, 4, incremental=True)
    assert len(store.open_changes(4, d3["path"], *_RANGE).runs) == 1
    store.compact(4, max_runs=1)
    assert store.open_changes(4, d3["path"], *_RANGE) is None
    assert store.open_changes(4, d0["path"], *_RANGE) is None


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("bad", [None, object(), {"key_type": "int64"}])
def test_no_snapshot_at_all_is_a_clear_error_and_changes_nothing(tmp_path, kind, bad):
    # None is what open_changes returns when there is no plain change set.
    b = _backend(kind)
    st = _States(b)
    _ops(st, random.Random(3), 50, 0)
    before = _snapshot_contents(b)
    for load in (b.apply_changes, b.restore):
        with pytest.raises(InvalidInputError, match="expected a snapshot or checkpoint reader"):
            load(bad)
    assert _snapshot_contents(b) == before


@pytest.mark.parametrize("kind", BACKENDS)
def test_incompatible_change_set_leaves_the_backend_unchanged(tmp_path, kind):
    store = CheckpointStore(str(tmp_path), max_runs=None)
    d0 = _two_versions(kind, store, 7, 800)[3]
    other = statecore.create_backend(kind, key_type="int64", max_parallelism=64,
                                     key_group_range=_RANGE)
    _States(other)
    before = _snapshot_contents(other)
    with pytest.raises(StateMigrationError, match="max_parallelism"):
        other.apply_changes(store.open_changes(1, d0["path"], *_RANGE))
    assert _snapshot_contents(other) == before
    # A state registered with TTL (migration requested) against a change set without: a change
    # set is applied as stored, so it is refused before anything changes.
    ttl = _backend(kind)
    v = ttl.get_state(ValueStateDescriptor("v", "string").enable_time_to_live(
        StateTtlConfig(10**9)).enable_ttl_migration())
    ttl.set_current_key(1)
    v.update("kept")
    before = _snapshot_contents(ttl)
    with pytest.raises(StateMigrationError, match="TTL setting differs"):
        ttl.apply_changes(store.open_changes(1, d0["path"], *_RANGE))
    assert _snapshot_contents(ttl) == before


@pytest.mark.parametrize("kind", BACKENDS)
def test_worker_cache_keeps_a_stale_copy_and_catches_it_up(tmp_path, kind):
    """The Spark worker cache (statecore.spark.worker_cache): a partition's older committed copy is
    kept next to the partition the worker ran last (``stale_copies``) and caught up by
    ``_take_stale``; an entry whose write never finished is dropped without waiting for it."""
    from concurrent.futures import Future

    from statecore.key_groups import KeyGroupRange
    from statecore.spark import worker_cache as O

    O.clear_state_cache()
    store = CheckpointStore(str(tmp_path), max_runs=None)
    rnd = random.Random(3)
    mine = _backend(kind)
    _ops(_States(mine), rnd, 1000, 0)
    _checkpoint(store, mine, 0, incremental=False)
    done = Future()
    done.set_result(True)
    config = (1, 32, kind, "int64")
    k0, k1 = (store.uri, "op", 0), (store.uri, "op", 1)
    try:
        O.put_cached(k1, O.CachedState(0, "a", *config, mine, writer="p0-v0", write=done), 1)
        # This worker then ran the other partition at version 1: the copy of partition 1 stays.
        O.put_cached(k0, O.CachedState(1, "a", *config, _backend(kind), writer="x", write=done), 1)
        assert k1 in O._STATE_CACHE
        # Another worker carried partition 1 on to version 2.
        other = _restored(kind, store, 0)
        st = _States(other)
        for v in (1, 2):
            _ops(st, rnd, 600, 10**5 * v)
            _checkpoint(store, other, v, incremental=True)
        backend, changes = O.take_stale(k1, store, 2, config, KeyGroupRange(*_RANGE))
        assert backend is mine and len(changes.runs) == 2 and k1 not in O._STATE_CACHE
        backend.apply_changes(changes)
        changes.release()
        assert _snapshot_contents(mine) == _snapshot_contents(_restored(kind, store, 2))
        # Another config, or a write that never finished: no catch-up, no wait.
        never = Future()
        O.put_cached(k1, O.CachedState(1, "a", *config, _backend(kind), writer="p0-v1",
                                         write=never), 1)
        assert O.take_stale(k1, store, 2, (2, 32, kind, "int64"), KeyGroupRange(*_RANGE)) is None
        assert O.take_stale(k1, store, 2, config, KeyGroupRange(*_RANGE)) is None
        assert k1 not in O._STATE_CACHE
        never.set_result(True)
        # stale_copies=0: older copies of other partitions are closed.
        O.put_cached(k1, O.CachedState(1, "a", *config, _backend(kind), writer="y", write=done), 1)
        O.put_cached(k0, O.CachedState(2, "a", *config, _backend(kind), writer="z", write=done), 0)
        assert k1 not in O._STATE_CACHE
    finally:
        O.clear_state_cache()


@pytest.mark.parametrize("kind", BACKENDS)
def test_timers_of_a_few_key_groups_catch_up_and_are_found_from_block_tables(tmp_path, kind):
    """Timers in a few key groups only: a change set names exactly those that hold timers in its
    newest run (``key_groups_holding``, from the block tables), and a catch-up that reads only
    them still drops the timers of a key group that lost all of its own."""
    store = CheckpointStore(str(tmp_path), max_runs=None)
    writer = _backend(kind)
    st = _States(writer)
    keys = {}
    for k in range(10**4):
        keys.setdefault(writer.key_group_of(k), k)
        if len(keys) == 3:
            break
    (kg_a, key_a), (kg_b, key_b), (kg_c, key_c) = sorted(keys.items())

    def only(timers):  # state ops in most key groups, then exactly these timers
        for t in list(writer.timers.all_timers()):
            writer.set_current_key(t[2])
            writer.timers.delete_event_time_timer(t[1], t[3])
        for key, ts in timers:
            writer.set_current_key(key)
            writer.timers.register_event_time_timer(ts)

    _ops(st, random.Random(5), 300, 0)
    only([(key_a, 1000), (key_a, 2000), (key_b, 1500)])
    v0_run = _checkpoint(store, writer, 0, incremental=False)["path"]
    stale = _restored(kind, store, 0)
    assert {t[0] for t in stale.timers.all_timers()} == {kg_a, kg_b}
    _ops(st, random.Random(6), 200, 10**5)
    only([(key_a, 1000), (key_a, 2000), (key_c, 3000)])  # kg_b loses its only timer
    _checkpoint(store, writer, 1, incremental=True)
    changes = store.open_changes(1, v0_run, *_RANGE)
    assert changes.key_groups_holding("__timers__", *_RANGE) == [kg_a, kg_c]
    assert changes.key_groups_holding("__timers__", kg_a + 1, _RANGE[1]) == [kg_c]
    assert changes.key_groups_holding("no such state", *_RANGE) == []
    stale.apply_changes(changes)
    changes.release()
    assert stale.timers.all_timers() == writer.timers.all_timers()
    assert {t[0] for t in stale.timers.all_timers()} == {kg_a, kg_c}
    fresh = _restored(kind, store, 1)
    assert _snapshot_contents(stale) == _snapshot_contents(fresh)

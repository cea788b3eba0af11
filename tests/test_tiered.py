"""The tiered mode of the native backend (statecore.backends.tiered, docs/tiered.md): memory holds
a bounded working set, the attached checkpoint version the rest. Checked against the in-memory
native backend with budgets of a few KiB, so that nearly every batch evicts and most reads fetch
from the runs."""

from __future__ import annotations

import itertools
import random

import pyarrow as pa
import pytest

pytest.importorskip("statecore._native")

from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from statecore import create_backend  # noqa: E402
from statecore.backends.tiered import TieredBackend, parse_bytes  # noqa: E402
from statecore.checkpoint import CheckpointStore  # noqa: E402
from statecore.descriptors import (  # noqa: E402
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from statecore.errors import InvalidInputError  # noqa: E402
from statecore.testing import (  # noqa: E402
    collection_batches,
    collection_reads,
    collection_state,
)
from statecore.testing.collection_batches import CollectionBatchConformance  # noqa: E402
from statecore.testing.collection_reads import CollectionReadConformance  # noqa: E402
from statecore.testing.collection_state import CollectionStateConformance  # noqa: E402
from statecore.testing.enumeration import KeyEnumerationConformance  # noqa: E402
from statecore.testing.helpers import (  # noqa: E402
    AverageAggregate,
    dump_backend,
    merge_incremental,
    snapshot_dump,
)
from statecore.testing.merging import MergingConformance  # noqa: E402
from statecore.testing.reducing import ReducingConformance  # noqa: E402
from statecore.testing.value_state import ValueStateConformance  # noqa: E402
from statecore.ttl import ManualClock, StateTtlConfig  # noqa: E402

#: Key and value bytes of an int64 -> int64 entry (1-byte prefix, key, void namespace; value).
ENTRY = 10 + 8
BUDGET = 64 * ENTRY
#: Key and value bytes of one key in the five states of the differential test (the TTL'd
#: value and accumulator carry an 8-byte timestamp).
PER_KEY = 5 * ENTRY + 2 * 8


def tiered(store, **kw):
    kw.setdefault("key_type", "int64")
    return create_backend("native", memory_budget=kw.pop("budget", BUDGET), checkpoint=store,
                          **kw)


class _AttachedTiered:
    """Tiered backends attached to an empty committed version (so every read goes through the
    load path), with a budget of a few entries."""

    _counter = itertools.count()

    @pytest.fixture(autouse=True)
    def _root(self, tmp_path):
        self._tmp = tmp_path

    def make_backend(self, **options):
        # Uncompressed runs here; the tests below mostly use LZ4 ones.
        store = CheckpointStore(self._tmp / f"s{next(self._counter)}", compression="none")
        first = create_backend("native", memory_budget=512, checkpoint=store, **options)
        store.checkpoint(first, 1)
        first.dispose()
        b = create_backend("native", memory_budget=512, checkpoint=store, **options)
        store.restore(b)
        return b


class TestTieredValueConformance(_AttachedTiered, ValueStateConformance):
    pass


class TestTieredReducingConformance(_AttachedTiered, ReducingConformance):
    pass


def _logical_dump(backend) -> dict:
    """``dump_backend`` of the logical state: for an attached tiered backend (whose snapshots
    are incremental on top of its attached version) the version's entries with its snapshot's
    changes on top."""
    if not isinstance(backend, TieredBackend) or backend.attached_version is None:
        return dump_backend(backend)
    reader = backend.store.open(backend.attached_version)
    try:
        base = snapshot_dump(reader, backend.key_group_range)
    finally:
        reader.release()
    return merge_incremental(base, dump_backend(backend))


class _LogicalDumps(_AttachedTiered):
    """The collection suites compare ``dump_backend`` of the tiered backend with the in-memory
    one's full snapshot: they compare logical states here (_logical_dump)."""

    @pytest.fixture(autouse=True)
    def _dumps(self, monkeypatch):
        for module in (collection_state, collection_batches, collection_reads):
            monkeypatch.setattr(module, "dump_backend", _logical_dump)


class TestTieredCollectionStateConformance(_LogicalDumps, CollectionStateConformance):
    # These complete checkpoints without a committed version or restore an in-memory snapshot
    # (a tiered backend attaches committed versions: InvalidInputError), or read a snapshot's
    # entries as the whole state (a tiered snapshot is incremental, tombstones included);
    # test_lists_and_maps_* and test_collections_differential_* below cover them over
    # attached versions.
    test_big_list_append_order_and_one_chunk_per_append = None
    test_list_update_after_clear_restores_exactly_through_a_chain = None
    test_list_ttl_elements_expire_in_the_middle = None
    test_map_iteration_order = None
    test_big_map_incremental_change_is_one_entry = None


# The batch and read suites run the kernels' 9000-row differentials per element and user key
# type (about 20 s on an idle machine over the tiered backend): slow. The tiered paths they take
# (a load of the rows' collections, then the kernel) are covered in the fast loop by
# test_collections_differential_against_the_in_memory_backend.
@pytest.mark.slow
class TestTieredCollectionBatchConformance(_LogicalDumps, CollectionBatchConformance):
    # Completes checkpoints without a committed version (see above).
    test_collection_batches_between_held_and_incremental_snapshots = None


@pytest.mark.slow
class TestTieredCollectionReadConformance(_LogicalDumps, CollectionReadConformance):
    # Without the incremental cleanup case: its steps visit the entries memory holds, so what
    # they remove and count (ttl_statistics, compared after each step) depends on which
    # collections were spilled and evicted; the state itself is compared for it by
    # test_tiered_spill.py's TTL'd collections with incremental cleanup.
    @pytest.mark.parametrize("update_type,visibility,cleanup", [
        ("OnCreateAndWrite", "NeverReturnExpired", None),
        ("OnReadAndWrite", "NeverReturnExpired", None),
        ("OnCreateAndWrite", "ReturnExpiredIfNotCleanedUp", None),
        ("OnReadAndWrite", "ReturnExpiredIfNotCleanedUp", None)])
    def test_collection_reads_with_ttl_differential(self, update_type, visibility, cleanup):
        super().test_collection_reads_with_ttl_differential(update_type, visibility, cleanup)


class _ObservedTiered(_AttachedTiered):
    def same_as_reference(self, program, **options):
        # Observations only: once attached, a tiered snapshot is incremental on top of the
        # attached version (its tombstones included), so its bytes differ from the reference's
        # full one; the programs observe the state through keys() and reads.
        options.setdefault("key_type", "int64")
        options.setdefault("max_parallelism", 128)
        seen = [program(b) for b in (self.make_backend(**options),
                                     self.make_reference_backend(**options))]
        assert seen[0] == seen[1]
        return seen[0]


class TestTieredKeyEnumerationConformance(_ObservedTiered, KeyEnumerationConformance):
    # These restore from an in-memory snapshot (a tiered backend attaches committed versions
    # only); test_keys_and_apply_to_all_keys_* below cover the same ground over attached
    # versions.
    test_keys_after_restore_and_incremental_snapshots_unaffected = None
    test_apply_to_all_keys_restores_the_current_key_on_error = None


class TestTieredMergingConformance(_ObservedTiered, MergingConformance):
    pass


def test_parse_bytes():
    assert parse_bytes("512MiB") == 512 << 20
    assert parse_bytes("4 KiB") == 4096
    assert parse_bytes("2GB") == 2 * 10**9
    assert parse_bytes(100) == 100
    for bad in ("lots", "-1KiB", -5, 1.5, True):
        with pytest.raises(InvalidInputError, match="memory_budget"):
            parse_bytes(bad)


def test_needs_a_store(tmp_path):
    with pytest.raises(InvalidInputError, match="checkpoint"):
        create_backend("native", memory_budget="1MiB")
    b = tiered(str(tmp_path))
    assert isinstance(b, TieredBackend)
    # A store the backend opens itself cuts small blocks (point lookups read one per run);
    # a store object given keeps its own block size.
    assert b.store.block_target_bytes == 4096
    assert tiered(CheckpointStore(tmp_path)).store.block_target_bytes == 64 << 10


def test_lists_and_maps_load_whole_evict_whole_and_keep_removals(tmp_path):
    """Lists of several chunks and maps of several user keys, written by the in-memory backend,
    read from the attached version with a budget far below one list: each collection is loaded
    whole and evicted whole; a cleared list, a cleared map and a removed user key are not read
    back from the version after their collections' clean neighbours were evicted; appends
    continue the lists; the tiered backend's incremental run restores to the in-memory
    backend's state."""
    store = CheckpointStore(tmp_path)
    ref = create_backend("native", key_type="int64")

    def states(x):
        return (x.get_state(ListStateDescriptor("l", "int64")),
                x.get_state(MapStateDescriptor("m", "int64", "int64")))

    keys = pa.array([k for k in range(10) for _ in range(40)], pa.int64())
    vals = pa.array(range(400), pa.int64())
    lst, m = states(ref)
    lst.append_batch(keys, vals)
    m.put_batch(keys, pa.array([i % 7 for i in range(400)], pa.int64()), vals)
    store.checkpoint(ref, 1)
    b = tiered(store, budget=100)
    store.restore(b)
    every = pa.array(range(10), pa.int64())
    twos = pa.array([2] * 10, pa.int64())
    out = []
    for x in (b, ref):
        lst, m = states(x)
        lst.get_batch(every)
        lst.clear_batch(pa.array([3], pa.int64()))
        m.remove_batch(pa.array([4], pa.int64()), pa.array([2], pa.int64()))
        x.set_current_key(5)
        m.clear()
        lst.get_batch(every)  # evicts every clean list, never the cleared one
        m.get_batch(every, twos)
        lst.append_batch(pa.array([7, 3], pa.int64()), pa.array([1000, 1001], pa.int64()))
        maps = []
        for k in range(10):
            x.set_current_key(k)
            maps.append(sorted(m.items()))
        out.append((lst.get_batch(every).to_pylist(), m.get_batch(every, twos).to_pylist(),
                    maps, x.keys("l"), x.keys("m")))
    assert out[0] == out[1]
    stats = b.tiered_statistics()
    assert stats["evicted_collections"] > 10 and stats["loaded"] > 100
    assert stats["evicted"] == 0  # list and map entries leave with their collections only
    store.checkpoint(b, 2)
    fresh = create_backend("native", key_type="int64")
    store.restore(fresh)
    (fl, fm), (rl, rm) = states(fresh), states(ref)
    assert fl.get_batch(every).to_pylist() == rl.get_batch(every).to_pylist()
    for k in range(10):
        fresh.set_current_key(k)
        ref.set_current_key(k)
        assert sorted(fm.items()) == sorted(rm.items()), k
    b.dispose()
    fresh.dispose()
    ref.dispose()


def test_attach_reads_from_the_runs_and_evicts_to_the_budget(tmp_path):
    store = CheckpointStore(tmp_path)
    n = create_backend("native", key_type="int64")
    v = n.get_state(ValueStateDescriptor("v", "int64"))
    keys = pa.array(range(10_000), pa.int64())
    v.put_batch(keys, pa.array(range(0, 30_000, 3), pa.int64()))
    store.checkpoint(n, 1)
    b = tiered(store)
    stats = {}
    store.restore(b, stats=stats)
    assert b.num_entries() == 0 and b.attached_version == 1
    # Attaching reads no block of the run (its footer only).
    data = sum(f["size"] for f in store.manifest(1)["files"])
    assert stats["bytes_read"] < data / 8
    tv = b.get_state(ValueStateDescriptor("v", "int64"))
    for lo in range(0, 1000, 100):
        got = tv.get_batch(pa.array(range(lo, lo + 100), pa.int64()))
        assert got.to_pylist() == list(range(3 * lo, 3 * (lo + 100), 3))
        assert b.state_bytes() <= BUDGET
    b.set_current_key(7)
    assert tv.value() == 21
    stats = b.tiered_statistics()
    assert stats["evicted"] > 0 and stats["loaded"] >= 1000
    assert stats["over_budget_batches"] == 0


def test_a_re_attach_keeps_the_files_both_versions_list_open(tmp_path):
    """After a checkpoint the backend re-attaches to its new version; the runs both versions
    list move over open, with the filters read of them: reading every key again reads the new
    run's filters only, not the full run's, and gives the same values."""
    store = CheckpointStore(tmp_path, max_runs=None)
    n = create_backend("native", key_type="int64")
    keys = pa.array(range(10_000), pa.int64())
    n.get_state(ValueStateDescriptor("v", "int64")).put_batch(keys, keys)
    store.checkpoint(n, 1)
    b = tiered(store, compact_max_runs=None)
    store.restore(b, 1)
    tv = b.get_state(ValueStateDescriptor("v", "int64"))
    assert tv.get_batch(keys).to_pylist() == list(range(10_000))
    full_filters = b.tiered_statistics()["lookup"]["filter_bytes"]
    assert full_filters > 0
    tv.put_batch(pa.array([5], pa.int64()), pa.array([-5], pa.int64()))
    store.checkpoint(b, 2)
    assert b.attached_version == 2
    b.evict()
    got = tv.get_batch(keys).to_pylist()
    assert got == [-5 if k == 5 else k for k in range(10_000)]
    again = b.tiered_statistics()["lookup"]["filter_bytes"]
    assert 0 < again < full_filters / 4  # the one-key incremental run's filters
    # The files stay readable after the first version's reader is gone.
    b2 = tiered(store, compact_max_runs=None)
    store.restore(b2, 2)
    assert b2.get_state(ValueStateDescriptor("v", "int64")).get_batch(keys).to_pylist() == got
    for x in (b, b2, n):
        x.dispose()


def test_per_record_loads_evict_down_to_the_low_watermark(tmp_path):
    """Per-record reads of keys memory lacks load one entry each; when one pushes the state
    over the budget, eviction frees down to the budget less 1/EVICT_SLACK_FRACTION of it, so
    the next loads fit without evicting."""
    from statecore.backends.tiered import EVICT_SLACK_FRACTION

    store = CheckpointStore(tmp_path)
    n = create_backend("native", key_type="int64")
    v = n.get_state(ValueStateDescriptor("v", "int64"))
    v.put_batch(pa.array(range(10_000), pa.int64()), pa.array(range(10_000), pa.int64()))
    store.checkpoint(n, 1)
    budget = 2048 * ENTRY  # a slack of 32 entries
    b = tiered(store, budget=budget)
    store.restore(b)
    tv = b.get_state(ValueStateDescriptor("v", "int64"))
    low = budget - budget // EVICT_SLACK_FRACTION
    evictions = 0
    for k in range(5_000):
        b.set_current_key(k)
        before = b.tiered_statistics()["evicted"]
        assert tv.value() == k
        if b.tiered_statistics()["evicted"] > before:
            evictions += 1
            assert b.state_bytes() <= low
        assert b.state_bytes() <= budget
    assert evictions > 0
    # The slack holds many entries: many loads fit between two evictions.
    assert evictions * 10 < b.tiered_statistics()["loaded"]


def test_removals_of_evicted_keys_and_re_puts_survive_checkpoints(tmp_path):
    store = CheckpointStore(tmp_path)
    b = tiered(store, budget=4 * ENTRY)
    v = b.get_state(ValueStateDescriptor("v", "int64"))
    v.put_batch(pa.array(range(20), pa.int64()), pa.array(range(20), pa.int64()))
    store.checkpoint(b, 1)  # fresh: a full run; the backend attaches to version 1
    assert b.attached_version == 1
    v.get_batch(pa.array(range(10, 20), pa.int64()))  # evicts most of 0..9
    v.clear_batch(pa.array([1, 2, 3], pa.int64()))
    assert v.get_batch(pa.array([1, 2, 3, 4], pa.int64())).to_pylist() == [None, None, None, 4]
    store.checkpoint(b, 2)
    v.put_batch(pa.array([2], pa.int64()), pa.array([200], pa.int64()))
    v.get_batch(pa.array(range(10, 20), pa.int64()))
    assert v.get_batch(pa.array([1, 2], pa.int64())).to_pylist() == [None, 200]
    store.checkpoint(b, 3)
    fresh = tiered(store, budget=4 * ENTRY)
    store.restore(fresh)
    fv = fresh.get_state(ValueStateDescriptor("v", "int64"))
    got = fv.get_batch(pa.array(range(20), pa.int64())).to_pylist()
    assert got == [0, None, 200, None] + list(range(4, 20))


@pytest.mark.parametrize("attached", [False, True])
def test_a_removal_while_a_checkpoint_is_in_flight_is_not_undone_by_it(tmp_path, attached):
    """A key removed after the snapshot of a checkpoint that then completes: the version the
    backend attaches to holds the key, memory does not; the removal must still hide it."""
    store = CheckpointStore(tmp_path)
    b = tiered(store, budget=2 * ENTRY)
    v = b.get_state(ValueStateDescriptor("v", "int64"))
    v.put_batch(pa.array(range(8), pa.int64()), pa.array(range(8), pa.int64()))
    if attached:
        store.checkpoint(b, 1)
    snap = b.snapshot(incremental=attached)
    desc = store.write_snapshot(snap, 2)
    v.clear_batch(pa.array([1], pa.int64()))
    b.set_current_key(2)
    v.clear()
    v.put_batch(pa.array([3], pa.int64()), pa.array([None], pa.int64()))
    manifest = store.commit(2, [desc])
    b.notify_checkpoint_complete(snap.snapshot_id, 2, manifest.get("commit_id"))
    snap.release()
    assert b.attached_version == 2
    v.get_batch(pa.array(range(4, 8), pa.int64()))  # evicts what it can
    got = v.get_batch(pa.array(range(8), pa.int64())).to_pylist()
    assert got == [0, None, None, None, 4, 5, 6, 7]
    store.checkpoint(b, 3)
    fresh = tiered(store)
    store.restore(fresh)
    fv = fresh.get_state(ValueStateDescriptor("v", "int64"))
    assert fv.get_batch(pa.array(range(8), pa.int64())).to_pylist() == got


def test_aggregating_accumulators_load_from_the_runs_and_survive_checkpoints(tmp_path):
    """Pickled accumulators written by the in-memory backend are attached, read-modify-written
    by batch and per record with keys evicted between calls, and the incremental runs on top
    restore to what the in-memory backend holds."""
    store = CheckpointStore(tmp_path)
    ref = create_backend("native", key_type="int64")
    desc = AggregatingStateDescriptor("a", AverageAggregate(), result_type="float64")
    keys = pa.array(range(300), pa.int64())
    ref.get_state(desc).add_batch(keys, pa.array(range(300), pa.int64()))
    store.checkpoint(ref, 1)
    b = tiered(store, budget=8 * ENTRY)
    store.restore(b)
    try:
        for version in range(2, 5):
            rows = pa.array([(7 * i + version) % 300 for i in range(60)], pa.int64())
            vals = pa.array([None if i % 9 == 0 else i for i in range(60)], pa.int64())
            outs = [x.get_state(desc).add_batch(rows, vals).to_pylist() for x in (b, ref)]
            assert outs[0] == outs[1]
            for x in (b, ref):
                x.set_current_key(version)
                x.get_state(desc).add(1000)
                x.get_state(desc).clear_batch(pa.array([version + 1], pa.int64()))
            store.checkpoint(b, version)
        stats = b.tiered_statistics()
        assert stats["loaded"] > 0 and stats["evicted"] > 0
        fresh = tiered(store, budget=8 * ENTRY)
        store.restore(fresh)
        want = ref.get_state(desc).get_batch(keys).to_pylist()
        assert b.get_state(desc).get_batch(keys).to_pylist() == want
        assert fresh.get_state(desc).get_batch(keys).to_pylist() == want
        fresh.dispose()
    finally:
        b.dispose()
        ref.dispose()


def test_keys_merge_memory_with_the_runs(tmp_path):
    """keys() / apply_to_all_keys() over an attached version equal the in-memory backend's:
    keys evicted (only in the runs), removed since the version (also by a checkpoint in
    flight), written only in memory, in several namespaces, through restarts."""
    rng = random.Random(5)
    store = CheckpointStore(tmp_path)
    ref = create_backend("native", key_type="int64")
    b = tiered(store, budget=6 * (ENTRY + 8))

    def state(x):
        return x.get_state(ValueStateDescriptor("v", "int64"), namespace_type="int64")

    def check():
        for ns in (None, 0, 1, 2):
            assert b.keys("v", ns) == ref.keys("v", ns), ns
        assert b.keys("v", key_group_range=(3, 40)) == ref.keys("v", key_group_range=(3, 40))

    versions = itertools.count(1)
    try:
        for step in range(1, 7):
            rows = pa.array([rng.randrange(400) for _ in range(80)], pa.int64())
            gone = pa.array([rng.randrange(400) for _ in range(30)], pa.int64())
            space = rng.randrange(3)
            for x in (b, ref):
                state(x).put_batch(rows, rows, namespaces=step % 3)
                state(x).clear_batch(gone, namespaces=space)
            check()
            snap, version = b.snapshot(), next(versions)
            desc = store.write_snapshot(snap, version)
            gone = pa.array([rng.randrange(400) for _ in range(30)], pa.int64())
            for x in (b, ref):
                state(x).clear_batch(gone, namespaces=1)
            check()  # removed after the snapshot in flight
            b.notify_checkpoint_complete(snap.snapshot_id, version,
                                         store.commit(version, [desc]).get("commit_id"))
            snap.release()
            check()
            if step % 2 == 0:
                store.checkpoint(b, next(versions))
                b.dispose()
                b = tiered(store, budget=6 * (ENTRY + 8))
                store.restore(b)
                assert b.num_entries() == 0
                check()
        seen = []
        for x in (b, ref):
            out = []

            def fn(key, st, out=out):
                out.append((key, st.value()))
                if key % 3 == 0:
                    st.clear()
                else:
                    st.update(-key)

            x.apply_to_all_keys(ValueStateDescriptor("v", "int64"), fn, namespace=1)
            seen.append(out)
        assert seen[0] == seen[1] and seen[0]
        check()
        stats = b.tiered_statistics()
        assert stats["loaded"] > 0 and stats["evicted"] > 0
    finally:
        b.dispose()
        ref.dispose()


def _tiered_and_in_memory(store, clock):
    """A tiered backend on ``store`` with a budget of two entries and an in-memory native
    backend, both on the TTL clock ``clock`` (the backends a TTL comparison runs in turn)."""
    yield tiered(store, budget=2 * (ENTRY + 8), ttl_clock=clock)
    yield create_backend("native", key_type="int64", ttl_clock=clock)


def test_keys_leave_out_keys_expired_and_removed_since_the_version(tmp_path):
    """A TTL read of the batch kernels removes an expired entry loaded from the version (a
    logged removal, no removed-set entry): keys() leaves it out, as the in-memory backend."""
    clock = ManualClock(0)
    d = ValueStateDescriptor("t", "int64").enable_time_to_live(StateTtlConfig(50))
    store = CheckpointStore(tmp_path)
    got = []
    for b in _tiered_and_in_memory(store, clock):
        clock.set(0)
        t = b.get_state(d)
        t.put_batch(pa.array(range(10), pa.int64()), pa.array(range(10), pa.int64()))
        if isinstance(b, TieredBackend):
            store.checkpoint(b, 1)
            t.get_batch(pa.array([8, 9], pa.int64()))  # evicts the others
        clock.set(100)
        assert t.get_batch(pa.array([1, 2], pa.int64())).to_pylist() == [None, None]
        b.set_current_key(3)
        assert t.value() is None
        got.append(b.keys("t"))
        b.dispose()
    assert got[0] == got[1] and len(got[0]) == 7


@pytest.mark.parametrize("kind", ["value", "reducing", "aggregating"])
def test_an_expired_value_a_batch_read_removed_is_not_read_again(tmp_path, kind):
    """ReturnExpiredIfNotCleanedUp: the first read returns an expired value loaded from the
    version and removes it; later reads return None, as in the in-memory backend (the batch
    kernels' removals are recorded like any other)."""
    clock = ManualClock(0)
    cfg = StateTtlConfig(50, state_visibility="ReturnExpiredIfNotCleanedUp")
    d = {"value": ValueStateDescriptor("t", "int64"),
         "reducing": ReducingStateDescriptor("t", "sum", "int64"),
         "aggregating": AggregatingStateDescriptor("t", AverageAggregate(),
                                                   result_type="float64")}[kind]
    d.enable_time_to_live(cfg)
    store = CheckpointStore(tmp_path)
    got = []
    for b in _tiered_and_in_memory(store, clock):
        clock.set(0)
        t = b.get_state(d)
        keys = pa.array(range(10), pa.int64())
        if kind == "value":
            t.put_batch(keys, keys)
        else:
            t.add_batch(keys, keys)
        if isinstance(b, TieredBackend):
            store.checkpoint(b, 1)
            t.get_batch(pa.array([8, 9], pa.int64()))  # evicts the others
        clock.set(100)
        reads = [t.get_batch(pa.array([1, 2, 1], pa.int64())).to_pylist() for _ in range(2)]
        if kind == "value":
            reads.append(t.contains_batch(pa.array([3, 3], pa.int64())).to_pylist())
            reads.append(t.contains_batch(pa.array([3], pa.int64())).to_pylist())
        got.append((reads, b.keys("t"), b.ttl_statistics()["read"]))
        b.dispose()
    assert got[0] == got[1]
    assert got[0][0][1] == [None, None, None]


def test_snapshots_are_incremental_once_attached(tmp_path):
    store = CheckpointStore(tmp_path)
    b = tiered(store)
    v = b.get_state(ValueStateDescriptor("v", "int64"))
    v.put_batch(pa.array([1], pa.int64()), pa.array([1], pa.int64()))
    store.checkpoint(b, 1)
    v.put_batch(pa.array([2], pa.int64()), pa.array([2], pa.int64()))
    m = store.checkpoint(b, 2, incremental=False)
    assert sorted(f["kind"] for f in m["files"]) == ["full", "incremental"]


def test_notify_needs_the_version(tmp_path):
    b = tiered(tmp_path)
    snap = b.snapshot()
    with pytest.raises(InvalidInputError, match="version"):
        b.notify_checkpoint_complete(snap.snapshot_id)
    snap.release()


# ---------------------------------------------------------------- differential, fixed seeds
KEYS = 200
_key = st.integers(0, KEYS - 1)
_op = st.one_of(
    st.tuples(st.just("put"), st.lists(st.tuples(_key, st.one_of(st.none(), st.integers(-99, 99))),
                                       min_size=1, max_size=24)),
    st.tuples(st.just("get"), st.lists(_key, min_size=1, max_size=24)),
    st.tuples(st.just("add"), st.lists(st.tuples(_key, st.integers(-5, 5)), min_size=1,
                                       max_size=24)),
    st.tuples(st.just("agg"), st.lists(st.tuples(_key, st.one_of(st.none(), st.integers(-5, 5))),
                                       min_size=1, max_size=24)),
    st.tuples(st.just("clear"), st.lists(_key, min_size=1, max_size=8)),
    st.tuples(st.just("record"), _key, st.one_of(st.none(), st.integers(0, 9))),
    st.tuples(st.just("advance"), st.integers(0, 40)),
    st.tuples(st.just("checkpoint")),
    st.tuples(st.just("restore")),
    st.tuples(st.just("keys")),
    st.tuples(st.just("apply"), st.integers(1, 3)),
)


class _SumOfSquares(AggregateFunction):
    """An int64 accumulator (a typed accumulator, so entry sizes are known)."""

    def create_accumulator(self):
        return 0

    def add(self, value, acc):
        return acc + value * value

    def get_result(self, acc):
        return acc


class TieredPair:
    """The tiered backend and the in-memory native one, driven by the same ops."""

    def __init__(self, root, budget, compression="lz4.block"):
        self.store = CheckpointStore(root, compression=compression)
        self.clock = ManualClock(1_000)
        self.budget = budget
        self.version = 0
        self.ref = create_backend("native", key_type="int64", ttl_clock=self.clock)
        self.b = self._new()
        self.dirty: set = set()  # keys written or removed since the last checkpoint
        self.spills = self._spills_seen = 0  # spill runs written, over every backend

    def _new(self):
        return tiered(self.store, budget=self.budget, ttl_clock=self.clock)

    def states(self, b):
        ttl = StateTtlConfig(50, update_type="OnReadAndWrite")
        agg = AggregatingStateDescriptor("a", _SumOfSquares(), "int64", result_type="int64")
        agg_ttl = AggregatingStateDescriptor("u", _SumOfSquares(), "int64", result_type="int64")
        return (b.get_state(ValueStateDescriptor("v", "int64")),
                b.get_state(ReducingStateDescriptor("s", "sum", "int64")),
                b.get_state(ValueStateDescriptor("t", "int64").enable_time_to_live(ttl)),
                b.get_state(agg),
                b.get_state(agg_ttl.enable_time_to_live(StateTtlConfig(30))))

    def run(self, op):
        what = op[0]
        if what == "advance":
            self.clock.advance(op[1])
            return
        if what == "checkpoint":
            self.version += 1
            self.store.checkpoint(self.b, self.version)
            self.dirty.clear()
            return
        if what == "restore":
            # A restart: checkpoint, then a new backend attaches to that version.
            self.run(("checkpoint",))
            self.b.dispose()
            self.b = self._new()
            self._spills_seen = 0
            self.store.restore(self.b)
            assert self.b.num_entries() == 0
            return
        got = [self._apply(b, op) for b in (self.b, self.ref)]
        assert got[0] == got[1], op
        # Memory is within the budget (key and value bytes): changed entries beyond it spill.
        assert self.b.state_bytes() <= self.budget, op
        self.spills += self.b.tiered_statistics()["spills"] - self._spills_seen
        self._spills_seen = self.b.tiered_statistics()["spills"]

    def _apply(self, b, op):
        v, s, t, a, u = self.states(b)
        what = op[0]
        if what == "put":
            keys = pa.array([k for k, _ in op[1]], pa.int64())
            vals = pa.array([x for _, x in op[1]], pa.int64())
            v.put_batch(keys, vals)
            t.put_batch(keys, vals)
            self.dirty.update(k for k, _ in op[1])
            return [v.get_batch(keys).to_pylist(), t.get_batch(keys).to_pylist()]
        if what == "get":
            keys = pa.array(op[1], pa.int64())
            # TTL reads renew (OnReadAndWrite): writes.
            self.dirty.update(op[1])
            return [v.get_batch(keys).to_pylist(), s.get_batch(keys).to_pylist(),
                    t.get_batch(keys).to_pylist(), v.contains_batch(keys).to_pylist(),
                    a.get_batch(keys).to_pylist(), u.get_batch(keys).to_pylist()]
        if what == "add":
            keys = pa.array([k for k, _ in op[1]], pa.int64())
            self.dirty.update(k for k, _ in op[1])
            return s.add_batch(keys, pa.array([x for _, x in op[1]], pa.int64())).to_pylist()
        if what == "agg":
            keys = pa.array([k for k, _ in op[1]], pa.int64())
            vals = pa.array([x for _, x in op[1]], pa.int64())
            self.dirty.update(k for k, _ in op[1])
            return [a.add_batch(keys, vals).to_pylist(), u.add_batch(keys, vals).to_pylist()]
        if what == "clear":
            keys = pa.array(op[1], pa.int64())
            self.dirty.update(op[1])
            for x in (v, s, t, a, u):
                x.clear_batch(keys)
            return None
        if what == "keys":
            return [b.keys(x.name) for x in (v, s, t, a, u)]
        if what == "apply":
            # Flink applyToAllKeys: read-modify-write every key of the reducing state, and
            # remove the value of every op[1]-th key of the value state.
            seen = []

            def bump(key, state):
                seen.append((key, state.get()))
                state.add(op[1])

            def drop(key, state):
                seen.append((key, state.value()))
                if key % op[1] == 0:
                    state.clear()

            b.apply_to_all_keys(s.descriptor, bump)
            b.apply_to_all_keys(v.descriptor, drop)
            self.dirty.update(k for k, _ in seen)
            return seen
        if what == "record":
            _, k, x = op
            self.dirty.add(k)
            b.set_current_key(k)
            before = (v.value(), s.get(), t.value(), a.get(), u.get())
            v.update(x)
            a.add(x)
            if x is not None:
                s.add(x)
                u.add(x)
            else:
                t.clear()
                u.clear()
            return before, v.value(), s.get(), t.value(), a.get(), u.get()
        raise AssertionError(op)


# Both block codecs: the runs (checkpoints, spills, compactions) are LZ4 or uncompressed.
@pytest.mark.parametrize("budget,compression", [(16 * ENTRY, "none"), (48 * ENTRY, "lz4.block"),
                                                (256 * ENTRY, "none")])
@seed(20261129)
@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(_op, min_size=5, max_size=60))
def test_differential_against_the_in_memory_backend(tmp_path_factory, budget, compression,
                                                    ops):
    pair = TieredPair(tmp_path_factory.mktemp("tiered"), budget, compression)
    try:
        for op in ops:
            pair.run(op)
        # The end state, read in full from both.
        keys = pa.array(range(KEYS), pa.int64())
        for x, y in zip(pair.states(pair.b), pair.states(pair.ref)):
            assert pair.b.keys(x.name) == pair.ref.keys(y.name)
            assert x.get_batch(keys).to_pylist() == y.get_batch(keys).to_pylist()
    finally:
        pair.b.dispose()
        pair.ref.dispose()
        pair.store.close()


@pytest.mark.parametrize("key_type", ["string", "int32"])
def test_namespaced_batches_with_repeated_keys_match_the_in_memory_backend(tmp_path, key_type):
    """The batch path's native key finding (batch_encoded_keys) for other key types and
    namespaces (string keys in string namespaces carry length bytes): every batch's output and
    the end state equal the in-memory backend's, through evictions, checkpoints and restarts,
    with keys repeated within a batch, NULL puts and clears."""
    rng = random.Random(11)
    store = CheckpointStore(tmp_path / "s")
    pool = [f"k{i}" * (1 + i % 3) for i in range(300)] if key_type == "string" \
        else list(range(-150, 150))
    spaces = ["a", "bb", ""]
    typ = pa.string() if key_type == "string" else pa.int32()

    def states(x):
        return (x.get_state(ValueStateDescriptor("v", "int64"), namespace_type="string"),
                x.get_state(ReducingStateDescriptor("s", "sum", "int64"), namespace_type="int64"))

    ref = create_backend("native", key_type=key_type)
    b = tiered(store, key_type=key_type, budget=40 * 40)
    try:
        for version in range(1, 9):
            keys = pa.array([rng.choice(pool) for _ in range(400)], typ)
            vals = pa.array([None if rng.random() < 0.1 else rng.randrange(100)
                             for _ in range(400)], pa.int64())
            ones = pa.array([1] * 400, pa.int64())
            ns = pa.array([rng.choice(spaces) for _ in range(400)])
            nsi = pa.array([rng.randrange(3) for _ in range(400)], pa.int64())
            gone = pa.array([rng.choice(pool) for _ in range(30)], typ)
            outs = []
            for x in (b, ref):
                v, s = states(x)
                v.put_batch(keys, vals, namespaces=ns)
                added = s.add_batch(keys, ones, namespaces=nsi).to_pylist()
                v.clear_batch(gone, namespaces="a")
                s.clear_batch(gone, namespaces=1)
                outs.append((added, v.get_batch(keys, namespaces=ns).to_pylist(),
                             s.get_batch(keys, namespaces=nsi).to_pylist(),
                             v.contains_batch(gone, namespaces="a").to_pylist()))
            assert outs[0] == outs[1]
            store.checkpoint(b, version)
            if version % 3 == 0:
                b.dispose()
                b = tiered(store, key_type=key_type, budget=40 * 40)
                store.restore(b)
        assert b.tiered_statistics()["evicted"] > 0 and b.tiered_statistics()["loaded"] > 0
        everything = pa.array(pool * 3, typ)
        for space in spaces:
            got = [states(x)[0].get_batch(pa.array(pool, typ), namespaces=space).to_pylist()
                   for x in (b, ref)]
            assert got[0] == got[1]
        got = [states(x)[1].get_batch(everything, namespaces=pa.array(
            [i // len(pool) for i in range(len(everything))], pa.int64())).to_pylist()
            for x in (b, ref)]
        assert got[0] == got[1]
    finally:
        b.dispose()
        ref.dispose()
        store.close()


# ---------------------------------------------------------------- list and map states
CKEYS = 40
_ckey = st.integers(0, CKEYS - 1)
_cop = st.one_of(
    st.tuples(st.just("append"), st.lists(st.tuples(_ckey, st.integers(-99, 99)), min_size=1,
                                          max_size=40)),
    st.tuples(st.just("lget"), st.lists(_ckey, min_size=1, max_size=16)),
    st.tuples(st.just("mput"), st.lists(st.tuples(_ckey, st.integers(0, 6), st.integers(-9, 9)),
                                        min_size=1, max_size=24)),
    st.tuples(st.just("mget"), st.lists(st.tuples(_ckey, st.integers(0, 6)), min_size=1,
                                        max_size=16)),
    st.tuples(st.just("mremove"), st.lists(st.tuples(_ckey, st.integers(0, 6)), min_size=1,
                                           max_size=8)),
    st.tuples(st.just("clear"), st.lists(_ckey, min_size=1, max_size=6)),
    st.tuples(st.just("record"), _ckey, st.integers(0, 9)),
    st.tuples(st.just("merge"), _ckey, st.integers(0, 3), st.integers(0, 3)),
    st.tuples(st.just("advance"), st.integers(0, 40)),
    st.tuples(st.just("checkpoint")),
    st.tuples(st.just("restore")),
    st.tuples(st.just("keys")),
    st.tuples(st.just("apply"), st.integers(1, 3)),
)


class _CollectionPair(TieredPair):
    """:class:`TieredPair` over list and map states (TTL'd or not, and a namespaced list for
    merge_namespaces); maps compared as sets of items (a map loaded from the runs iterates in
    user-key byte order, as after a restore)."""

    def states(self, b):
        ttl = StateTtlConfig(50, update_type="OnReadAndWrite")
        return (b.get_state(ListStateDescriptor("l", "int64")),
                b.get_state(ListStateDescriptor("lt", "int64").enable_time_to_live(ttl)),
                b.get_state(MapStateDescriptor("m", "int64", "int64")),
                b.get_state(MapStateDescriptor("mt", "int64", "int64").enable_time_to_live(
                    StateTtlConfig(30))),
                b.get_state(ListStateDescriptor("ln", "int64"), namespace_type="int64"))

    def run(self, op):
        if op[0] in ("advance", "checkpoint", "restore"):
            return super().run(op)
        got = [self._apply(b, op) for b in (self.b, self.ref)]
        assert got[0] == got[1], op
        # List and map changes beyond the budget spill, and their collections are evicted.
        assert self.b.state_bytes() <= self.budget, op

    def _apply(self, b, op):
        lst, lt, m, mt, ln = self.states(b)
        what = op[0]
        if what == "append":
            keys = pa.array([k for k, _ in op[1]], pa.int64())
            vals = pa.array([x for _, x in op[1]], pa.int64())
            lst.append_batch(keys, vals)
            lt.append_batch(keys, vals)
            return [lst.get_batch(keys).to_pylist(), lt.get_batch(keys).to_pylist()]
        if what == "lget":
            keys = pa.array(op[1], pa.int64())
            return [lst.get_batch(keys).to_pylist(), lt.get_batch(keys).to_pylist()]
        if what == "mput":
            keys, uks, vals = (pa.array(c, pa.int64()) for c in zip(*op[1]))
            m.put_batch(keys, uks, vals)
            mt.put_batch(keys, uks, vals)
            return None
        if what in ("mget", "mremove"):
            keys, uks = (pa.array(c, pa.int64()) for c in zip(*op[1]))
            if what == "mremove":
                m.remove_batch(keys, uks)
                mt.remove_batch(keys, uks)
            return [m.get_batch(keys, uks).to_pylist(), mt.get_batch(keys, uks).to_pylist(),
                    m.contains_batch(keys, uks).to_pylist()]
        if what == "clear":
            keys = pa.array(op[1], pa.int64())
            for x in (lst, lt, m, mt):
                x.clear_batch(keys)
            ln.clear_batch(keys, namespaces=0)
            return None
        if what == "keys":
            return [b.keys(x.name) for x in (lst, lt, m, mt, ln)]
        if what == "apply":
            seen = []

            def visit_list(key, state):
                seen.append((key, state.get()))
                if key % op[1] == 0:
                    state.clear()
                else:
                    state.add(op[1])

            def visit_map(key, state):
                seen.append((key, sorted(state.items())))
                state.put(op[1], key)
                state.remove(0)

            b.apply_to_all_keys(lst.descriptor, visit_list)
            b.apply_to_all_keys(m.descriptor, visit_map)
            return seen
        if what == "record":
            _, k, x = op
            b.set_current_key(k)
            before = (lst.get(), lt.get(), sorted(m.items()), sorted(mt.items()), m.contains(x),
                      mt.get(x), len(m.keys()))
            lst.add(x)
            lt.add_all([x, x + 1])
            if x % 3 == 0:
                m.remove(x % 5)
                mt.clear()
            else:
                m.put(x % 5, x)
                mt.put(x % 4, x)
            ln.set_current_namespace(x % 4)
            ln.add(x)
            return before, lst.get(), lt.get(), sorted(m.items()), sorted(mt.items()), ln.get()
        if what == "merge":
            _, k, target, source = op
            b.set_current_key(k)
            ln.merge_namespaces(target, [source, (source + 1) % 4])
            out = []
            for n in range(4):
                ln.set_current_namespace(n)
                out.append(ln.get())
            return out
        raise AssertionError(op)


@pytest.mark.parametrize("budget", [200, 800])
@seed(20261129)
@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(_cop, min_size=5, max_size=50))
def test_collections_differential_against_the_in_memory_backend(tmp_path_factory, budget, ops):
    """List and map states (per record and batch, TTL'd or not, merge_namespaces, keys and
    apply_to_all_keys) give what the in-memory backend gives through evictions, checkpoints
    and restarts; then the whole end state is read from both."""
    pair = _CollectionPair(tmp_path_factory.mktemp("tiered"), budget)
    try:
        for op in ops:
            pair.run(op)
        keys = pa.array(range(CKEYS), pa.int64())
        mine, ref = pair.states(pair.b), pair.states(pair.ref)
        for x, y in zip(mine, ref):
            assert pair.b.keys(x.name) == pair.ref.keys(y.name)
        for x, y in zip(mine[:2], ref[:2]):
            assert x.get_batch(keys).to_pylist() == y.get_batch(keys).to_pylist()
        for k in range(CKEYS):
            got = []
            for b, (_, _, m, mt, ln) in ((pair.b, mine), (pair.ref, ref)):
                b.set_current_key(k)
                got.append((sorted(m.items()), sorted(mt.items()),
                            [ln.set_current_namespace(n) or ln.get() for n in range(4)]))
            assert got[0] == got[1], k
    finally:
        pair.b.dispose()
        pair.ref.dispose()
        pair.store.close()

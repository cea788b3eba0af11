"""TTL cleanup strategies beyond cleanup on read: incremental (Flink scenario 6 of
shared/reference/flink-state.md: 970 of 1000 keys expired, cleaned by merely setting the current
key, also while an asynchronous snapshot is being written), per state access and per batch row,
background (a key group at a time), and the native filter agreeing with the Python one byte for
byte (statecore.ttl.filter_expired_counted vs ttl.h filter_run)."""

from __future__ import annotations

import functools
import random

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statecore import CheckpointStore, create_backend
from statecore import serializers as S
from statecore.backends.states import TableListState, TableMapState, from_stored
from statecore.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from statecore.errors import InvalidInputError
from statecore.testing.conformance import AverageAggregate
from statecore.testing.helpers import dump_backend
from statecore.ttl import ManualClock, StateTtlConfig, filter_entries

BACKENDS = ["python"]
try:
    from statecore import _native

    BACKENDS.append("native")
except ImportError:  # pragma: no cover
    _native = None

KIND = pytest.mark.parametrize("kind", BACKENDS)
EVERY_RECORD = StateTtlConfig(100, cleanup_incrementally=5, run_cleanup_for_every_record=True)


def _scenario_6_state(kind, cfg=EVERY_RECORD, n=1000, alive=30):
    clock = ManualClock(0)
    b = create_backend(kind, key_type="int64", ttl_clock=clock)
    v = b.get_state(ValueStateDescriptor("v", "int64").enable_time_to_live(cfg))
    for k in range(n):
        clock.set(0 if k < n - alive else 50)
        b.set_current_key(k)
        v.update(k)
    clock.set(120)  # the first n - alive keys are expired
    return b, v, clock


# state kind -> (descriptor, per-record write(state, k), batch write(state, keys array))
_SCENARIO_6_KINDS = {
    "value": (lambda: ValueStateDescriptor("s", "int64"),
              lambda st, k: st.update(k), lambda st, ks: st.put_batch(ks, ks)),
    "list": (lambda: ListStateDescriptor("s", "int64"),
             lambda st, k: st.add(k), lambda st, ks: st.append_batch(ks, ks)),
    "map": (lambda: MapStateDescriptor("s", "int64", "int64"),
            lambda st, k: st.put(k, k), lambda st, ks: st.put_batch(ks, ks, ks)),
    "reducing": (lambda: ReducingStateDescriptor("s", "sum", "int64"),
                 lambda st, k: st.add(k), lambda st, ks: st.add_batch(ks, ks)),
    "aggregating": (lambda: AggregatingStateDescriptor("s", AverageAggregate()),
                    lambda st, k: st.add(k), lambda st, ks: st.add_batch(ks, ks)),
}


@KIND
@pytest.mark.parametrize("state_kind", sorted(_SCENARIO_6_KINDS))
@pytest.mark.parametrize("api", ["per_record", "batch"])
@pytest.mark.parametrize("restored", [False, True], ids=["live", "restored"])
def test_scenario_6_for_every_state_kind_and_api(kind, state_kind, api, restored):
    """Flink scenario 6 for each state kind, written per record or per batch, on the live
    backend or on one restored from its snapshot: 970 of 1000 keys (one value / list element /
    map entry each) expired at 120; setting the current key on each key, with no state access,
    clears exactly those."""
    make, per_record, batch = _SCENARIO_6_KINDS[state_kind]
    clock = ManualClock(0)
    b = create_backend(kind, key_type="int64", ttl_clock=clock)
    st = b.get_state(make().enable_time_to_live(EVERY_RECORD))
    for t, ks in ((0, range(970)), (50, range(970, 1000))):
        clock.set(t)
        if api == "batch":
            batch(st, pa.array(list(ks), pa.int64()))
        else:
            for k in ks:
                b.set_current_key(k)
                per_record(st, k)
    clock.set(120)
    before = b.ttl_statistics()["incremental"]  # the writes' own steps removed nothing (t <= 50)
    assert before == 0 and b.num_entries() == 1000
    if restored:
        snap = b.snapshot()
        b = create_backend(kind, key_type="int64", ttl_clock=clock)
        b.restore(snap)
        snap.release()
        b.get_state(make().enable_time_to_live(EVERY_RECORD))
    for k in range(1000):
        b.set_current_key(k)
    assert b.num_entries() == 30
    assert b.ttl_statistics()["incremental"] == 970
    assert b.ttl_statistics()["read"] == 0


@KIND
def test_scenario_6_setting_the_current_key_cleans_everything(kind):
    b, _, _ = _scenario_6_state(kind)
    assert b.num_entries() == 1000
    for k in range(1000):
        b.set_current_key(k)  # no state access at all
    assert b.num_entries() == 30
    assert b.ttl_statistics()["incremental"] == 970
    assert b.ttl_statistics()["read"] == 0


@KIND
def test_scenario_6_across_a_concurrent_async_snapshot(kind, tmp_path):
    b, _, _ = _scenario_6_state(kind)
    snap = b.snapshot()
    store = CheckpointStore(tmp_path)
    fut = store.write_snapshot_async(snap, 1)
    for k in range(1000):
        b.set_current_key(k)
    desc = fut.result(timeout=60)
    store.commit(1, [desc])
    snap.release()
    assert b.num_entries() == 30
    # The snapshot was taken before the cleanup: the checkpoint holds all 1000 entries.
    restored = create_backend(kind, key_type="int64", ttl_clock=ManualClock(0))
    restored.restore(store.open(1))
    assert restored.num_entries() == 1000
    # The cleanup is tracked like any removal: the next incremental checkpoint has tombstones.
    inc = b.snapshot(incremental=True)
    tomb = sum(inc.entries("v", kg)[1].null_count for kg in range(128))
    assert tomb == 970


@KIND
def test_incremental_cleanup_runs_on_state_access(kind):
    cfg = StateTtlConfig(100, cleanup_incrementally=5)
    b, v, _ = _scenario_6_state(kind, cfg)
    b.set_current_key(999)
    for _ in range(1000 // 5 + 10):
        assert v.value() == 999  # alive; every access advances the iterator
    assert b.num_entries() == 30
    assert b.ttl_statistics()["incremental"] == 970
    # Without run_cleanup_for_every_record, setting keys alone cleans nothing.
    b2, _, _ = _scenario_6_state(kind, cfg)
    for k in range(1000):
        b2.set_current_key(k)
    assert b2.num_entries() == 1000


@KIND
def test_incremental_cleanup_counts_batch_rows_as_accesses(kind):
    cfg = StateTtlConfig(100, cleanup_incrementally=5)
    b, v, _ = _scenario_6_state(kind, cfg)
    # 250 accesses = 1250 entries; a step ends at the end of a pass (the writes above moved the
    # iterator already), so the second batch completes the pass.
    for _ in range(2):
        out = v.get_batch(pa.array([999] * 250, pa.int64()))
        assert out.to_pylist() == [999] * 250
    assert b.num_entries() == 30


@KIND
def test_incremental_cleanup_trims_lists_and_maps(kind):
    cfg = StateTtlConfig(100, cleanup_incrementally=1000)
    clock = ManualClock(0)
    b = create_backend(kind, key_type="int64", ttl_clock=clock)
    lst = b.get_state(ListStateDescriptor("l", "int64").enable_time_to_live(cfg))
    mp = b.get_state(MapStateDescriptor("m", "string", "int64").enable_time_to_live(cfg))
    for k in range(20):
        b.set_current_key(k)
        lst.add(1)
        mp.put("old", 1)
    clock.set(50)
    for k in range(10):
        b.set_current_key(k)
        lst.add(2)
        mp.put("new", 2)
    clock.set(120)
    b.set_current_key(0)
    lst.get()  # one access of each state: a full pass of 1000 entries
    mp.contains("zzz")
    # Keys 10..19 lost both states; keys 0..9 keep the unexpired element / entry.
    assert b.num_entries() == 20
    snap = b.snapshot()
    rest = create_backend(kind, key_type="int64", ttl_clock=ManualClock(120))
    rest.restore(snap)
    rl = rest.get_state(ListStateDescriptor("l", "int64").enable_time_to_live(cfg))
    rm = rest.get_state(MapStateDescriptor("m", "string", "int64").enable_time_to_live(cfg))
    rest.set_current_key(3)
    assert rl.get() == [2]
    assert rm.items() == [("new", 2)]
    stats = b.ttl_statistics()
    assert stats["incremental"] == 20 + 20  # one expired list element and one map entry per key
    assert stats["read"] == 0


@KIND
def test_incremental_cleanup_survives_rehash_and_growth(kind):
    clock = ManualClock(0)
    b = create_backend(kind, key_type="int64", ttl_clock=clock)
    cfg = StateTtlConfig(100, cleanup_incrementally=3, run_cleanup_for_every_record=True)
    v = b.get_state(ValueStateDescriptor("v", "int64").enable_time_to_live(cfg))
    # Grow the state while the iterator walks it: rehashes start and finish in between.
    for k in range(5000):
        clock.set(k // 50)
        b.set_current_key(k)
        v.update(k)
    clock.set(10_000)
    for i in range(5000):
        b.set_current_key(5000 + i)  # keys never written: only the cleanup acts
    assert b.num_entries() == 0
    assert b.ttl_statistics()["incremental"] == 5000


@KIND
def test_background_cleanup_a_key_group_at_a_time(kind):
    clock = ManualClock(0)
    b = create_backend(kind, key_type="int64", ttl_clock=clock, max_parallelism=16)
    bg = StateTtlConfig(100, cleanup_in_background=True)
    v = b.get_state(ValueStateDescriptor("v", "int64").enable_time_to_live(bg))
    other = b.get_state(ValueStateDescriptor("o", "int64").enable_time_to_live(StateTtlConfig(100)))
    for k in range(400):
        b.set_current_key(k)
        v.update(k)
        other.update(k)
    clock.set(100)
    removed = b.run_background_ttl_cleanup()  # one key group
    assert 0 < removed < 400
    assert b.num_entries() == 800 - removed
    total = removed + b.run_background_ttl_cleanup(max_key_groups=15)
    assert total == 400
    assert b.num_entries() == 400  # the state without background cleanup keeps its entries
    assert b.ttl_statistics()["background"] == 400
    assert b.run_background_ttl_cleanup(max_key_groups=16) == 0
    with pytest.raises(InvalidInputError):
        b.run_background_ttl_cleanup(0)


@KIND
def test_cleanup_is_invisible_to_live_snapshots(kind):
    b, _, _ = _scenario_6_state(kind)
    snap = b.snapshot()
    before = {kg: snap.entries("v", kg) for kg in range(128)}
    for k in range(1000):
        b.set_current_key(k)
    assert b.num_entries() == 30
    for kg in range(128):
        keys, vals = snap.entries("v", kg)
        assert keys.equals(before[kg][0]) and vals.equals(before[kg][1])
    snap.release()


def test_incremental_cleanup_is_identical_across_backends():
    """The two backends walk in different orders, but after a full pass the contents and the
    counts agree."""
    results = []
    for kind in BACKENDS:
        clock = ManualClock(0)
        b = create_backend(kind, key_type="int64", ttl_clock=clock)
        cfg = StateTtlConfig(100, cleanup_incrementally=7, run_cleanup_for_every_record=True)
        r = b.get_state(ReducingStateDescriptor("r", "sum", "int64").enable_time_to_live(cfg))
        rng = random.Random(5)
        for step in range(3000):
            clock.set(step // 10)
            b.set_current_key(rng.randrange(400))
            r.add(1)
        for k in range(2000):
            b.set_current_key(k % 400)
        snap = b.snapshot()
        results.append(([snap.entries("r", kg) for kg in range(128)], b.ttl_statistics()))
    for other in results[1:]:
        # Which entries a read met first depends on the walk order; the total does not.
        assert sum(other[1].values()) == sum(results[0][1].values())
        for (k0, v0), (k1, v1) in zip(results[0][0], other[0]):
            assert k0.equals(k1) and v0.equals(v1)


# ---------------------------------------------------------------------------------------------
# The C++ filter (ttl.h) against the Python reference, on generated TTL values.

def _ts(t):
    return t.to_bytes(8, "big", signed=True)


_times = st.integers(min_value=-5, max_value=300)


@st.composite
def _ttl_value(draw, kind, width):
    if kind == "value":
        return draw(st.binary(max_size=12)) + _ts(draw(_times))
    if kind == "list":
        n = draw(st.integers(1, 5))
        times = sorted(draw(st.lists(_times, min_size=n, max_size=n)))
        out = b""
        for t in times:
            e = (draw(st.binary(min_size=width, max_size=width)) if width
                 else draw(st.binary(max_size=200)))
            out += (b"" if width else S.write_varlen(len(e))) + e + _ts(t)
        return out
    n = draw(st.integers(1, 4))
    out = b""
    for i in range(n):
        uk = bytes([i]) + draw(st.binary(max_size=3))
        uv = draw(st.binary(max_size=4)) + _ts(draw(_times))
        out += S.write_varlen(len(uk)) + uk + S.write_varlen(len(uv)) + uv
    return out


@pytest.mark.skipif(_native is None, reason="native extension not built")
@pytest.mark.parametrize("kind,width",
                         [("value", None), ("list", 8), ("list", None), ("map", None)])
@settings(max_examples=60, derandomize=True, deadline=None)
@given(data=st.data(), now=_times)
def test_native_filter_agrees_with_python(kind, width, data, now):
    values = [data.draw(_ttl_value(kind, width)) for _ in range(data.draw(st.integers(1, 12)))]
    keys = [bytes([1, i]) for i in range(len(values))]
    t = _native.NativeStateTable(1, 1)
    t.load(1, pa.array(keys, pa.binary()), pa.array(values, pa.binary()), 1)
    snap = t.snapshot()
    got_k, got_v, got_n = snap.entries_ttl_filtered(1, kind, width, 100, now)
    want_k, want_v, want_n = filter_entries(kind, width, 100, now, pa.array(keys, pa.binary()),
                                            pa.array(values, pa.binary()))
    assert got_k.to_pylist() == want_k.to_pylist()
    assert got_v.to_pylist() == want_v.to_pylist()
    assert got_n == want_n
    snap.release()


@pytest.mark.skipif(_native is None, reason="native extension not built")
def test_native_filter_rejects_broken_layout_without_changing_state():
    t = _native.NativeStateTable(0, 0)
    t.load(0, pa.array([b"\x00a"], pa.binary()), pa.array([b"\x05ab"], pa.binary()), 1)
    snap = t.snapshot()
    with pytest.raises(InvalidInputError, match="key group 0"):
        snap.entries_ttl_filtered(0, "list", None, 100, 0)
    with pytest.raises(InvalidInputError):
        t.ttl_cleanup_table_step(0, 0, 10, "list", None, 100, 0)
    assert t.get(0, b"\x00a") == b"\x05ab"
    with pytest.raises(InvalidInputError):
        snap.entries_ttl_filtered(0, "nope", None, 100, 0)
    with pytest.raises(InvalidInputError):
        snap.entries_ttl_filtered(0, "value", None, 0, 0)
    snap.release()


# ---------------------------------------------------------------------------------------------
# Compaction filter (checkpoint store compaction; frocksdb FlinkCompactionFilter semantics).

from statecore.ttl import CompactionTimeProvider, compaction_filter  # noqa: E402


class _CountingClock:
    def __init__(self, times):
        self.times = list(times)
        self.calls = 0

    def __call__(self):
        t = self.times[min(self.calls, len(self.times) - 1)]
        self.calls += 1
        return t


def _vals(ts_list):
    return pa.array([b"\x01" * 8 + _ts(t) for t in ts_list], pa.binary())


def test_compaction_filter_caches_the_clock_for_n_entries():
    keys = pa.array([bytes([0, i]) for i in range(10)], pa.binary())
    # N = 5: entries 0-4 see t=105 (ts 0..4 expired), entries 5-9 see t=200 (all expired).
    clock = _CountingClock([105, 200, 300])
    tp = CompactionTimeProvider(clock, 5)
    k, v, n = compaction_filter("value", None, 100, tp, keys, _vals(range(10)))
    assert n == 10 and len(k) == 0
    assert clock.calls == 3  # once at start, after 5 and after 10 entries
    # N = 10: one cached time for all ten: only ts 0..5 expire.
    clock = _CountingClock([105, 200])
    tp = CompactionTimeProvider(clock, 10)
    k, v, n = compaction_filter("value", None, 100, tp, keys, _vals(range(10)))
    assert n == 6 and k.to_pylist() == keys.to_pylist()[6:]
    # The count carries over between key groups: 4 more entries use t=200 until the 10th.
    clock = _CountingClock([105, 200])
    tp = CompactionTimeProvider(clock, 8)
    compaction_filter("value", None, 100, tp, keys.slice(0, 6), _vals(range(6)))
    assert clock.calls == 1
    k, _, n = compaction_filter("value", None, 100, tp, keys.slice(0, 4), _vals([50, 50, 90, 90]))
    assert clock.calls == 2 and n == 2  # 50s seen at t=105 (kept), 90s at t=200 (dropped)
    assert k.to_pylist() == keys.to_pylist()[:2]
    with pytest.raises(InvalidInputError):
        CompactionTimeProvider(clock, 0)
    with pytest.raises(InvalidInputError):
        CompactionTimeProvider(lambda: "now", 5)


def test_compaction_filter_keeps_short_values_filters_list_elements_and_map_entries():
    tp = CompactionTimeProvider(lambda: 150, 1000)
    keys = pa.array([b"\x00a", b"\x00b"], pa.binary())
    vals = pa.array([b"short", b"x" + _ts(0)], pa.binary())
    k, v, n = compaction_filter("value", None, 100, tp, keys, vals)
    assert k.to_pylist() == [b"\x00a"] and v.to_pylist() == [b"short"] and n == 1
    # List elements (one entry each, docs/formats.md "List state") are filtered as values,
    # wherever they are in the list.
    lkeys = pa.array([b"\x00k" + i.to_bytes(8, "big") for i in range(4)], pa.binary())
    els = [i.to_bytes(4, "big") + _ts(t) for i, t in enumerate([60, 10, 70, 0])]
    k, v, n = compaction_filter("list", 4, 100, tp, lkeys, pa.array(els, pa.binary()))
    assert k.to_pylist() == [lkeys[0].as_py(), lkeys[2].as_py()] and n == 2
    assert v.to_pylist() == [els[0], els[2]]
    # Map entries (one per user key) are filtered as values.
    ent = [b"v" + _ts(t) for t in (0, 60)]
    k, v, n = compaction_filter("map", None, 100, tp, keys, pa.array(ent, pa.binary()))
    assert k.to_pylist() == [b"\x00b"] and v.to_pylist() == [ent[1]] and n == 1


# The native compaction filter (statecore._native.ttl_filter_entries per chunk) against the
# Python reference (native=False): keys, values, counts and clock reads identical.

@st.composite
def _compaction_value(draw, kind, width):
    """A TTL value of ``kind`` as _ttl_value draws it, or one of the edge cases the filter must
    keep alike: a value too short for a timestamp, an empty list/map value, a map entry whose user
    value is too short for one."""
    shape = draw(st.sampled_from(["normal", "normal", "normal", "edge"]))
    if shape == "normal":
        return draw(_ttl_value(kind, width))
    if kind == "value":
        return draw(st.binary(max_size=7))
    if kind == "list":
        return b""
    uk = draw(st.binary(max_size=3))
    short = S.write_varlen(len(uk)) + uk + S.write_varlen(2) + b"ab"
    return draw(st.sampled_from([b"", short, short + draw(_ttl_value("map", None))]))


def _run_compaction_filter(kind, width, groups, period, times, native):
    clock = _CountingClock(times)
    tp = CompactionTimeProvider(clock, period)
    out = []
    for g, vals in enumerate(groups):
        keys = pa.array([bytes([g, i]) for i in range(len(vals))], pa.binary())
        values = pa.array(vals, pa.binary())
        k, v, n = compaction_filter(kind, width, 100, tp, keys, values, native=native)
        out.append((k.to_pylist(), v.to_pylist(), n, str(k.type), str(v.type),
                    k is keys, v is values))
    return out, clock.calls, tp.queries


@pytest.mark.skipif(_native is None, reason="native extension not built")
@pytest.mark.parametrize("kind,width", [("value", None), ("list", 8), ("list", 3),
                                        ("list", None), ("map", None)])
@settings(max_examples=60, derandomize=True, deadline=None)
@given(data=st.data())
def test_native_compaction_filter_agrees_with_python(kind, width, data):
    # Several key groups in a row with a small period: chunks end mid key group and the count
    # carries across groups, and the clock moves (also backwards) between chunks.
    groups = data.draw(st.lists(st.lists(_compaction_value(kind, width), max_size=9),
                                min_size=1, max_size=4))
    period = data.draw(st.integers(1, 6))
    times = data.draw(st.lists(_times, min_size=1, max_size=12))
    want = _run_compaction_filter(kind, width, groups, period, times, native=False)
    got = _run_compaction_filter(kind, width, groups, period, times, native=True)
    assert got == want


@pytest.mark.skipif(_native is None, reason="native extension not built")
def test_native_chunk_filter_reads_large_binary_and_sliced_arrays():
    keys = pa.array([bytes([0, i]) for i in range(6)], pa.binary())
    vals = _vals([0, 90, 10, 80, 20, 70])
    want = filter_entries("value", None, 100, 150, keys.slice(1, 4), vals.slice(1, 4))
    for k, v in [(keys.slice(1, 4), vals.slice(1, 4)),
                 (keys.cast(pa.large_binary()).slice(1, 4),
                  vals.cast(pa.large_binary()).slice(1, 4))]:
        got = _native.ttl_filter_entries("value", None, 100, 150, k, v)
        assert got[0].to_pylist() == want[0].to_pylist() == [bytes([0, 1]), bytes([0, 3])]
        assert got[1].equals(want[1]) and got[1].type == pa.binary() and got[2] == want[2] == 2
    with pytest.raises(InvalidInputError, match="3 keys but 4 values"):
        _native.ttl_filter_entries("value", None, 100, 150, keys.slice(0, 3), vals.slice(0, 4))
    with pytest.raises(InvalidInputError, match="binary"):
        _native.ttl_filter_entries("value", None, 100, 150, keys, pa.array(range(6)))


@pytest.mark.skipif(_native is None, reason="native extension not built")
@pytest.mark.parametrize("now", [2**64, 2**63 - 1, -2**63, -2**64])
def test_native_chunk_filter_takes_times_beyond_int64(now):
    keys = pa.array([bytes([0, i]) for i in range(3)], pa.binary())
    vals = _vals([0, 2**63 - 1, -2**63])
    want = filter_entries("value", None, 100, now, keys, vals)
    got = _native.ttl_filter_entries("value", None, 100, now, keys, vals)
    assert (got[0].to_pylist(), got[1].to_pylist(), got[2]) == \
        (want[0].to_pylist(), want[1].to_pylist(), want[2])


_BROKEN = [("list", 4, b"\x00\x00\x00\x01" + _ts(0) + b"\x00"),  # truncated 2nd element
           ("list", None, b"\x05ab"),                               # varlen past the end
           ("list", None, b"\x80"),                                 # truncated varlen
           ("list", None, b"\xff" * 11)]                            # varlen over 64 bits


@pytest.mark.skipif(_native is None, reason="native extension not built")
@pytest.mark.parametrize("kind,width,broken", _BROKEN)
@pytest.mark.parametrize("native", [False, True])
def test_whole_list_filter_rejects_a_broken_layout_on_both_paths(kind, width, broken, native):
    # The filter of the whole-list layout (ttl.h Layout::List; no state stores whole lists since
    # format 4, docs/formats.md "List state"), called directly.
    keys = pa.array([b"\x00a", b"\x00b"], pa.binary())
    good = (S.write_varlen(0) + _ts(200)) if width is None else b"\x00" * width + _ts(200)
    chunk = _native.ttl_filter_entries if native else filter_entries
    with pytest.raises(InvalidInputError, match="truncated|varlen|longer"):
        chunk(kind, width, 100, 150, keys, pa.array([good, broken], pa.binary()))


@pytest.mark.parametrize("native", [False, True] if _native is not None else [False])
def test_compaction_filter_rejects_null_values_on_both_paths(native):
    tp = CompactionTimeProvider(lambda: 150, 1000)
    keys = pa.array([b"\x00a", b"\x00b"], pa.binary())
    with pytest.raises(InvalidInputError, match="NULL"):
        compaction_filter("value", None, 100, tp, keys, pa.array([_ts(0), None], pa.binary()),
                          native=native)


@pytest.mark.parametrize("native", [False, True] if _native is not None else [False])
def test_store_compaction_reports_a_broken_layout_as_corrupt(native, monkeypatch):
    """RangeView turns the filter's InvalidInputError into CorruptCheckpointError naming the
    state and key group, whichever path filtered."""
    from statecore import ttl as ttl_module
    from statecore.checkpoint import compaction as compaction_module
    from statecore.errors import CorruptCheckpointError

    class _Reader:
        max_parallelism, key_type, assigner = 128, "int64", "spark"

        def entries(self, name, kg):
            return pa.array([b"\x00a"], pa.binary()), pa.array([None], pa.binary())

    real = ttl_module.compaction_filter
    monkeypatch.setattr(compaction_module, "compaction_filter",
                        lambda *a: real(*a, native=native))
    view = compaction_module.RangeView(_Reader(), 0, 3, {
        "l": ("list", None, 100, CompactionTimeProvider(lambda: 0, 10))})
    with pytest.raises(CorruptCheckpointError, match="'l', key group 2: TTL value layout broken"):
        view.entries("l", 2)


@KIND
def test_store_compaction_drops_expired_entries(kind, tmp_path):
    clock = ManualClock(0)
    cfg = StateTtlConfig(100, cleanup_in_compaction=3)
    b = create_backend(kind, key_type="int64", ttl_clock=clock)
    v = b.get_state(ValueStateDescriptor("v", "int64").enable_time_to_live(cfg))
    lst = b.get_state(ListStateDescriptor("l", "int64").enable_time_to_live(cfg))
    plain = b.get_state(ValueStateDescriptor("p", "int64").enable_time_to_live(StateTtlConfig(100)))
    for k in range(50):
        b.set_current_key(k)
        v.update(k)
        lst.add(k)
        plain.update(k)
    store = CheckpointStore(tmp_path, max_runs=None, ttl_clock=clock)
    snap = b.snapshot()
    store.commit(1, [store.write_snapshot(snap, 1)])
    b.notify_checkpoint_complete(snap.snapshot_id, 1)
    clock.set(60)
    for k in range(10):  # written again at 60: survive the compaction at 120
        b.set_current_key(k)
        v.update(-k)
        lst.add(1000 + k)
    snap = b.snapshot(incremental=True)
    store.commit(2, [store.write_snapshot(snap, 2)])
    clock.set(120)
    m = store.compact(2, max_runs=1)
    assert m["ttl_compaction_expired"] == {"v": 40, "l": 50}  # 40 values; 40 lists + 10 elements
    assert store.describe(2)["ttl_compaction_expired"] == {"v": 40, "l": 50}
    r = create_backend(kind, key_type="int64", ttl_clock=ManualClock(0))
    r.restore(store.open(2))
    rv = r.get_state(ValueStateDescriptor("v", "int64").enable_time_to_live(cfg))
    rl = r.get_state(ListStateDescriptor("l", "int64").enable_time_to_live(cfg))
    rp = r.get_state(ValueStateDescriptor("p", "int64").enable_time_to_live(StateTtlConfig(100)))
    # Moving the clock back cannot bring back what compaction dropped.
    assert r.num_entries() == 10 + 10 + 50  # the state without the filter keeps everything
    r.set_current_key(3)
    assert rv.value() == -3 and rl.get() == [1003] and rp.value() == 3


# ---------------------------------------------------------------------------------------------
# Event time: the operator's watermark, and writes made before the first watermark.

EVENT = StateTtlConfig(100, time_characteristic="event_time")


@KIND
def test_writes_before_the_first_watermark_count_as_written_at_it(kind):
    b = create_backend(kind, key_type="int64")
    v = b.get_state(ValueStateDescriptor("v", "int64").enable_time_to_live(EVENT))
    lst = b.get_state(ListStateDescriptor("l", "int64").enable_time_to_live(EVENT))
    m = b.get_state(MapStateDescriptor("m", "int64", "int64").enable_time_to_live(EVENT))
    for k in range(20):
        b.set_current_key(k)
        v.update(k)
        lst.add(k)
        m.put(k, k)
    snap1 = b.snapshot()  # taken before the first watermark: stamps are the lowest int64
    b.observe_watermark(5_000)  # first watermark: re-stamps the 60 timestamps above
    b.set_current_key(3)
    lst.add(33)  # stamped 5_000 as well
    b.observe_watermark(5_099)
    b.set_current_key(3)
    assert v.value() == 3 and lst.get() == [3, 33] and m.get(3) == 3
    b.timers.advance_watermark(5_100)  # timers' watermark drives TTL too
    assert v.value() is None and lst.get() == [] and m.get(3) is None
    b.observe_watermark(10)  # never moves back
    assert b.ttl_now(EVENT) == 5_100
    # Restored from the snapshot taken before the first watermark: re-stamped at its own.
    r = create_backend(kind, key_type="int64")
    rv = r.get_state(ValueStateDescriptor("v", "int64").enable_time_to_live(EVENT))
    r.restore(snap1)
    snap1.release()
    r.observe_watermark(9_000)
    r.set_current_key(4)
    assert rv.value() == 4
    r.observe_watermark(9_100)
    assert rv.value() is None
    with pytest.raises(InvalidInputError):
        b.observe_watermark("soon")


@KIND
def test_restored_backend_stamps_with_the_observed_watermark(kind):
    b = create_backend(kind, key_type="int64")
    v = b.get_state(ValueStateDescriptor("v", "int64").enable_time_to_live(EVENT))
    b.observe_watermark(1_000)
    b.set_current_key(1)
    v.update(1)
    snap = b.snapshot()
    r = create_backend(kind, key_type="int64")
    rv = r.get_state(ValueStateDescriptor("v", "int64").enable_time_to_live(EVENT))
    r.restore(snap)
    r.observe_watermark(1_050)  # what the operator does at the start of a micro-batch
    r.set_current_key(2)
    rv.update(2)  # stamped 1_050, not the lowest int64
    r.observe_watermark(1_100)
    r.set_current_key(1)
    assert rv.value() is None  # written at 1_000
    r.set_current_key(2)
    assert rv.value() == 2
    r.observe_watermark(1_150)
    assert rv.value() is None


@KIND
def test_ttl_counts_reach_the_manifest_and_the_inspection_output(kind, tmp_path):
    from statecore.inspect import summary_lines

    b, _, clock = _scenario_6_state(kind, StateTtlConfig(100, cleanup_incrementally=5,
                                                         run_cleanup_for_every_record=True,
                                                         cleanup_in_compaction=10))
    store = CheckpointStore(tmp_path, max_runs=None, ttl_clock=clock)
    snap = b.snapshot()
    store.commit(1, [store.write_snapshot(snap, 1)])
    b.notify_checkpoint_complete(snap.snapshot_id, 1)
    for k in range(100):
        b.set_current_key(k)  # incremental cleanup of about half the state
    snap = b.snapshot(incremental=True)
    store.commit(2, [store.write_snapshot(snap, 2)])
    d = store.describe(2)
    assert d["ttl_expired"] == {"incremental": b.ttl_statistics()["incremental"]}
    store.compact(2, max_runs=1)
    text = "\n".join(summary_lines(str(tmp_path), 2))
    assert "ttl 100 ms processing_time, OnCreateAndWrite, NeverReturnExpired; cleanup: on read, " \
           "incremental 5 every record, compaction (clock every 10 entries)" in text
    assert f"incremental {d['ttl_expired']['incremental']:,}" in text
    assert "compaction " in text.split("ttl expired")[1]
    assert sum(store.describe(2)["ttl_compaction_expired"].values()) + \
        d["ttl_expired"]["incremental"] == 970


@KIND
def test_incremental_cleanup_on_batch_kernels(kind):
    """put_batch / add_batch rows count as accesses too (the native kernels included)."""
    cfg = StateTtlConfig(100, cleanup_incrementally=5)
    b, _, _ = _scenario_6_state(kind, cfg)
    r = b.get_state(ReducingStateDescriptor("r", "sum", "int64").enable_time_to_live(cfg))
    v = b.get_state(ValueStateDescriptor("v", "int64").enable_time_to_live(cfg))
    for _ in range(2):
        r.add_batch(pa.array([5000] * 250, pa.int64()), pa.array([1] * 250, pa.int64()))
    assert r.get_batch(pa.array([5000], pa.int64())).to_pylist() == [500]
    for _ in range(2):
        v.put_batch(pa.array([6000] * 250, pa.int64()), pa.array([1] * 250, pa.int64()))
    assert b.num_entries() == 30 + 2


@KIND
def test_list_and_map_batch_rows_count_once_as_accesses(kind):
    """append_batch / get_batch of list state and put_batch / get_batch of map state step the
    incremental cleanup once per row, exactly as value state's batch calls do (same entries,
    same row counts, same removals)."""
    cfg = StateTtlConfig(100, cleanup_incrementally=3)
    removed = {}
    for what in ("value", "list", "list_per_record", "map", "map_per_record"):
        clock = ManualClock(0)
        b = create_backend(kind, key_type="int64", ttl_clock=clock)
        keys = pa.array(range(600), pa.int64())
        ones = pa.array([1] * 600, pa.int64())
        if what == "value":
            st = b.get_state(ValueStateDescriptor("s", "int64").enable_time_to_live(cfg))
            st.put_batch(keys, ones)
            read = lambda ks: st.get_batch(ks)  # noqa: E731
        elif what == "list":
            st = b.get_state(ListStateDescriptor("s", "int64").enable_time_to_live(cfg))
            st.append_batch(keys, ones)
            read = lambda ks: st.get_batch(ks)  # noqa: E731
        elif what == "list_per_record":
            st = b.get_state(ListStateDescriptor("s", "int64").enable_time_to_live(cfg))
            TableListState.append_batch(st, keys, ones)
            read = lambda ks: TableListState.get_batch(st, ks)  # noqa: E731
        elif what == "map":
            st = b.get_state(MapStateDescriptor("s", "int64", "int64").enable_time_to_live(cfg))
            st.put_batch(keys, ones, ones)
            read = lambda ks: st.get_batch(ks, ks)  # noqa: E731
        else:  # the generic per-row path of the same batch calls
            st = b.get_state(MapStateDescriptor("s", "int64", "int64").enable_time_to_live(cfg))
            TableMapState.put_batch(st, keys, ones, ones)
            read = lambda ks: TableMapState.get_batch(st, ks, ks)  # noqa: E731
        clock.set(200)
        read(pa.array([10_000] * 50, pa.int64()))  # absent key: only the cleanup removes
        removed[what] = (b.ttl_statistics()["incremental"], b.num_entries())
    # A list's / map's entries are keyed by key and seq / user key (docs/formats.md "List
    # state", "Map state"), so the native walk meets them in another order than value state's:
    # the per-row path of the same calls removes exactly what the kernels remove.
    assert removed["list"] == removed["list_per_record"]
    assert removed["map"] == removed["map_per_record"]
    if kind == "python":
        assert removed["map"] == removed["list"] == removed["value"]
    assert 0 < removed["value"][0] < 600


@pytest.mark.skipif(_native is None, reason="native extension not built")
@pytest.mark.parametrize("strategy", ["background", "incremental"])
def test_native_map_index_drops_what_ttl_cleanup_removes(strategy):
    """The C++ cleanup steps report the map entries they remove, so the map index does not keep
    user keys of maps nobody reads again (NativeBackend.map_index_stats)."""
    clock = ManualClock(0)
    b = create_backend("native", key_type="int64", ttl_clock=clock)
    cfg = (StateTtlConfig(100, cleanup_in_background=True) if strategy == "background"
           else StateTtlConfig(100, cleanup_incrementally=1000))
    m = b.get_state(MapStateDescriptor("m", "int64", "int64").enable_time_to_live(cfg))
    keys = pa.array([k for k in range(200) for _ in range(5)], pa.int64())
    uks = pa.array([u for _ in range(200) for u in range(5)], pa.int64())
    m.put_batch(keys, uks, uks)
    assert b.map_index_stats()["m"]["user_keys"] == 1000
    clock.set(200)
    if strategy == "background":
        b.run_background_ttl_cleanup(b.max_parallelism)
    else:
        b.set_current_key(10_000)
        m.get(0)  # one access: a step of 1000 entries
        m.get(0)
    assert b.num_entries() == 0
    assert b.map_index_stats()["m"] == {"maps": 0, "user_keys": 0,
                                         "bytes": b.map_index_stats()["m"]["bytes"]}


# ---- batch calls interleave the cleanup steps with their rows (a step before each row)

_DIFF_KEYS = 24  # keys 0..23; the rows of a batch draw from them


def _diff_states(b, sizes, visibility, update, every_record):
    """One TTL state of each kind (TTL 100 ms), state i with cleanup size ``sizes[i]``; the
    state named in ``every_record`` also steps on every record."""
    descs = {
        "value": ValueStateDescriptor("value", "int64"),
        "reducing": ReducingStateDescriptor("reducing", "sum", "int64"),
        "aggregating": AggregatingStateDescriptor("aggregating", AverageAggregate()),
        "list": ListStateDescriptor("list", "int64"),
        "map": MapStateDescriptor("map", "int64", "int64"),
    }
    out = {}
    for (name, d), size in zip(descs.items(), sizes):
        cfg = StateTtlConfig(100, update_type=update, state_visibility=visibility,
                             cleanup_incrementally=size,
                             run_cleanup_for_every_record=name == every_record)
        out[name] = b.get_state(d.enable_time_to_live(cfg))
    return out


def _peek(b, st, key):
    """The stored aggregate of ``key`` as it is now (no state access, no cleanup)."""
    ((kg, k),) = b.batch_slots(st, pa.array([key], pa.int64()), None)
    cur = st.table.get(kg, k)
    if cur is None:
        return None
    acc = from_stored(st.serializer, cur[0])
    if st.descriptor.kind == "aggregating":
        return st.descriptor.aggregate_function.get_result(acc)
    return acc


def _row_by_row(b, states, name, op, keys, vals, uks):
    """The rows of one batch call through set_current_key and the per-record calls."""
    st = states[name]
    out = []
    for i, key in enumerate(keys):
        b.set_current_key(key)
        v, uk = vals[i], uks[i]
        if op == "clear":
            st.clear()
        elif name == "value":
            if op == "get":
                out.append(st.value())
            else:
                st.update(v)
        elif name in ("reducing", "aggregating"):
            if op == "get" or v is None:
                out.append(st.get())
            else:
                st.add(v)
                out.append(_peek(b, st, key))
        elif name == "list":
            if op == "get":
                out.append(st.get())
            else:
                st.add(v)
        elif op == "put":
            st.put(uk, v)
        elif op == "get":
            out.append(st.get(uk))
        elif op == "contains":
            out.append(st.contains(uk))
        else:
            st.remove(uk)
    return out


def _as_batch(states, name, op, keys, vals, uks):
    """The same rows as one batch call."""
    st = states[name]
    ka = pa.array(keys, pa.int64())
    va = pa.array(vals, pa.int64())
    ua = pa.array(uks, pa.int64())
    if op == "clear":
        st.clear_batch(ka)
        return []
    if name == "value":
        return st.get_batch(ka).to_pylist() if op == "get" else st.put_batch(ka, va) or []
    if name in ("reducing", "aggregating"):
        return (st.get_batch(ka) if op == "get" else st.add_batch(ka, va)).to_pylist()
    if name == "list":
        return st.get_batch(ka).to_pylist() if op == "get" else st.append_batch(ka, va) or []
    if op in ("put", "remove"):
        getattr(st, op + "_batch")(*((ka, ua, va) if op == "put" else (ka, ua)))
        return []
    return getattr(st, op + "_batch")(ka, ua).to_pylist()


_OPS = {"value": ["get", "put", "clear"], "reducing": ["get", "add", "clear"],
        "aggregating": ["get", "add", "clear"], "list": ["get", "add", "clear"],
        "map": ["get", "put", "contains", "remove", "clear"]}


@st.composite
def _diff_program(draw):
    sizes = draw(st.lists(st.sampled_from([1, 2, 3, 7]), min_size=5, max_size=5))
    visibility = draw(st.sampled_from(["NeverReturnExpired", "ReturnExpiredIfNotCleanedUp"]))
    update = draw(st.sampled_from(["OnCreateAndWrite", "OnReadAndWrite"]))
    every_record = draw(st.sampled_from([None, "value", "list", "map"]))
    calls = []
    for _ in range(draw(st.integers(4, 10))):
        name = draw(st.sampled_from(sorted(_OPS)))
        op = draw(st.sampled_from(_OPS[name]))
        n = draw(st.integers(1, 30))
        keys = draw(st.lists(st.integers(0, _DIFF_KEYS - 1), min_size=n, max_size=n))
        null_ok = name in ("value", "reducing", "aggregating") and op != "get"
        vals = draw(st.lists(st.one_of(st.none(), st.integers(-50, 50)) if null_ok
                             else st.integers(-50, 50), min_size=n, max_size=n))
        uks = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
        advance = draw(st.sampled_from([0, 0, 10, 40, 90, 150]))
        calls.append((name, op, keys, vals, uks, advance))
    return sizes, visibility, update, every_record, calls


def _contents(b, states):
    """Every key's list elements and map entries in their order, with timestamps, read from the
    tables without a state access."""
    out = {}
    keys = pa.array(range(_DIFF_KEYS), pa.int64())
    for name in ("list", "map"):
        st = states[name]
        for key, (kg, k) in zip(range(_DIFF_KEYS), b.batch_slots(st, keys, None)):
            out[name, key] = (st.table.map_items(kg, k) if name == "map"
                              else st.table.get(kg, k))
    return out


def _run_program(kind, program, batched: bool):
    sizes, visibility, update, every_record, calls = program
    clock = ManualClock(0)
    b = create_backend(kind, key_type="int64", ttl_clock=clock)
    states = _diff_states(b, sizes, visibility, update, every_record)
    # A filled start: every kind written per record at 0 and 60 (half of it expires at 100).
    for key in range(_DIFF_KEYS):
        clock.set(0 if key % 2 else 60)
        b.set_current_key(key)
        states["value"].update(key)
        states["reducing"].add(key)
        states["aggregating"].add(key)
        states["list"].add(key)
        states["list"].add(key + 1)
        for uk in range(3):
            states["map"].put(uk, key * 10 + uk)
    outputs = []
    for name, op, keys, vals, uks, advance in calls:
        clock.set(clock() + advance)
        run = _as_batch if batched else functools.partial(_row_by_row, b)
        outputs.append(run(states, name, op, keys, vals, uks))
    result = (outputs, b.ttl_statistics(), _contents(b, states), dump_backend(b))
    b.close()
    return result


@KIND
@settings(max_examples=40, derandomize=True, deadline=None)
@given(program=_diff_program())
def test_batch_calls_equal_their_rows_with_incremental_cleanup(kind, program):
    """Random batches of every state kind with incremental cleanup (several sizes, both
    visibilities, both update types, one state stepping on every record or none, the clock
    moving between batches) give what the same rows one at a time through set_current_key
    and the per-record calls give: outputs, ``ttl_statistics()``, list contents and map
    order (with timestamps), and every entry."""
    batched = _run_program(kind, program, True)
    rows = _run_program(kind, program, False)
    assert batched[0] == rows[0]
    assert batched[1] == rows[1]
    assert batched[2] == rows[2]
    assert batched[3] == rows[3]


def _failing_add(a, b):
    if b == 13:
        raise ValueError("13 refused")
    return a + b


@KIND
@pytest.mark.parametrize("reducer", ["sum", "custom"])
def test_failed_add_batch_with_incremental_cleanup_leaves_the_aggregates(kind, reducer):
    """add_batch with steps a row writes row by row (the kernel's undo log, the Python path's
    saved aggregates): an int64 sum overflow or a failing reduce function leaves every
    aggregate as before the call, while what the steps removed stays removed (and counted)."""
    clock = ManualClock(0)
    b = create_backend(kind, key_type="int64", ttl_clock=clock)
    cfg = StateTtlConfig(100, cleanup_incrementally=3)
    spec = "sum" if reducer == "sum" else _failing_add
    r = b.get_state(ReducingStateDescriptor("r", spec, "int64").enable_time_to_live(cfg))
    keys = pa.array(range(40), pa.int64())
    r.add_batch(keys, pa.array([2**62] * 40, pa.int64()))  # written at 0: expired at 100
    clock.set(60)
    r.add_batch(pa.array([100, 101], pa.int64()), pa.array([5, 2**62], pa.int64()))
    clock.set(120)
    before = {k: v for k, v in zip((100, 101), r.get_batch(pa.array([100, 101], pa.int64())))}
    bad = 2**62 if reducer == "sum" else 13
    with pytest.raises(InvalidInputError):
        r.add_batch(pa.array([100, 7, 101, 101], pa.int64()),
                    pa.array([1, 1, 3, bad], pa.int64()))
    removed = b.ttl_statistics()["incremental"]
    assert removed > 0  # the steps before the failing row ran and stay
    after = r.get_batch(pa.array([100, 101], pa.int64()))
    assert {k: v for k, v in zip((100, 101), after)} == before
    # Key 7 (expired) got 1 from the call: undone too, so it reads as expired (absent).
    assert r.get_batch(pa.array([7], pa.int64())).to_pylist() == [None]


@pytest.mark.skipif(_native is None, reason="native extension not built")
@pytest.mark.parametrize("strategy", ["background", "incremental", "incremental_batch",
                                      "migration"])
def test_native_list_index_drops_what_ttl_passes_remove(strategy):
    """The C++ cleanup steps report the list chunks they remove (also the steps a batch
    kernel runs before each row) and a TTL migration prunes, so the list index keeps no
    chunks of lists nobody reads again (NativeBackend.list_index_stats)."""
    clock = ManualClock(0)
    b = create_backend("native", key_type="int64", ttl_clock=clock)
    cfg = (StateTtlConfig(100, cleanup_in_background=True) if strategy == "background"
           else StateTtlConfig(100, cleanup_incrementally=1000))
    d = ListStateDescriptor("l", "int64").enable_time_to_live(cfg)
    ls = b.get_state(d)
    # Lists of two chunks (a list of chunk 0 alone is not listed).
    keys = pa.array([k for k in range(20) for _ in range(50)], pa.int64())
    ls.append_batch(keys, pa.array(range(1000), pa.int64()))
    assert (b.list_index_stats()["l"]["lists"], b.list_index_stats()["l"]["chunks"]) == (20, 40)
    clock.set(200)
    if strategy == "background":
        b.run_background_ttl_cleanup(b.max_parallelism)
    elif strategy == "incremental":
        b.set_current_key(10_000)
        ls.get()  # one access: a step of 1000 entries
        ls.get()
    elif strategy == "incremental_batch":  # the kernel's per-row steps
        ls.get_batch(pa.array([10_000, 10_000], pa.int64()))
    else:  # restored without TTL: expired elements dropped, the index pruned
        snap = b.snapshot()
        b = create_backend("native", key_type="int64", ttl_clock=clock)
        b.get_state(ListStateDescriptor("l", "int64").enable_ttl_migration())
        b.restore(snap)
        snap.release()
    assert b.num_entries() == 0
    stats = b.list_index_stats()["l"]
    assert (stats["lists"], stats["chunks"]) == (0, 0)

"""State TTL (statecore.ttl): Flink's acceptance scenarios 1-4 (shared/reference/flink-state.md,
TTL = 100 ms, a manual clock) for every state kind, on both backends, through the per-record API
and where it exists the batch API, with and without a snapshot/restore between the steps; the
8-byte big-endian timestamp suffix in snapshots; per-element list and map timestamps; event time;
restore with TTL switched on/off; statistics."""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest

import statecore
from statecore import create_backend
from statecore.descriptors import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from statecore.errors import InvalidInputError, StateMigrationError
from statecore.ttl import (
    INT64_MAX,
    INT64_MIN,
    ManualClock,
    StateTtlConfig,
    entry_layout,
    filter_expired,
    is_expired,
)

BACKENDS = ["python"]
try:
    import statecore._native  # noqa: F401

    BACKENDS.append("native")
except ImportError:
    pass

KEY = 7


class Avg(AggregateFunction):
    def create_accumulator(self):
        return [0, 0]

    def add(self, value, acc):
        return [acc[0] + value, acc[1] + 1]

    def get_result(self, acc):
        return acc[0] / acc[1]


# One harness per state kind: write(x) stores x, read() is what a reader sees (None = nothing),
# expect(xs) is what it should see after the writes xs since the last expiry.
class _Harness:
    batch = False

    def __init__(self, backend, cfg):
        self.b = backend
        self.cfg = cfg
        self.state = backend.get_state(self.descriptor().enable_time_to_live(cfg))

    def use(self, backend):
        """Continue on ``backend`` (after a restore)."""
        self.b = backend
        self.state = backend.get_state(self.descriptor().enable_time_to_live(self.cfg))


class ValueH(_Harness):
    def descriptor(self):
        return ValueStateDescriptor("s", "int64")

    def write(self, x):
        self.b.set_current_key(KEY)
        self.state.update(x)

    def read(self):
        self.b.set_current_key(KEY)
        return self.state.value()

    def expect(self, xs):
        return xs[-1]


class ValueBatchH(ValueH):
    batch = True

    def write(self, x):
        self.state.put_batch(pa.array([KEY]), pa.array([x]))

    def read(self):
        return self.state.get_batch(pa.array([KEY])).to_pylist()[0]


class ListH(_Harness):
    def descriptor(self):
        return ListStateDescriptor("s", "string")

    def write(self, x):
        self.b.set_current_key(KEY)
        self.state.update([str(x), str(x) * 2])

    def read(self):
        self.b.set_current_key(KEY)
        return self.state.get() or None

    def expect(self, xs):
        return [str(xs[-1]), str(xs[-1]) * 2]


class ListBatchH(ListH):
    batch = True

    def write(self, x):
        # update() as a batch: clear, then one append_batch row = one add_all call.
        self.state.clear_batch(pa.array([KEY]))
        self.state.append_batch(pa.array([KEY]), pa.array([[str(x), str(x) * 2]],
                                                          pa.list_(pa.string())))

    def read(self):
        return self.state.get_batch(pa.array([KEY])).to_pylist()[0] or None


class MapH(_Harness):
    def descriptor(self):
        return MapStateDescriptor("s", "string", "float64")

    def write(self, x):
        self.b.set_current_key(KEY)
        self.state.put("u", float(x))

    def read(self):
        self.b.set_current_key(KEY)
        return self.state.get("u")

    def expect(self, xs):
        return float(xs[-1])


class MapBatchH(MapH):
    batch = True

    def write(self, x):
        self.state.put_batch(pa.array([KEY]), pa.array(["u"]), pa.array([float(x)]))

    def read(self):
        return self.state.get_batch(pa.array([KEY]), pa.array(["u"])).to_pylist()[0]


class ReducingH(_Harness):
    def descriptor(self):
        return ReducingStateDescriptor("s", "sum", "int64")

    def write(self, x):
        self.b.set_current_key(KEY)
        self.state.add(x)

    def read(self):
        self.b.set_current_key(KEY)
        return self.state.get()

    def expect(self, xs):
        return sum(xs)


class ReducingBatchH(ReducingH):
    batch = True

    def write(self, x):
        self.state.add_batch(pa.array([KEY]), pa.array([x]))

    def read(self):
        return self.state.get_batch(pa.array([KEY])).to_pylist()[0]


class AggregatingH(_Harness):
    def descriptor(self):
        return AggregatingStateDescriptor("s", Avg(), "pickle")

    def write(self, x):
        self.b.set_current_key(KEY)
        self.state.add(x)

    def read(self):
        self.b.set_current_key(KEY)
        return self.state.get()

    def expect(self, xs):
        return sum(xs) / len(xs)


class AggregatingBatchH(AggregatingH):
    batch = True

    def write(self, x):
        self.state.add_batch(pa.array([KEY]), pa.array([x]))

    def read(self):
        return self.state.get_batch(pa.array([KEY])).to_pylist()[0]


class VectorizedReducingBatchH(ReducingBatchH):
    def descriptor(self):
        import pyarrow.compute as pc

        from statecore.descriptors import Reducer

        return ReducingStateDescriptor("s", Reducer.vectorized(pc.add), "int64")


HARNESSES = [ValueH, ValueBatchH, ListH, ListBatchH, MapH, MapBatchH, ReducingH, ReducingBatchH,
             VectorizedReducingBatchH, AggregatingH, AggregatingBatchH]


class Scenario:
    """Runs steps on a backend; with ``restore_between`` every step after the first runs on a
    fresh backend restored from a snapshot of the previous one (same clock)."""

    def __init__(self, kind, harness_cls, cfg, restore_between):
        self.kind = kind
        self.clock = ManualClock(0)
        self.b = self._new()
        self.h = harness_cls(self.b, cfg)
        self.restore_between = restore_between
        self.cfg = cfg
        self.written = []  # values written since the aggregate last expired
        self.last_access = None

    def _new(self):
        return create_backend(self.kind, key_type="int64", ttl_clock=self.clock)

    def at(self, t):
        self.clock.set(t)
        if self.restore_between:
            snap = self.b.snapshot()
            nb = self._new()
            nb.restore(snap)
            snap.release()
            self.b.close()
            self.b = nb
            self.h.use(nb)
        return self

    def _aged_out(self):
        return self.last_access is not None and is_expired(self.last_access, self.cfg.ttl_ms,
                                                           self.clock.now)

    def write(self, x):
        if self._aged_out():
            self.written = []  # an expired aggregate counts as absent
        self.written.append(x)
        self.last_access = self.clock.now
        self.h.write(x)

    def read(self):
        got = self.h.read()
        if got is None or self._aged_out():
            self.written, self.last_access = [], None
        elif self.cfg.update_on_read:
            self.last_access = self.clock.now
        return got


params = pytest.mark.parametrize
KIND = params("kind", BACKENDS)
HARNESS = params("harness", HARNESSES, ids=lambda h: h.__name__)
RESTORE = params("restore_between", [False, True], ids=["live", "restored"])


@KIND
@HARNESS
@RESTORE
def test_scenario_1_writes_renew_and_expiry_removes(kind, harness, restore_between):
    s = Scenario(kind, harness, StateTtlConfig(100), restore_between)
    s.at(0).write(1)
    assert s.at(20).read() == s.h.expect(s.written)
    s.at(50).write(2)
    assert s.at(120).read() == s.h.expect(s.written)
    s.at(170).write(3)
    assert s.at(220).read() == s.h.expect(s.written)
    assert s.at(300).read() is None
    assert s.b.num_entries() == 0  # physically gone
    assert s.b.ttl_statistics()["read"] >= 1 or restore_between


@KIND
@HARNESS
@RESTORE
def test_scenario_2_return_expired_if_not_cleaned_up(kind, harness, restore_between):
    cfg = StateTtlConfig(100, state_visibility="ReturnExpiredIfNotCleanedUp")
    s = Scenario(kind, harness, cfg, restore_between)
    s.at(0).write(5)
    stale = s.h.expect(s.written)
    assert s.at(120).read() == stale  # returned once
    assert s.read() is None
    assert s.b.num_entries() == 0


@KIND
@HARNESS
@RESTORE
def test_scenario_3_on_read_and_write_renews_on_read(kind, harness, restore_between):
    s = Scenario(kind, harness, StateTtlConfig(100, update_type="OnReadAndWrite"), restore_between)
    s.at(0).write(4)
    assert s.at(50).read() == s.h.expect(s.written)
    assert s.at(120).read() == s.h.expect(s.written)
    assert s.at(250).read() is None


@KIND
@HARNESS
def test_scenario_4_max_ttl_never_overflows(kind, harness):
    s = Scenario(kind, harness, StateTtlConfig(INT64_MAX), False)
    s.at(10).write(9)
    assert s.at(50).read() == s.h.expect(s.written)
    assert s.at(INT64_MAX).read() == s.h.expect(s.written)


@KIND
def test_list_elements_and_map_entries_expire_one_by_one(kind):
    clock = ManualClock(0)
    b = create_backend(kind, key_type="int64", ttl_clock=clock)
    lst = b.get_state(ListStateDescriptor("l", "int64").enable_time_to_live(StateTtlConfig(100)))
    mp = b.get_state(
        MapStateDescriptor("m", "int64", "string").enable_time_to_live(StateTtlConfig(100)))
    b.set_current_key(1)
    lst.add(1)
    mp.put(1, "one")
    clock.set(40)
    lst.add_all([2, 3])  # one timestamp for both
    mp.put_all({2: "two", 3: "three"})
    clock.set(60)
    lst.add(4)
    mp.put(1, "one again")  # renews entry 1 only
    clock.set(100)
    assert lst.get() == [2, 3, 4]
    assert mp.items() == [(1, "one again"), (2, "two"), (3, "three")]
    clock.set(140)
    assert lst.get() == [4]
    assert mp.items() == [(1, "one again")]
    assert mp.contains(1) and not mp.contains(2)
    clock.set(160)
    assert lst.get() == []
    assert mp.is_empty()
    assert b.num_entries() == 0
    assert b.ttl_statistics()["read"] == 4 + 3


@KIND
def test_reducing_add_after_expiry_starts_over_whatever_the_visibility(kind):
    clock = ManualClock(0)
    b = create_backend(kind, key_type="int64", ttl_clock=clock)
    cfg = StateTtlConfig(100, state_visibility="ReturnExpiredIfNotCleanedUp")
    r = b.get_state(ReducingStateDescriptor("r", "sum", "int64").enable_time_to_live(cfg))
    b.set_current_key(3)
    r.add(10)
    clock.set(100)
    r.add(1)
    assert r.get() == 1
    # add_batch: rows in order, a null row shows what get() would
    clock.set(300)
    out = r.add_batch(pa.array([3, 3, 4, 3], pa.int64()), pa.array([None, 2, 5, 3], pa.int64()))
    assert out.to_pylist() == [1, 2, 5, 5]  # the stale 1 is shown once, then the sum restarts
    b.set_current_key(3)
    assert r.get() == 5


@KIND
def test_timestamp_suffix_in_snapshots(kind):
    clock = ManualClock(1_700_000_000_123)
    b = create_backend(kind, key_type="int64", ttl_clock=clock)
    v = b.get_state(ValueStateDescriptor("v", "int64").enable_time_to_live(StateTtlConfig(1000)))
    lst = b.get_state(ListStateDescriptor("l", "int32").enable_time_to_live(StateTtlConfig(1000)))
    ls = b.get_state(ListStateDescriptor("s", "string").enable_time_to_live(StateTtlConfig(1000)))
    b.set_current_key(5)
    v.update(-2)
    lst.add_all([1, 2])
    ls.add("ab")
    snap = b.snapshot()
    ts = struct.pack(">q", clock.now)
    metas = {m["name"]: m for m in snap.state_metas()}
    assert metas["v"]["ttl"]["ttl_ms"] == 1000
    kg = b.key_group_of(5)
    (val,) = snap.entries("v", kg)[1].to_pylist()
    assert val == struct.pack("<q", -2) + ts
    # One chunk per list, each element with its own suffix (docs/formats.md "List state").
    (blob,) = snap.entries("l", kg)[1].to_pylist()
    assert blob == struct.pack("<i", 1) + ts + struct.pack("<i", 2) + ts  # stride 4 + 8
    (sblob,) = snap.entries("s", kg)[1].to_pylist()
    assert sblob == b"\x02ab" + ts


@KIND
def test_restore_with_ttl_switched_on_or_off_is_a_state_migration(kind):
    clock = ManualClock(0)
    with_ttl = create_backend(kind, key_type="int64", ttl_clock=clock)
    s = with_ttl.get_state(
        ValueStateDescriptor("v", "int64").enable_time_to_live(StateTtlConfig(10)))
    with_ttl.set_current_key(1)
    s.update(1)
    plain = create_backend(kind, key_type="int64")
    p = plain.get_state(ValueStateDescriptor("v", "int64"))
    plain.set_current_key(1)
    p.update(1)
    # registered first, then restore
    for registered, snap in ((plain, with_ttl.snapshot()), (with_ttl, plain.snapshot())):
        fresh = create_backend(kind, key_type="int64", ttl_clock=clock)
        desc = ValueStateDescriptor("v", "int64")
        if registered is with_ttl:
            desc.enable_time_to_live(StateTtlConfig(10))
        fresh.get_state(desc)
        with pytest.raises(StateMigrationError, match="TTL"):
            fresh.restore(snap)
    # restore first, then register
    fresh = create_backend(kind, key_type="int64")
    fresh.restore(with_ttl.snapshot())
    with pytest.raises(StateMigrationError, match="TTL"):
        fresh.get_state(ValueStateDescriptor("v", "int64"))
    # other TTL settings may change between runs
    ok = create_backend(kind, key_type="int64", ttl_clock=clock)
    ok.restore(with_ttl.snapshot())
    st = ok.get_state(ValueStateDescriptor("v", "int64").enable_time_to_live(
        StateTtlConfig(50, update_type="OnReadAndWrite")))
    ok.set_current_key(1)
    clock.set(30)
    assert st.value() == 1
    metas = {m["name"]: m for m in ok.snapshot().state_metas()}
    assert metas["v"]["ttl"]["ttl_ms"] == 50
    assert metas["v"]["ttl"]["update_type"] == "OnReadAndWrite"


@KIND
def test_event_time_ttl_follows_the_watermark(kind):
    b = create_backend(kind, key_type="int64", ttl_clock=lambda: 10**15)  # ignored
    cfg = StateTtlConfig(100, time_characteristic="event_time")
    v = b.get_state(ValueStateDescriptor("v", "string").enable_time_to_live(cfg))
    b.timers.advance_watermark(1_000)
    b.set_current_key(1)
    v.update("a")
    b.timers.advance_watermark(1_099)
    assert v.value() == "a"
    b.timers.advance_watermark(1_100)
    assert v.value() is None


def test_expiry_rule_and_overflow_guard():
    assert not is_expired(0, 100, 99)
    assert is_expired(0, 100, 100)
    assert not is_expired(10, INT64_MAX, INT64_MAX)  # 10 + MAX overflows: never expires
    assert is_expired(INT64_MIN, 100, INT64_MIN + 100)


def test_config_validation_and_meta_round_trip():
    for bad in (dict(ttl_ms=0), dict(ttl_ms=-5), dict(ttl_ms=1.5), dict(ttl_ms=True),
                dict(ttl_ms=2**63), dict(ttl_ms=10, update_type="Disabled"),
                dict(ttl_ms=10, update_type="sometimes"), dict(ttl_ms=10, state_visibility=3),
                dict(ttl_ms=10, time_characteristic="wall"),
                dict(ttl_ms=10, cleanup_incrementally=0),
                dict(ttl_ms=10, run_cleanup_for_every_record=True),
                dict(ttl_ms=10, cleanup_in_compaction=-1)):
        with pytest.raises(InvalidInputError):
            StateTtlConfig(**bad)
    cfg = StateTtlConfig(5_000, update_type="OnReadAndWrite",
                         state_visibility="ReturnExpiredIfNotCleanedUp",
                         time_characteristic="event_time", cleanup_full_snapshot=True,
                         cleanup_incrementally=5, run_cleanup_for_every_record=True,
                         cleanup_in_compaction=1000, cleanup_in_background=True)
    assert StateTtlConfig.from_meta(cfg.meta()) == cfg
    with pytest.raises(InvalidInputError):
        ValueStateDescriptor("v").enable_time_to_live({"ttl_ms": 5})
    with pytest.raises(InvalidInputError):
        create_backend("python", ttl_clock=42)


@KIND
def test_a_clock_returning_garbage_is_reported(kind):
    b = create_backend(kind, key_type="int64", ttl_clock=lambda: "soon")
    v = b.get_state(ValueStateDescriptor("v", "int64").enable_time_to_live(StateTtlConfig(10)))
    b.set_current_key(1)
    with pytest.raises(InvalidInputError, match="ttl_clock"):
        v.update(1)
    assert b.num_entries() == 0


def _ts(t):
    return struct.pack(">q", t)


def test_compaction_filter_values():
    v = struct.pack("<q", 42)
    assert filter_expired("value", 8, 100, 99, v + _ts(0)) == v + _ts(0)  # kept
    assert filter_expired("reducing", 8, 100, 100, v + _ts(0)) is None  # expired
    assert filter_expired("value", None, 100, 10**9, b"short") == b"short"  # too short: kept
    assert filter_expired("aggregating", None, INT64_MAX, INT64_MAX, b"x" + _ts(5)) == b"x" + _ts(5)


def test_compaction_filter_lists_keep_the_unexpired_suffix():
    fixed = b"".join(struct.pack("<i", i) + _ts(t) for i, t in ((1, 0), (2, 50), (3, 90)))
    assert filter_expired("list", 4, 100, 99, fixed) == fixed  # first unexpired: all kept
    assert filter_expired("list", 4, 100, 120, fixed) == fixed[12:]  # stride 4 + 8
    assert filter_expired("list", 4, 100, 160, fixed) == fixed[24:]
    assert filter_expired("list", 4, 100, 190, fixed) is None
    var = b"".join(bytes([len(s)]) + s + _ts(t) for s, t in ((b"ab", 0), (b"", 60), (b"xyz", 70)))
    assert filter_expired("list", None, 100, 100, var) == var[11:]
    assert filter_expired("list", None, 100, 165, var) == var[20:]
    assert filter_expired("list", None, 100, 170, var) is None
    with pytest.raises(InvalidInputError):
        filter_expired("list", 4, 100, 190, fixed[:-3])  # the walk reaches the cut


def test_compaction_filter_map_entries():
    # A map entry is one user value with its own timestamp (docs/formats.md "Map state"),
    # filtered as a value.
    entry = b"22" + _ts(80)
    assert filter_expired("map", None, 100, 179, entry) == entry
    assert filter_expired("map", None, 100, 180, entry) is None
    assert filter_expired("map", None, 100, 180, b"short") == b"short"  # no suffix: kept
    with pytest.raises(InvalidInputError):
        filter_expired("timers", None, 100, 0, b"")


@KIND
def test_compaction_filter_reads_what_the_backends_write(kind):
    clock = ManualClock(0)
    b = create_backend(kind, key_type="int64", ttl_clock=clock)
    lst = b.get_state(ListStateDescriptor("l", "int64").enable_time_to_live(StateTtlConfig(100)))
    mp = b.get_state(
        MapStateDescriptor("m", "string", "string").enable_time_to_live(StateTtlConfig(100)))
    b.set_current_key(1)
    lst.add(1)
    mp.put("a", "x")
    clock.set(60)
    lst.add(2)
    mp.put("b", "y")
    snap = b.snapshot()
    kg = b.key_group_of(1)
    (lblob,) = snap.entries("l", kg)[1].to_pylist()  # one chunk (docs/formats.md "List state")
    mkeys, mvals = (a.to_pylist() for a in snap.entries("m", kg))
    # A list chunk filtered in the list layout, a map entry as a value.
    trimmed_l = filter_expired(entry_layout("list"), 8, 100, 100, lblob)
    assert len(trimmed_l) == 16  # element 1 expired
    kept_m = [(k, v) for k, v in zip(mkeys, mvals)
              if filter_expired("map", None, 100, 100, v) is not None]
    assert len(mkeys) == 2 and len(kept_m) == 1  # one entry per user key, "a" expired
    clock.set(100)
    assert lst.get() == [2]
    assert mp.items() == [("b", "y")]
    after = b.snapshot()
    assert after.entries("l", kg)[1].to_pylist() == [trimmed_l]
    assert list(zip(*(a.to_pylist() for a in after.entries("m", kg)))) == kept_m


def test_public_names_and_the_readme_example():
    assert statecore.StateTtlConfig is StateTtlConfig
    clock = ManualClock(0)
    backend = create_backend(BACKENDS[-1], key_type="int64", ttl_clock=clock)
    last = backend.get_state(ValueStateDescriptor("last", "int64").enable_time_to_live(
        statecore.StateTtlConfig(60_000, update_type=statecore.UpdateType.OnReadAndWrite)))
    backend.set_current_key(7)
    last.update(1)
    clock.advance(59_999)
    assert last.value() == 1  # renews
    clock.advance(59_999)
    assert last.value() == 1
    clock.advance(60_000)
    assert last.value() is None
    assert backend.num_entries() == 0


FULL_CLEANUP = StateTtlConfig(100, cleanup_full_snapshot=True)


def _mixed_state(kind, clock):
    """Entries of every kind written at 0 (expired at 100) and at 60 (alive until 160), plus
    a list and a map with elements of both ages."""
    b = create_backend(kind, key_type="int64", ttl_clock=clock)
    descs = [ValueStateDescriptor("v", "int64"), ListStateDescriptor("l", "string"),
             MapStateDescriptor("m", "int64", "string"),
             ReducingStateDescriptor("r", "sum", "int64"),
             AggregatingStateDescriptor("a", Avg(), "pickle")]
    states = [b.get_state(d.enable_time_to_live(FULL_CLEANUP)) for d in descs]
    v, lst, mp, r, a = states
    for t, keys in ((0, range(0, 40)), (60, range(40, 60))):
        clock.set(t)
        for k in keys:
            b.set_current_key(k)
            v.update(k)
            lst.add(str(k))
            mp.put(k, "x")
            r.add(k)
            a.add(k)
    clock.set(60)
    for k in range(0, 10):  # lists and maps of mixed ages
        b.set_current_key(k)
        lst.add("late")
        mp.put(-k - 100, "late")
    return b, descs


def _contents(b, descs):
    out = {}
    for d in descs:
        st = b.get_state(d)
        for k in range(60):
            b.set_current_key(k)
            got = st.value() if d.kind == "value" else (st.items() if d.kind == "map" else st.get())
            if got not in (None, []):
                out[(d.name, k)] = got
    return out


def _expected_after_cleanup():
    out = {}
    for k in range(60):
        alive = k >= 40
        if alive:
            out[("v", k)] = k
            out[("r", k)] = k
            out[("a", k)] = float(k)
            out[("l", k)] = [str(k)]
            out[("m", k)] = [(k, "x")]
        elif k < 10:
            out[("l", k)] = ["late"]
            out[("m", k)] = [(-k - 100, "late")]
    return out


@KIND
@params("path", ["snapshot", "store", "store_async"])
def test_scenario_5_full_snapshot_cleanup_survives_moving_the_clock_back(kind, path, tmp_path):
    from statecore import CheckpointStore

    clock = ManualClock(0)
    b, descs = _mixed_state(kind, clock)
    clock.set(120)  # written at 0: expired; written at 60: alive
    snap = b.snapshot()
    if path == "snapshot":
        source = snap
    else:
        store = CheckpointStore(tmp_path)
        if path == "store":
            desc = store.write_snapshot(snap, 1)
        else:
            desc = store.write_snapshot_async(snap, 1).result(timeout=60)
        store.commit(1, [desc])
        source = store.open(1)
    clock.set(0)  # moving the clock back cannot resurrect what the snapshot left out
    restored = create_backend(kind, key_type="int64", ttl_clock=clock)
    restored.restore(source)
    # Counted as the snapshot is serialized (python: at snapshot(); native: as it is read).
    filtered = b.ttl_statistics()["full_snapshot"]
    # values, aggregates; whole lists/maps; trimmed ones
    assert filtered == 40 * 3 + 30 * 2 + 10 * 2
    assert _contents(restored, descs) == _expected_after_cleanup()
    # The live backend still holds everything: a full snapshot filters, it does not remove.
    assert len(_contents(b, descs)) == 60 * 5


@KIND
def test_full_snapshot_cleanup_files_are_identical_sync_and_async(kind, tmp_path):
    from statecore import CheckpointStore

    clock = ManualClock(0)
    b, _ = _mixed_state(kind, clock)
    clock.set(120)
    snap = b.snapshot()
    a, s = CheckpointStore(tmp_path / "a"), CheckpointStore(tmp_path / "s")
    da = a.write_snapshot_async(snap, 3).result(timeout=60)
    ds = s.write_snapshot(snap, 3)
    assert (tmp_path / "a" / da["path"]).read_bytes() == (tmp_path / "s" / ds["path"]).read_bytes()


def test_full_snapshot_cleanup_is_identical_across_backends():
    snaps = []
    for kind in BACKENDS:
        clock = ManualClock(0)
        b, _ = _mixed_state(kind, clock)
        clock.set(120)
        snaps.append(b.snapshot())
    first = snaps[0]
    for other in snaps[1:]:
        for m in first.state_metas():
            for kg in range(128):
                assert first.entries(m["name"], kg)[0].equals(other.entries(m["name"], kg)[0])
                assert first.entries(m["name"], kg)[1].equals(other.entries(m["name"], kg)[1])

"""Explicit TTL migration on restore (``StateDescriptor.enable_ttl_migration``, statecore.ttl
"Migration"): TTL off -> on and on -> off, for every state kind, on both backends, with the
descriptor registered after the restore and before it, through real checkpoint files
(CheckpointStore). The migrated bytes are compared with a backend that wrote the same state in
the new format directly; then the migrated state is checkpointed (the first "incremental"
snapshot is a full one) and restored again without the migration request."""

from __future__ import annotations

import pyarrow as pa
import pytest

from statecore import CheckpointStore, create_backend
from statecore.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from statecore.errors import InvalidInputError, StateMigrationError
from statecore.testing.conformance import AverageAggregate, TamperedSnapshot, snapshot_dump
from statecore.ttl import ManualClock, StateTtlConfig

BACKENDS = ["python"]
try:
    import statecore._native  # noqa: F401

    BACKENDS.append("native")
except ImportError:
    pass

TTL = 100
KEYS = range(10)


# One spec per state kind. write(st, i): the first write of key i; refresh(st, i): a later write
# (the only part of a list or map that survives expiring the first one); survivor(st, i): what a
# backend without TTL writes to hold exactly what survives; read(st): what a reader sees (None for
# nothing); units: things (values, list elements, map entries) one write() stores.
class Value:
    units = 1

    def contents(self, dump):
        return dump

    def descriptor(self):
        return ValueStateDescriptor("s", "int64")

    def write(self, st, i):
        st.update(i * 10)

    def refresh(self, st, i):
        st.update(i * 10 + 1)

    def survivor(self, st, i):
        self.write(st, i)
        self.refresh(st, i)

    def read(self, st):
        return st.value()

    def expect_full(self, i):
        return i * 10

    def expect_refreshed(self, i):
        return i * 10 + 1


class FixedList(Value):
    units = 2

    def descriptor(self):
        return ListStateDescriptor("s", "int64")

    def contents(self, dump):
        # One entry per chunk, `prefix | seq` (docs/formats.md "List state"): compared by
        # (key, namespace) prefix and chunk bytes, in list order.
        return {kg: [(k[:-8], v) for k, v in rows] for kg, rows in dump.items()}

    def write(self, st, i):
        st.add_all([i, i + 1])

    def refresh(self, st, i):
        st.add(1000 + i)

    def survivor(self, st, i):
        self.refresh(st, i)

    def read(self, st):
        return st.get() or None

    def expect_full(self, i):
        return [i, i + 1]

    def expect_refreshed(self, i):
        return [1000 + i]


class VarList(FixedList):
    def descriptor(self):
        return ListStateDescriptor("s", "string")

    def write(self, st, i):
        st.add_all([str(i), "x" * i])

    def refresh(self, st, i):
        st.add("late")

    def expect_full(self, i):
        return [str(i), "x" * i]

    def expect_refreshed(self, i):
        return ["late"]


class Map(FixedList):
    def descriptor(self):
        return MapStateDescriptor("s", "string", "int64")

    def write(self, st, i):
        st.put_all({"a": i, "b": -i})

    def refresh(self, st, i):
        st.put("c", i)

    def read(self, st):
        return dict(st.items()) or None

    def expect_full(self, i):
        return {"a": i, "b": -i}

    def expect_refreshed(self, i):
        return {"c": i}


class Reducing(Value):
    def descriptor(self):
        return ReducingStateDescriptor("s", "sum", "int64")

    def write(self, st, i):
        st.add(i)
        st.add(1)

    def refresh(self, st, i):
        st.add(5)

    def read(self, st):
        return st.get()

    def expect_full(self, i):
        return i + 1

    def expect_refreshed(self, i):
        return i + 6


class Aggregating(Reducing):
    def descriptor(self):
        return AggregatingStateDescriptor("s", AverageAggregate(), "pickle")

    def write(self, st, i):
        st.add(i)
        st.add(i + 2)

    def refresh(self, st, i):
        st.add(i + 4)

    def expect_full(self, i):
        return i + 1

    def expect_refreshed(self, i):
        return i + 2


SPECS = {"value": Value(), "list_fixed": FixedList(), "list_varlen": VarList(), "map": Map(),
         "reducing": Reducing(), "aggregating": Aggregating()}
SPEC = pytest.mark.parametrize("spec", list(SPECS.values()), ids=list(SPECS))
KIND = pytest.mark.parametrize("kind", BACKENDS)
ORDER = pytest.mark.parametrize("order", ["restore_then_register", "register_then_restore"])


def ttl_desc(spec, cfg=None, migrate=True):
    d = spec.descriptor().enable_time_to_live(cfg or StateTtlConfig(TTL))
    return d.enable_ttl_migration() if migrate else d


def plain_desc(spec, migrate=True):
    d = spec.descriptor()
    return d.enable_ttl_migration() if migrate else d


def checkpoint(store, backend, version, incremental=False):
    snap = backend.snapshot(incremental=incremental)
    store.commit(version, [store.write_snapshot(snap, version)])
    backend.notify_checkpoint_complete(snap.snapshot_id, version)
    return snap


def restored(kind, store, version, descriptor, order, clock=None):
    """A fresh backend restored from ``version`` with ``descriptor`` registered after or before
    the restore; returns (backend, state)."""
    b = create_backend(kind, key_type="int64", ttl_clock=clock or ManualClock(0))
    if order == "register_then_restore":
        st = b.get_state(descriptor)
        store.restore(b, version)
    else:
        store.restore(b, version)
        st = b.get_state(descriptor)
    return b, st


def read_all(b, spec, st):
    out = {}
    for i in KEYS:
        b.set_current_key(i)
        out[i] = spec.read(st)
    return out


def state_dump(b):
    """snapshot_dump of state "s" (a full snapshot)."""
    return snapshot_dump(b.snapshot())["s"]


def s_meta(snap):
    return next(m for m in snap.state_metas() if m["name"] == "s")


# ------------------------------------------------------------------------------ off -> on

@KIND
@SPEC
@ORDER
def test_off_to_on_stamps_everything_with_the_migration_time(tmp_path, kind, spec, order):
    plain = create_backend(kind, key_type="int64")
    st = plain.get_state(plain_desc(spec, migrate=False))
    for i in KEYS:
        plain.set_current_key(i)
        spec.write(st, i)
    store = CheckpointStore(tmp_path)
    checkpoint(store, plain, 1)

    clock = ManualClock(5000)
    b, st = restored(kind, store, 1, ttl_desc(spec), order, clock)
    # The same writes made with TTL on at the migration time: the same bytes.
    ref = create_backend(kind, key_type="int64", ttl_clock=ManualClock(5000))
    rst = ref.get_state(ttl_desc(spec, migrate=False))
    for i in KEYS:
        ref.set_current_key(i)
        spec.write(rst, i)
    snap = b.snapshot()
    assert snapshot_dump(snap)["s"] == state_dump(ref)
    assert s_meta(snap)["ttl"] == StateTtlConfig(TTL).meta()
    assert b.ttl_statistics()["migration"] == 0
    clock.set(5000 + TTL - 1)
    assert read_all(b, spec, st) == {i: spec.expect_full(i) for i in KEYS}
    clock.set(5000 + TTL)
    assert read_all(b, spec, st) == dict.fromkeys(KEYS)


# ------------------------------------------------------------------------------ on -> off

def _written_with_ttl(kind, spec, store):
    """Keys 0-4 written at 0; keys 5-9 written at 0 and refreshed at 50 (TTL 100); checkpoint 1."""
    clock = ManualClock(0)
    b = create_backend(kind, key_type="int64", ttl_clock=clock)
    st = b.get_state(ttl_desc(spec, migrate=False))
    for i in KEYS:
        b.set_current_key(i)
        spec.write(st, i)
    clock.set(50)
    for i in KEYS[5:]:
        b.set_current_key(i)
        spec.refresh(st, i)
    checkpoint(store, b, 1)


@KIND
@SPEC
@ORDER
def test_on_to_off_drops_what_expired_and_strips_the_rest(tmp_path, kind, spec, order):
    store = CheckpointStore(tmp_path)
    _written_with_ttl(kind, spec, store)
    b, st = restored(kind, store, 1, plain_desc(spec), order, ManualClock(120))
    # Keys 0-4 expired at 100; of keys 5-9 only what was written at 50 is left.
    assert read_all(b, spec, st) == {i: (spec.expect_refreshed(i) if i >= 5 else None)
                                     for i in KEYS}
    collection = spec.units > 1
    assert b.ttl_statistics()["migration"] == 5 * spec.units + (5 * spec.units if collection else 0)
    ref = create_backend(kind, key_type="int64")
    rst = ref.get_state(plain_desc(spec, migrate=False))
    for i in KEYS[5:]:
        ref.set_current_key(i)
        spec.survivor(rst, i)
    snap = b.snapshot()
    assert spec.contents(snapshot_dump(snap)["s"]) == spec.contents(state_dump(ref))
    assert "ttl" not in s_meta(snap)
    # The migration's count goes into the next snapshot's ttl_expired (checkpoint statistics).
    assert snap.ttl_expired.get("migration") == b.ttl_statistics()["migration"]


@KIND
@SPEC
def test_on_to_off_before_expiry_keeps_everything(tmp_path, kind, spec):
    store = CheckpointStore(tmp_path)
    _written_with_ttl(kind, spec, store)
    b, st = restored(kind, store, 1, plain_desc(spec), "restore_then_register", ManualClock(99))
    got = read_all(b, spec, st)
    assert all(got[i] is not None for i in KEYS)
    assert b.ttl_statistics()["migration"] == 0


# ------------------------------------------------------------------------------ afterwards

@KIND
@SPEC
@pytest.mark.parametrize("direction", ["off_to_on", "on_to_off"])
def test_migrated_state_checkpoints_and_restores_without_migration(tmp_path, kind, spec, direction):
    store = CheckpointStore(tmp_path, max_runs=None)
    if direction == "off_to_on":
        plain = create_backend(kind, key_type="int64")
        pst = plain.get_state(plain_desc(spec, migrate=False))
        for i in KEYS:
            plain.set_current_key(i)
            spec.write(pst, i)
        checkpoint(store, plain, 1)
        new, new_plain = ttl_desc(spec), ttl_desc(spec, migrate=False)
    else:
        _written_with_ttl(kind, spec, store)
        new, new_plain = plain_desc(spec), plain_desc(spec, migrate=False)
    clock = ManualClock(60)
    b, st = restored(kind, store, 1, new, "restore_then_register", clock)
    b.set_current_key(42)
    spec.write(st, 42)
    # The base (version 1) is in the old format: the "incremental" snapshot is a full one.
    snap = checkpoint(store, b, 2, incremental=True)
    assert snap.incremental is False
    assert store.manifest(2)["files"][0]["kind"] == "full"
    assert len(store.manifest(2)["files"]) == 1  # version 1's run is not needed any more
    expect = {2: state_dump(b)}
    b.set_current_key(43)
    spec.write(st, 43)
    snap = checkpoint(store, b, 3, incremental=True)
    assert snap.incremental is True  # the base (version 2) has the new format
    expect[3] = state_dump(b)
    for version in (2, 3):
        r, rst = restored(kind, store, version, new_plain, "restore_then_register", clock)
        assert state_dump(r) == expect[version]
        r.set_current_key(42)
        assert spec.read(rst) == spec.expect_full(42)
        assert r.ttl_statistics()["migration"] == 0


# ------------------------------------------------------------------------------ event time

@KIND
@SPEC
def test_event_time_off_to_on_waits_for_the_first_watermark(tmp_path, kind, spec):
    plain = create_backend(kind, key_type="int64")
    pst = plain.get_state(plain_desc(spec, migrate=False))
    for i in KEYS:
        plain.set_current_key(i)
        spec.write(pst, i)
    store = CheckpointStore(tmp_path)
    checkpoint(store, plain, 1)
    cfg = StateTtlConfig(TTL, time_characteristic="event_time")
    b, st = restored(kind, store, 1, ttl_desc(spec, cfg), "restore_then_register")
    # Stamped with the event time before any watermark, as writes then are ...
    ref = create_backend(kind, key_type="int64")
    rst = ref.get_state(ttl_desc(spec, cfg, migrate=False))
    for i in KEYS:
        ref.set_current_key(i)
        spec.write(rst, i)
    assert state_dump(b) == state_dump(ref)
    # ... so the first watermark re-stamps them: written at 5000.
    b.observe_watermark(5000)
    ref.observe_watermark(5000)
    assert state_dump(b) == state_dump(ref)
    b.observe_watermark(5000 + TTL - 1)
    assert read_all(b, spec, st) == {i: spec.expect_full(i) for i in KEYS}
    b.observe_watermark(5000 + TTL)
    assert read_all(b, spec, st) == dict.fromkeys(KEYS)


@KIND
def test_event_time_migration_uses_the_current_watermark(tmp_path, kind):
    spec = FixedList()
    cfg = StateTtlConfig(TTL, time_characteristic="event_time")
    plain = create_backend(kind, key_type="int64")
    pst = plain.get_state(plain_desc(spec, migrate=False))
    plain.set_current_key(1)
    spec.write(pst, 1)
    store = CheckpointStore(tmp_path)
    checkpoint(store, plain, 1)
    b = create_backend(kind, key_type="int64")
    store.restore(b, 1)
    b.observe_watermark(7000)  # seen before the state is registered
    st = b.get_state(ttl_desc(spec, cfg))
    (chunk,) = b.snapshot().entries("s", b.key_group_of(1))[1].to_pylist()  # two elements
    assert [chunk[8:16], chunk[24:32]] == [(7000).to_bytes(8, "big", signed=True)] * 2
    # on -> off at event time: before any watermark nothing is expired; after one, at it.
    b.set_current_key(2)
    st.add(5)  # stamped 7000
    store2 = CheckpointStore(tmp_path / "2")
    checkpoint(store2, b, 1)
    for watermark, expect in ((None, [5]), (7000 + TTL - 1, [5]), (7000 + TTL, None)):
        r = create_backend(kind, key_type="int64")
        store2.restore(r, 1)
        if watermark is not None:
            r.observe_watermark(watermark)
        rst = r.get_state(plain_desc(spec))
        r.set_current_key(2)
        assert spec.read(rst) == expect


# ------------------------------------------------------------------------------ errors, no-ops

@KIND
@ORDER
def test_without_the_request_the_error_says_how_to_migrate(tmp_path, kind, order):
    spec = Value()
    store = CheckpointStore(tmp_path)
    _written_with_ttl(kind, spec, store)
    with pytest.raises(StateMigrationError, match=r"enable_ttl_migration\(\)"):
        restored(kind, store, 1, plain_desc(spec, migrate=False), order)
    plain = create_backend(kind, key_type="int64")
    pst = plain.get_state(plain_desc(spec, migrate=False))
    plain.set_current_key(1)
    spec.write(pst, 1)
    store2 = CheckpointStore(tmp_path / "2")
    checkpoint(store2, plain, 1)
    with pytest.raises(StateMigrationError, match=r"enable_ttl_migration\(\)"):
        restored(kind, store2, 1, ttl_desc(spec, migrate=False), order)


@KIND
def test_a_state_in_use_is_not_migrated(kind):
    spec = Value()
    b = create_backend(kind, key_type="int64")
    st = b.get_state(plain_desc(spec, migrate=False))
    b.set_current_key(1)
    spec.write(st, 1)
    with pytest.raises(StateMigrationError, match="registered"):
        b.get_state(ttl_desc(spec))
    assert spec.read(st) == 10 and "ttl" not in s_meta(b.snapshot())


@KIND
@SPEC
def test_requesting_a_migration_when_nothing_differs_changes_nothing(tmp_path, kind, spec):
    store = CheckpointStore(tmp_path)
    _written_with_ttl(kind, spec, store)
    plain_b, _ = restored(kind, store, 1, ttl_desc(spec, migrate=False), "restore_then_register",
                          ManualClock(120))
    b, st = restored(kind, store, 1, ttl_desc(spec), "restore_then_register", ManualClock(120))
    assert state_dump(b) == state_dump(plain_b)  # timestamps kept, expired entries still there
    assert b.ttl_statistics()["migration"] == 0
    assert b.snapshot(incremental=True).incremental is True


@KIND
@pytest.mark.parametrize("order", ["restore_then_register", "register_then_restore"])
def test_a_broken_layout_fails_the_migration_and_changes_nothing(kind, order):
    spec = FixedList()
    src = create_backend(kind, key_type="int64", ttl_clock=ManualClock(0))
    sst = src.get_state(ttl_desc(spec, migrate=False))
    for i in KEYS:
        src.set_current_key(i)
        spec.write(sst, i)
    # Every chunk of "s" is 13 bytes: not a multiple of 8 + 8 bytes.
    broken = TamperedSnapshot(src.snapshot(), "s", lambda k, v: (
        k, pa.array([b"\x00" * 13] * len(k), pa.binary())))
    b = create_backend(kind, key_type="int64", ttl_clock=ManualClock(0))
    if order == "register_then_restore":
        b.get_state(plain_desc(spec))
        # The python backend decodes on restore (InvalidInputError, as for any malformed
        # snapshot); the native one loads bytes and finds it when converting.
        with pytest.raises((StateMigrationError, InvalidInputError), match="truncated|list"):
            b.restore(broken)
        assert b.num_entries() == 0 and "ttl" not in s_meta(b.snapshot())
        return
    if kind == "python":
        with pytest.raises(InvalidInputError):
            b.restore(broken)
        assert b.num_entries() == 0
        return
    b.restore(broken)  # the native backend loads the bytes without decoding them
    before = snapshot_dump(b.snapshot())
    with pytest.raises(StateMigrationError, match=r"unchanged.*key group \d+: truncated list"):
        b.get_state(plain_desc(spec))
    snap = b.snapshot()
    assert snapshot_dump(snap) == before and s_meta(snap)["ttl"]
    assert b.ttl_statistics()["migration"] == 0


@KIND
def test_registered_state_with_the_other_setting_and_no_request_rejects_restore(tmp_path, kind):
    spec = Map()
    store = CheckpointStore(tmp_path)
    _written_with_ttl(kind, spec, store)
    b = create_backend(kind, key_type="int64")
    b.get_state(plain_desc(spec, migrate=False))
    with pytest.raises(StateMigrationError, match="enable_ttl_migration"):
        store.restore(b, 1)
    # Two snapshots of different TTL settings restored into one backend before registration.
    b = create_backend(kind, key_type="int64", ttl_clock=ManualClock(0))
    store.restore(b, 1)
    plain = create_backend(kind, key_type="int64")
    plain.get_state(plain_desc(spec, migrate=False))
    with pytest.raises(StateMigrationError, match="same TTL setting"):
        b.restore(plain.snapshot())


def test_migration_flag_is_not_part_of_the_meta():
    d = ValueStateDescriptor("v", "int64")
    assert d.ttl_migration is False
    assert d.enable_ttl_migration() is d and d.ttl_migration is True
    assert d.meta() == ValueStateDescriptor("v", "int64").meta()
    # check_compatible lets a TTL on/off difference pass with the request, nothing else.
    ttl_meta = dict(
        ValueStateDescriptor("v", "int64").enable_time_to_live(StateTtlConfig(5)).meta())
    d.check_compatible(ttl_meta)
    with pytest.raises(StateMigrationError, match="value_type"):
        d.check_compatible(dict(ttl_meta, value_type="string"))
    with pytest.raises(StateMigrationError, match=r"enable_ttl_migration\(\)"):
        ValueStateDescriptor("v", "int64").check_compatible(ttl_meta)


def test_native_migration_matches_python_byte_for_byte(tmp_path):
    if "native" not in BACKENDS:
        pytest.skip("native extension not built")
    for spec in SPECS.values():
        for direction in ("off_to_on", "on_to_off"):
            dumps = []
            for kind in ("python", "native"):
                store = CheckpointStore(tmp_path / f"{type(spec).__name__}-{direction}-{kind}")
                if direction == "on_to_off":
                    _written_with_ttl(kind, spec, store)
                    desc = plain_desc(spec)
                else:
                    plain = create_backend(kind, key_type="int64")
                    pst = plain.get_state(plain_desc(spec, migrate=False))
                    for i in KEYS:
                        plain.set_current_key(i)
                        spec.write(pst, i)
                    checkpoint(store, plain, 1)
                    desc = ttl_desc(spec)
                b, _ = restored(kind, store, 1, desc, "restore_then_register", ManualClock(120))
                dumps.append((snapshot_dump(b.snapshot()), b.ttl_statistics()))
            assert dumps[0] == dumps[1], (type(spec).__name__, direction)


@pytest.mark.parametrize("kind", BACKENDS)
def test_new_ttl_settings_are_not_a_migration_and_commit_incrementally(tmp_path, kind):
    """Another time to live (or cleanup strategy) on restore keeps the stored format: no
    migration request, the next snapshot stays incremental, the manifest and the expiry follow
    the new setting."""
    clock = ManualClock(0)
    store = CheckpointStore(tmp_path)
    b = create_backend(kind, key_type="int64", ttl_clock=clock)
    st = b.get_state(ValueStateDescriptor("v", "int64").enable_time_to_live(StateTtlConfig(TTL)))
    st.put_batch(pa.array([1, 2, 3]), pa.array([10, 20, 30]))
    store.commit(0, [store.write_snapshot(b.snapshot(), 0)])
    b2 = create_backend(kind, key_type="int64", ttl_clock=clock)
    store.restore(b2, 0)
    longer = StateTtlConfig(5 * TTL, cleanup_incrementally=5)
    st2 = b2.get_state(ValueStateDescriptor("v", "int64").enable_time_to_live(longer))
    clock.advance(2 * TTL)
    assert st2.get_batch(pa.array([1, 2])).to_pylist() == [10, 20]  # alive under the new TTL
    snap = b2.snapshot(incremental=True)
    assert snap.incremental
    store.commit(1, [store.write_snapshot(snap, 1)])
    (meta,) = [m for m in store.manifest(1)["states"] if m["name"] == "v"]
    assert meta["ttl"] == longer.meta()
    b3 = create_backend(kind, key_type="int64", ttl_clock=clock)
    store.restore(b3, 1)
    st3 = b3.get_state(ValueStateDescriptor("v", "int64").enable_time_to_live(longer))
    assert st3.get_batch(pa.array([1, 2, 3])).to_pylist() == [10, 20, 30]

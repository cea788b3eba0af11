"""Snapshot and restore part of the backend conformance suite (mixed into
:class:`statecore.testing.conformance.BackendConformance`): snapshots isolated from later writes,
the snapshot format (state metas, sorted key bytes, value encodings, timers, state bytes),
restore round trips into both backends, restores refused for incompatible or malformed
snapshots (nothing changes), TTL switched on and off across a restore (``enable_ttl_migration``)
and rescaling from two to three operators by key-group ranges.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from statecore import key_groups as K
from statecore import serializers as S
from statecore.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from statecore.errors import InvalidInputError, StateError, StateMigrationError
from statecore.testing.base import ConformanceBase
from statecore.testing.helpers import (
    AverageAggregate,
    TamperedSnapshot,
    metas_by_name,
    snapshot_dump,
)

__all__ = ["SnapshotConformance"]


def _populate(b, keys, tag=0):
    """Register states "v" (int64 value), "l" (string list in int64 namespace 7), "m" (int64 ->
    pickle map), "r" (float64 sum) on ``b`` and write each of ``keys`` to all of them, with an
    event-time timer at ``1000 + key``; "v" holds ``key * 10 + tag``."""
    v = b.get_state(ValueStateDescriptor("v", "int64"))
    ls = b.get_state(ListStateDescriptor("l", "string"), namespace_type="int64")
    m = b.get_state(MapStateDescriptor("m", "int64", "pickle"))
    r = b.get_state(ReducingStateDescriptor("r", "sum", "float64"))
    ls.set_current_namespace(7)
    for k in keys:
        b.set_current_key(k)
        v.update(k * 10 + tag)
        ls.add_all([f"{k}", "x"])
        m.put(k, {"k": k})
        m.put(-1, None)
        r.add(k / 2)
        b.timers.register_event_time_timer(1000 + k)


def _ttl_migration_history(make) -> list:
    """Restore plain state with TTL switched on (enable_ttl_migration), write a little,
    snapshot, restore that with TTL switched off again once part of it expired; returns what
    to compare: snapshot dumps, ``incremental`` flags and TTL statistics."""
    from statecore.ttl import ManualClock, StateTtlConfig

    def register(b, ttl):
        def d(desc):
            if ttl:
                desc.enable_time_to_live(StateTtlConfig(100))
            return desc.enable_ttl_migration()
        ls = b.get_state(d(ListStateDescriptor("l", "string")), namespace_type="int64")
        ls.set_current_namespace(7)
        return (b.get_state(d(ValueStateDescriptor("v", "int64"))), ls,
                b.get_state(d(MapStateDescriptor("m", "int64", "pickle"))),
                b.get_state(d(ReducingStateDescriptor("r", "sum", "float64"))),
                b.get_state(d(AggregatingStateDescriptor("a", AverageAggregate(), "pickle"))))

    src = make(key_type="int64", max_parallelism=128)
    _populate(src, range(40))
    agg = src.get_state(AggregatingStateDescriptor("a", AverageAggregate(), "pickle"))
    for k in range(40):
        src.set_current_key(k)
        agg.add(k)
    out = []
    clock = ManualClock(1000)
    b = make(key_type="int64", max_parallelism=128, ttl_clock=clock)
    b.restore(src.snapshot())
    v, ls, m, r, a = register(b, ttl=True)  # off -> on: stamped 1000
    out.append(snapshot_dump(b.snapshot()))
    clock.set(1050)
    for k in range(10):
        b.set_current_key(k)
        v.update(-k)
        ls.add("late")
        m.put(1000, k)
        r.add(1.0)
        a.add(k)
    snap = b.snapshot(incremental=True)  # full: the base is the plain state
    out += [snap.incremental, snapshot_dump(snap), b.ttl_statistics()]
    c = make(key_type="int64", max_parallelism=128, ttl_clock=ManualClock(1120))
    c.restore(snap)
    register(c, ttl=False)  # on -> off: what was written at 1000 expired at 1100
    out += [snapshot_dump(c.snapshot()), c.ttl_statistics(), c.num_entries()]
    return out


class SnapshotConformance(ConformanceBase):
    """Full snapshots, restores, TTL migration on restore and rescaling."""

    def test_snapshot_isolation(self):
        b = self.new_backend()
        _populate(b, range(30))
        snap = b.snapshot()
        dump = snapshot_dump(snap)
        assert dump == snapshot_dump(snap)
        _populate(b, range(20, 60), tag=1)
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        b.set_current_key(0)
        v.clear()
        b.timers.advance_watermark(1010)
        assert snapshot_dump(snap) == dump
        snap.release()
        snap.release()
        with pytest.raises(StateError):
            snap.entries("v", 0)

    def test_snapshot_format(self):
        b = self.new_backend()
        _populate(b, range(10))
        snap = b.snapshot()
        metas = metas_by_name(snap)
        assert metas["v"]["kind"] == "value" and metas["v"]["value_type"] == "int64"
        assert metas["l"]["namespace_type"] == "int64" and metas["m"]["user_key_type"] == "int64"
        assert metas["__timers__"]["kind"] == "timers"
        assert snap.max_parallelism == 128 and snap.key_type == "int64" and snap.assigner == "spark"
        n = 0
        for kg, rows in snapshot_dump(snap)["v"].items():
            keys = [k for k, _ in rows]
            assert keys == sorted(keys)
            for kb, vb in rows:
                kg2, key, ns, _ = S.decode_key(kb, 128, "int64", "void")
                assert kg2 == kg == K.spark_key_group(key, "int64", 128)
                assert S.value_serializer("int64").deserialize(vb) == key * 10
                n += 1
        assert n == 10
        for rows in snapshot_dump(snap)["l"].values():
            # One entry per chunk (docs/formats.md "List state"): prefix | seq, in list order.
            per_key = {}
            for kb, vb in rows:
                _, key, ns, seqb = S.split_list_entry_key(kb, 128, "int64", "int64")
                assert ns == 7
                per_key.setdefault(key, []).append(
                    (int.from_bytes(seqb, "big"), S.decode_list(vb, "string")))
            for key, chunks in per_key.items():
                assert chunks == [(0, [str(key), "x"])]
        for rows in snapshot_dump(snap)["m"].values():
            # One entry per user key (docs/formats.md "Map state"), sorted by key bytes:
            # big-endian two's complement puts user key -1 after the key's own.
            per_key = {}
            for kb, vb in rows:
                _, key, _, uk = S.decode_key(kb, 128, "int64", "void", "int64")
                per_key.setdefault(key, []).append((uk, S.value_serializer("pickle")
                                                    .deserialize(vb)))
            for key, pairs in per_key.items():
                assert pairs == [(key, {"k": key}), (-1, None)]
        ts = sorted(S.decode_timer_key(kb, 128, "int64", "void")[1]
                    for rows in snapshot_dump(snap)["__timers__"].values() for kb, _ in rows)
        assert ts == [1000 + k for k in range(10)]
        expected = sum(len(kb) + len(vb) for name, per in snapshot_dump(snap).items()
                       if name != "__timers__" for rows in per.values() for kb, vb in rows)
        assert b.state_bytes() == expected
        assert b.num_entries() == 50  # map "m": two entries per key, list "l": one chunk

    def test_snapshot_restore_round_trip(self):
        b = self.new_backend()
        _populate(b, range(50))
        snap = b.snapshot()
        fresh = self.new_backend()
        fresh.restore(snap)
        assert snapshot_dump(fresh.snapshot()) == snapshot_dump(snap)
        assert fresh.num_entries() == b.num_entries() and fresh.state_bytes() == b.state_bytes()
        fresh.set_current_key(7)
        assert fresh.get_state(ValueStateDescriptor("v", "int64")).value() == 70
        assert fresh.get_state(MapStateDescriptor("m", "int64", "pickle")).get(7) == {"k": 7}
        with pytest.raises(StateMigrationError):
            fresh.get_state(ValueStateDescriptor("m", "int64"))
        with pytest.raises(StateMigrationError):
            fresh.get_state(ListStateDescriptor("l", "string"))  # namespace type differs
        fired = fresh.timers.advance_watermark(1005)
        assert [f[0] for f in fired] == [1000, 1001, 1002, 1003, 1004, 1005]
        ref = self.make_reference_backend(key_type="int64", max_parallelism=128)
        ref.restore(snap)
        assert snapshot_dump(ref.snapshot()) == snapshot_dump(snap)

    def test_restore_rejects_incompatible(self):
        b = self.new_backend()
        _populate(b, range(5))
        snap = b.snapshot()
        for kw in [dict(key_type="string"), dict(max_parallelism=256), dict(assigner="flink")]:
            other = self.new_backend(**kw)
            with pytest.raises(StateMigrationError):
                other.restore(snap)
            assert other.num_entries() == 0
        other = self.new_backend()
        other.get_state(ValueStateDescriptor("v", "string"))
        with pytest.raises(StateMigrationError):
            other.restore(snap)

    def test_restore_of_malformed_snapshot_changes_nothing(self):
        """A snapshot whose timers, keys or values are malformed is rejected as a whole: the
        states and timers the backend already held are exactly as before."""
        b = self.new_backend()
        _populate(b, range(20))
        snap = b.snapshot()

        target = self.new_backend()
        _populate(target, range(100, 110))
        before = snapshot_dump(target.snapshot())
        timers_before = target.timers.num_timers()
        bad = [
            ("__timers__", lambda k, v: (pa.array([b"\x00"] * len(k), pa.binary()), v)),
            ("v", lambda k, v: (pa.array([x[:1] for x in k.to_pylist()], pa.binary()), v)),
            ("v", lambda k, v: (k, pa.array([b"\x01\x02"] * len(v), pa.binary()))),
        ]
        for state, mangle in bad:
            with pytest.raises((InvalidInputError, StateMigrationError)):
                target.restore(TamperedSnapshot(snap, state, mangle))
            assert snapshot_dump(target.snapshot()) == before
            assert target.timers.num_timers() == timers_before

    def test_ttl_migration_matches_reference(self):
        got = _ttl_migration_history(self.make_backend)
        assert got == _ttl_migration_history(self.make_reference_backend)
        assert got[1] is False  # the snapshot after the migration was full
        # v, r, a: 30 keys each; l: 2 elements, m: 2 entries of each of the 40 keys
        assert got[-2]["migration"] == 3 * 30 + 80 + 80
        assert got[-1] == 10 * 5  # keys 0-9 of each state survive

    @pytest.mark.parametrize("max_parallelism", [128, 300])
    def test_rescale_two_to_three(self, max_parallelism):
        mp = max_parallelism
        old = []
        for i in range(2):
            kgr = K.key_group_range_for_operator(mp, 2, i)
            b = self.new_backend(max_parallelism=mp, key_group_range=kgr)
            mine = [k for k in range(400) if K.spark_key_group(k, "int64", mp) in kgr]
            _populate(b, mine)
            old.append((b.snapshot(), mine))
        all_keys = sorted(k for _, ks in old for k in ks)
        assert all_keys == list(range(400))
        seen_keys, seen_timers = [], []
        for j in range(3):
            kgr = K.key_group_range_for_operator(mp, 3, j)
            nb = self.new_backend(max_parallelism=mp, key_group_range=kgr)
            for snap, _ in old:
                nb.restore(snap)
            owned = [k for k in range(400) if K.spark_key_group(k, "int64", mp) in kgr]
            assert nb.num_entries() == 5 * len(owned)  # map "m": two entries a key, list "l" one
            v = nb.get_state(ValueStateDescriptor("v", "int64"))
            assert v.get_batch(pa.array(owned)).to_pylist() == [k * 10 for k in owned]
            dump = snapshot_dump(nb.snapshot())
            for name, per in dump.items():
                assert set(per) <= set(kgr), name
                if mp > 128:
                    for kg, rows in per.items():
                        assert all(kb[:2] == kg.to_bytes(2, "big") for kb, _ in rows)
            seen_keys += owned
            fired = nb.timers.advance_watermark(10_000)
            assert sorted(k for _, k, _ in fired) == owned
            seen_timers += [k for _, k, _ in fired]
        assert sorted(seen_keys) == list(range(400))
        assert sorted(seen_timers) == list(range(400))

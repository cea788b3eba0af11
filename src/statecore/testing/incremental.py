"""Incremental snapshot part of the backend conformance suite (mixed into
:class:`statecore.testing.conformance.BackendConformance`): ``snapshot(incremental=True)`` lists
the entries changed since the completed base snapshot and tombstones (``None`` values) for the
removed ones, timers complete; base + incremental merged (:func:`statecore.testing.helpers.
merge_incremental`) equals the full snapshot of the same moment; ``notify_checkpoint_complete``
moves the base; random histories are byte-identical to the reference backend.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from statecore import serializers as S
from statecore.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from statecore.errors import InvalidInputError
from statecore.testing.base import ConformanceBase
from statecore.testing.helpers import merge_incremental, snapshot_dump

__all__ = ["IncrementalSnapshotConformance"]


def _incremental_history(b, seed: int, steps: int):
    """Seeded random writes over value / list / map / reducing (per record and batch) states,
    with namespaces. Returns nothing; the states are registered on ``b``."""
    rng = random.Random(seed)
    v = b.get_state(ValueStateDescriptor("v", "int64"))
    ls = b.get_state(ListStateDescriptor("l", "string"), namespace_type="int64")
    m = b.get_state(MapStateDescriptor("m", "string", "int64"))
    r = b.get_state(ReducingStateDescriptor("r", "sum", "int64"), namespace_type="string")
    for _ in range(steps):
        b.set_current_key(rng.randint(0, 40))
        op = rng.random()
        if op < 0.25:
            v.update(rng.choice([None, rng.randint(-9, 9)]))
        elif op < 0.4:
            ls.set_current_namespace(rng.randint(0, 2))
            rng.choice([lambda: ls.add("x" * rng.randint(0, 3)), ls.clear,
                        lambda: ls.update([])])()
        elif op < 0.6:
            uk = rng.choice(["a", "b", "c"])
            (m.put(uk, rng.randint(0, 5)) if rng.random() < 0.6 else m.remove(uk))
        elif op < 0.75:
            r.set_current_namespace(rng.choice(["x", "y"]))
            r.add(rng.randint(-3, 3)) if rng.random() < 0.8 else r.clear()
        elif op < 0.85:
            ks = [rng.randint(0, 40) for _ in range(rng.randint(1, 8))]
            vals = [rng.choice([None, rng.randint(-9, 9)]) for _ in ks]
            v.put_batch(pa.array(ks, pa.int64()), pa.array(vals, pa.int64()))
        elif op < 0.95:
            ks = [rng.randint(0, 40) for _ in range(rng.randint(1, 8))]
            r.add_batch(pa.array(ks, pa.int64()), pa.array([1] * len(ks), pa.int64()),
                        namespaces=rng.choice(["x", "y"]))
        else:
            ks = [rng.randint(0, 40) for _ in range(rng.randint(1, 4))]
            v.clear_batch(pa.array(ks, pa.int64()))
        if rng.random() < 0.05:
            b.timers.register_event_time_timer(rng.randint(0, 100))


class IncrementalSnapshotConformance(ConformanceBase):
    """``snapshot(incremental=True)`` and ``notify_checkpoint_complete``."""

    def test_incremental_random_histories(self):
        """For each seed: the backend and the reference run the same history with snapshots,
        some completed (the latest or an older one), some never; every incremental snapshot is
        byte-identical on both, and base + incremental merged equals the full snapshot taken at
        the same moment."""
        for seed in (1, 2, 3, 4):
            b = self.new_backend()
            ref = self.make_reference_backend(key_type="int64", max_parallelism=128)
            rng = random.Random(seed * 7919)
            base_dump, pending = None, {}
            for _ in range(12):
                # The same seed gives the same operations on both backends.
                hist_seed, steps = rng.randint(0, 1 << 30), rng.randint(5, 80)
                _incremental_history(b, hist_seed, steps)
                _incremental_history(ref, hist_seed, steps)
                inc, inc_ref = b.snapshot(incremental=True), ref.snapshot(incremental=True)
                full, full_ref = b.snapshot(), ref.snapshot()
                assert inc.incremental and not full.incremental
                assert inc.snapshot_id == inc_ref.snapshot_id and full.snapshot_id > inc.snapshot_id
                inc_dump, full_dump = snapshot_dump(inc), snapshot_dump(full)
                assert inc_dump == snapshot_dump(inc_ref)
                assert full_dump == snapshot_dump(full_ref)
                assert merge_incremental(base_dump, inc_dump) == full_dump
                pending[inc.snapshot_id] = pending[full.snapshot_id] = full_dump
                choice = rng.random()
                if choice < 0.5:
                    sid = max(pending) if choice < 0.35 else min(pending)
                    b.notify_checkpoint_complete(sid)
                    ref.notify_checkpoint_complete(sid)
                    base_dump = pending[sid]
                    pending = {i: d for i, d in pending.items() if i > sid}
                for snap in (inc, inc_ref, full, full_ref):
                    snap.release()

    def test_incremental_snapshot_lists_changes_and_tombstones(self):
        b = self.new_backend()
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        for k in range(5):
            b.set_current_key(k)
            v.update(k * 10)
        b.timers.register_event_time_timer(7)
        s1 = b.snapshot(incremental=True)
        assert s1.incremental and s1.snapshot_id == 1
        assert merge_incremental(None, snapshot_dump(s1)) == snapshot_dump(b.snapshot())
        b.notify_checkpoint_complete(s1.snapshot_id)
        b.set_current_key(1)
        v.update(11)
        b.set_current_key(2)
        v.clear()
        b.set_current_key(3)
        v.clear()
        v.update(33)  # removed then re-put: a put
        b.set_current_key(9)
        v.update(1)
        v.clear()  # created and removed after the base: a (harmless) tombstone
        s3 = b.snapshot(incremental=True)
        assert s3.snapshot_id == 3
        got = {}
        for kg in b.key_group_range:
            keys, vals = s3.entries("v", kg)
            assert keys.to_pylist() == sorted(keys.to_pylist())
            for kb, vb in zip(keys.to_pylist(), vals.to_pylist()):
                _, key, _, _ = S.decode_key(kb, 128, S.key_serializer("int64"),
                                            S.key_serializer("void"))
                got[key] = None if vb is None else S.value_serializer("int64").deserialize(vb)
        assert got == {1: 11, 2: None, 3: 33, 9: None}
        # Timers are complete in an incremental snapshot.
        assert sum(len(s3.entries("__timers__", kg)[0]) for kg in b.key_group_range) == 1

    def test_incremental_snapshot_isolation(self):
        b = self.new_backend()
        v = b.get_state(ValueStateDescriptor("v", "string"))
        for k in range(200):
            b.set_current_key(k)
            v.update("a" * (k % 5))
        b.notify_checkpoint_complete(b.snapshot().snapshot_id)
        for k in range(0, 200, 3):
            b.set_current_key(k)
            v.update("changed") if k % 2 else v.clear()
        inc = b.snapshot(incremental=True)
        before = snapshot_dump(inc)
        for k in range(200):
            b.set_current_key(k)
            v.update("later")
        b.set_current_key(1)
        v.clear()
        b.notify_checkpoint_complete(inc.snapshot_id)  # completing it does not change it either
        assert snapshot_dump(inc) == before
        nonempty = {kg: rows for kg, rows in before["v"].items()}
        assert sum(len(r) for r in nonempty.values()) == len(range(0, 200, 3))

    def test_notify_checkpoint_complete_validation(self):
        b = self.new_backend()
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        for bad in (0, 1, "1", 1.0, True, None):
            with pytest.raises(InvalidInputError):
                b.notify_checkpoint_complete(bad)  # nothing issued yet / not an int
        b.set_current_key(1)
        v.update(1)
        s1, s2 = b.snapshot(), b.snapshot(incremental=True)
        with pytest.raises(InvalidInputError):
            b.notify_checkpoint_complete(s2.snapshot_id + 1)
        b.notify_checkpoint_complete(s2.snapshot_id)
        b.notify_checkpoint_complete(s2.snapshot_id)  # idempotent
        b.notify_checkpoint_complete(s1.snapshot_id)  # older than the base: ignored
        assert b.base_snapshot_id == s2.snapshot_id
        assert snapshot_dump(b.snapshot(incremental=True))["v"] == {}

    def test_incremental_after_restore_holds_only_later_changes(self):
        src = self.new_backend()
        v = src.get_state(ValueStateDescriptor("v", "int64"))
        for k in range(50):
            src.set_current_key(k)
            v.update(k)
        full = src.snapshot()
        for b in (self.new_backend(),
                  self.make_reference_backend(key_type="int64", max_parallelism=128)):
            b.snapshot()  # an id issued before the restore
            b.restore(full)
            assert b.base_snapshot_id == 1
            b.notify_checkpoint_complete(1)  # predates the restored state: ignored
            inc = b.snapshot(incremental=True)
            assert snapshot_dump(inc)["v"] == {}
            w = b.get_state(ValueStateDescriptor("v", "int64"))
            b.set_current_key(3)
            w.update(300)
            b.set_current_key(4)
            w.clear()
            inc2 = b.snapshot(incremental=True)
            d = snapshot_dump(inc2)
            assert sum(len(r) for r in d["v"].values()) == 2
            assert merge_incremental(snapshot_dump(full), d) == snapshot_dump(b.snapshot())

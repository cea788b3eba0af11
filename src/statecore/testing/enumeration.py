"""Key enumeration part of the backend conformance suite (mixed into
:class:`statecore.testing.conformance.BackendConformance`): ``backend.keys(state, namespace)``
(Flink ``getKeys``) and ``backend.apply_to_all_keys(descriptor, function, namespace)`` (Flink
``applyToAllKeys``) -- the same keys in the same order as the reference backend, with namespaces,
after removals, after a restore, over a key-group sub-range, TTL-expired entries listed until
cleaned up, and the current key and namespace put back afterwards.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from statecore import key_groups as K
from statecore.descriptors import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from statecore.errors import InvalidInputError
from statecore.key_groups import KeyGroupRange
from statecore.testing.base import ConformanceBase
from statecore.testing.helpers import snapshot_dump
from statecore.ttl import ManualClock, StateTtlConfig

__all__ = ["KeyEnumerationConformance"]


def _expected_order(b, keys):
    """``keys`` in the documented order: key group, then the key's serialized bytes."""
    ks = b.key_serializer
    return sorted(set(keys), key=lambda k: (b.key_group_of(k), ks.serialize(k)))


class KeyEnumerationConformance(ConformanceBase):
    """``KeyedStateBackend.keys`` and ``KeyedStateBackend.apply_to_all_keys``."""

    def test_keys_with_namespaces_and_removals(self):
        def program(b):
            v = b.get_state(ValueStateDescriptor("v", "int64"), "string")
            m = b.get_state(MapStateDescriptor("m", "int64", "int64"))
            seen = []
            for k in range(40):
                b.set_current_key(k)
                v.set_current_namespace("even" if k % 2 == 0 else "odd")
                v.update(k)
                if k % 5 == 0:
                    v.set_current_namespace("five")
                    v.update(k)
                m.put(k, k)
            seen.append(b.keys("v"))
            seen.append(b.keys("v", "five"))
            seen.append(b.keys("v", "odd"))
            seen.append(b.keys("m", "ignored for void states"))
            for k in range(0, 40, 3):
                b.set_current_key(k)
                v.set_current_namespace("even" if k % 2 == 0 else "odd")
                v.clear()
                m.remove(k)  # the last user key: the map is gone
            seen.append(b.keys("v"))
            seen.append(b.keys("v", "even"))
            seen.append(b.keys("m"))
            seen.append(b.keys("v", "nobody"))
            return seen

        seen = self.same_as_reference(program)
        b = self.new_backend()
        assert seen[0] == _expected_order(b, range(40))
        assert seen[1] == _expected_order(b, range(0, 40, 5))
        assert seen[2] == _expected_order(b, range(1, 40, 2))
        assert seen[3] == seen[0]
        gone = set(range(0, 40, 3))
        assert seen[4] == _expected_order(b, [k for k in range(40)
                                              if k not in gone or k % 5 == 0])
        assert seen[5] == _expected_order(b, [k for k in range(0, 40, 2) if k not in gone])
        assert seen[6] == _expected_order(b, [k for k in range(40) if k not in gone])
        assert seen[7] == []

    @pytest.mark.parametrize("key_type,keys", [
        (("string", "int32"), [("a", 1), ("a", 2), ("b", 1), ("", -5)]),
        ("timestamp[us]", [0, -1, 1_700_000_000_000_000]),
        ("float64", [-0.0, 1.5, float("inf")]),
        ("binary", [b"", b"\x00", b"xyz"]),
    ])
    def test_keys_decode_to_what_set_current_key_took(self, key_type, keys):
        b = self.new_backend(key_type=key_type)
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        canonical = []
        for k in keys:
            b.set_current_key(k)
            canonical.append(b.current_key)
            v.update(1)
        got = b.keys("v")
        assert sorted(map(repr, got)) == sorted(map(repr, canonical))
        assert got == _expected_order(b, canonical)
        for k in got:  # each one addresses its entry
            b.set_current_key(k)
            assert v.value() == 1

    def test_keys_after_restore_and_incremental_snapshots_unaffected(self):
        src, ref = self.backend_pair()
        for b in (src, ref):
            v = b.get_state(ValueStateDescriptor("v", "int64"))
            lst = b.get_state(ListStateDescriptor("l", "string"), "int64")
            b.notify_checkpoint_complete(b.snapshot().snapshot_id)
            for k in range(30):
                b.set_current_key(k)
                v.update(k)
                lst.set_current_namespace(k % 3)
                lst.add("x")
            b.keys("v")
            b.keys("l", 1)
            b.set_current_key(4)
            v.clear()
        # Enumerating keys takes no part in change tracking: the changes are the reference's.
        assert (snapshot_dump(src.snapshot(incremental=True))
                == snapshot_dump(ref.snapshot(incremental=True)))
        fresh = self.new_backend()
        fresh.restore(src.snapshot())
        # Restored, not registered yet: the states are known by name.
        assert fresh.keys("v") == _expected_order(fresh, [k for k in range(30) if k != 4])
        assert fresh.keys("l", 2) == _expected_order(fresh, range(2, 30, 3))
        assert fresh.keys("l") == src.keys("l") == ref.keys("l")

    def test_keys_over_a_key_group_sub_range(self):
        r = KeyGroupRange(10, 60)
        b = self.new_backend(key_group_range=r)
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        mine = [k for k in range(2000) if K.assign_key_group(k, "int64", 128, "spark") in r]
        for k in mine:
            b.set_current_key(k)
            v.update(k)
        sub = KeyGroupRange(20, 29)
        assert b.keys("v", key_group_range=sub) == _expected_order(
            b, [k for k in mine if b.key_group_of(k) in sub])
        assert b.keys("v", key_group_range=(10, 60)) == b.keys("v") == _expected_order(b, mine)
        for bad in [KeyGroupRange(0, 20), (50, 61), (70, 80)]:
            with pytest.raises(InvalidInputError, match="not inside"):
                b.keys("v", key_group_range=bad)
        with pytest.raises(InvalidInputError, match="no state named"):
            b.keys("nope")
        ns = b.get_state(ValueStateDescriptor("ns", "int64"), "int64")
        with pytest.raises(InvalidInputError):
            b.keys(ns.name, "not an int")

    def test_keys_list_ttl_expired_entries_until_cleaned_up(self):
        clock = ManualClock(0)
        b = self.new_backend(ttl_clock=clock)
        v = b.get_state(ValueStateDescriptor("v", "int64").enable_time_to_live(
            StateTtlConfig(100)))
        for k in range(5):
            b.set_current_key(k)
            v.update(k)
        clock.set(500)
        # As Flink's getKeys: no TTL filter, an expired entry is listed until cleanup removes it.
        assert b.keys("v") == _expected_order(b, range(5))
        b.set_current_key(2)
        assert v.value() is None  # cleanup on read
        assert b.keys("v") == _expected_order(b, [0, 1, 3, 4])

    def test_apply_to_all_keys(self):
        def program(b):
            v = b.get_state(ValueStateDescriptor("v", "int64"), "int64")
            for k in range(25):
                b.set_current_key(k)
                v.set_current_namespace(k % 2)
                v.update(k)
            b.set_current_key(7)
            v.set_current_namespace(1)
            calls = []

            def fn(key, state):
                assert b.current_key == key
                calls.append((key, state.value()))
                if key % 4 == 0:
                    state.clear()
                else:
                    state.update(state.value() * 10)

            b.apply_to_all_keys(ValueStateDescriptor("v", "int64"), fn, namespace=0)
            after = (b.current_key, v.current_namespace, v.value())
            return calls, after, b.keys("v", 0), b.keys("v", 1)

        calls, after, even, odd = self.same_as_reference(program)
        b = self.new_backend()
        assert calls == [(k, k) for k in _expected_order(b, range(0, 25, 2))]
        assert after == (7, 1, 7)
        assert even == _expected_order(b, [k for k in range(0, 25, 2) if k % 4])
        assert odd == _expected_order(b, range(1, 25, 2))

    def test_apply_to_all_keys_restores_the_current_key_on_error(self):
        b = self.new_backend()
        d = ValueStateDescriptor("v", "int64")
        v = b.get_state(d)
        for k in range(5):
            b.set_current_key(k)
            v.update(k)
        fresh = self.new_backend()
        fresh.restore(b.snapshot())

        def boom(key, state):
            state.update(-1)
            raise RuntimeError("stop")

        with pytest.raises(RuntimeError, match="stop"):
            fresh.apply_to_all_keys(d, boom)
        assert fresh.current_key is None  # none was set before
        with pytest.raises(InvalidInputError, match="no current key"):
            fresh.get_state(d).value()
        first = fresh.keys("v")[0]
        fresh.set_current_key(first)
        assert fresh.get_state(d).value() == -1
        b.set_current_key(3)
        b.apply_to_all_keys(d, lambda key, state: state.update(state.value() + 100),
                            key_group_range=(b.key_group_of(1), b.key_group_of(1)))
        assert b.current_key == 3
        assert v.value() == 3
        b.set_current_key(1)
        assert v.value() == 101
        ns = b.get_state(ValueStateDescriptor("ns", "int64"), "int64")
        with pytest.raises(InvalidInputError, match="needs the namespace"):
            b.apply_to_all_keys(ns.descriptor, lambda key, state: None)

    def test_apply_to_all_keys_batch_written_state(self):
        def program(b):
            v = b.get_state(ValueStateDescriptor("v", "int64"))
            keys = pa.array(range(300), pa.int64())
            v.put_batch(keys, keys)
            total = []
            b.apply_to_all_keys(v.descriptor, lambda key, state: total.append(state.value()))
            return sorted(total), len(b.keys("v"))

        assert self.same_as_reference(program) == (list(range(300)), 300)

"""Batch API part of the backend conformance suite (mixed into
:class:`statecore.testing.conformance.BackendConformance`): ``put_batch`` / ``get_batch`` /
``contains_batch`` / ``clear_batch`` / ``add_batch`` / ``append_batch`` / ``remove_batch`` of every
state kind over Arrow arrays, with namespaces; batches equal to the same rows one at a time; and
every rejected batch (null or out-of-range keys, wrong types or lengths, overflow) raising
InvalidInputError with the state untouched.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from statecore import key_groups as K
from statecore.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from statecore.errors import InvalidInputError
from statecore.testing.base import ConformanceBase
from statecore.testing.helpers import snapshot_dump

__all__ = ["BatchConformance"]


class BatchConformance(ConformanceBase):
    """The batch calls of every state kind, their results and their errors."""

    def test_value_batch(self):
        b = self.new_backend()
        v = b.get_state(ValueStateDescriptor("v", "float64"))
        v.put_batch(pa.array([1, 2, 3, 1], pa.int64()), pa.array([1.0, 2.0, 3.0, 4.0]))
        assert v.get_batch(pa.array([1, 2, 3, 4])).to_pylist() == [4.0, 2.0, 3.0, None]
        assert v.get_batch(pa.array([1, 2])).type == pa.float64()
        v.put_batch(pa.array([2, 2]), pa.array([None, 5.0]))
        v.put_batch(pa.array([3]), pa.array([None], pa.float64()))
        assert v.get_batch(pa.chunked_array([[1, 2], [3]])).to_pylist() == [4.0, 5.0, None]
        b.set_current_key(1)
        assert v.value() == 4.0
        assert v.contains_batch(pa.array([1, 4, 3])).to_pylist() == [True, False, False]
        v.clear_batch(pa.array([1]))
        assert v.value() is None and b.current_key == 1
        assert v.get_batch(pa.array([], pa.int64())).to_pylist() == []

    def test_batch_namespaces(self):
        b = self.new_backend()
        v = b.get_state(ValueStateDescriptor("v", "int64"), namespace_type="string")
        with pytest.raises(InvalidInputError):
            v.get_batch(pa.array([1]))  # no current namespace
        v.put_batch(pa.array([1, 1]), pa.array([10, 20]), namespaces=pa.array(["a", "b"]))
        v.put_batch(pa.array([2]), pa.array([30]), namespaces="a")
        v.set_current_namespace("b")
        assert v.get_batch(pa.array([1, 2])).to_pylist() == [20, None]
        assert v.get_batch(pa.array([1, 2]), namespaces="a").to_pylist() == [10, 30]
        b.set_current_key(2)
        v.set_current_namespace("a")
        assert v.value() == 30
        for bad in [pa.array(["a", None]), pa.array([1, 2]), pa.array(["a"]), 5]:
            with pytest.raises(InvalidInputError):
                v.put_batch(pa.array([1, 2]), pa.array([0, 0]), namespaces=bad)
        void = b.get_state(ValueStateDescriptor("w", "int64"))
        with pytest.raises(InvalidInputError):
            void.get_batch(pa.array([1]), namespaces=pa.array(["a"]))

    def test_reducing_batch(self):
        b = self.new_backend()
        s = b.get_state(ReducingStateDescriptor("s", "sum", "int64"))
        c = b.get_state(ReducingStateDescriptor("c", "count"))
        mx = b.get_state(ReducingStateDescriptor("mx", "max", "float64"))
        b.set_current_key(1)
        s.add(100)
        out = s.add_batch(pa.array([1, 2, 1, 3, 2]), pa.array([1, 5, None, None, 7]))
        assert out.type == pa.int64()
        assert out.to_pylist() == [101, 5, 101, None, 12]
        assert s.get_batch(pa.array([1, 2, 3])).to_pylist() == [101, 12, None]
        oc = c.add_batch(pa.array([1, 1, 2]), pa.array(["x", None, "y"]))
        assert oc.type == pa.int64() and oc.to_pylist() == [1, 1, 1]
        om = mx.add_batch(pa.array([4, 4, 4]), pa.array([2.0, 1.0, 3.0]))
        assert om.to_pylist() == [2.0, 2.0, 3.0]
        c.clear_batch(pa.array([1, 2]))
        assert c.get_batch(pa.array([1, 2])).to_pylist() == [None, None]

    def test_list_batch(self):
        b = self.new_backend()
        lst = b.get_state(ListStateDescriptor("l", "string"))
        lst.append_batch(pa.array([1, 2, 1]), pa.array(["a", "b", "c"]))
        lst.append_batch(pa.array([1, 3, 2], pa.int64()),
                         pa.array([["d", "e"], None, []], pa.list_(pa.string())))
        lst.append_batch(pa.chunked_array([[2]]),
                         pa.array([["f"]], pa.large_list(pa.large_string())))
        got = lst.get_batch(pa.array([1, 2, 3]))
        assert got.type == pa.list_(pa.string())
        assert got.to_pylist() == [["a", "c", "d", "e"], ["b", "f"], []]
        lst.clear_batch(pa.array([1]))
        assert lst.get_batch(pa.array([1, 2])).to_pylist() == [[], ["b", "f"]]
        b.set_current_key(2)
        assert lst.get() == ["b", "f"]  # the batch calls did not move the current key
        assert b.current_key == 2

    def test_map_batch(self):
        b = self.new_backend()
        m = b.get_state(MapStateDescriptor("m", "int32", "float64"))
        m.put_batch(pa.array([1, 1, 2, 1]), pa.array([10, 20, 10, 10], pa.int32()),
                    pa.array([1.0, 2.0, 3.0, 4.0]))
        got = m.get_batch(pa.array([1, 1, 2, 2]), pa.array([10, 20, 10, 20], pa.int32()))
        assert got.type == pa.float64() and got.to_pylist() == [4.0, 2.0, 3.0, None]
        m.remove_batch(pa.array([1, 2, 2]), pa.array([10, 10, 99], pa.int32()))
        assert m.contains_batch(pa.array([1, 1, 2]), pa.array([10, 20, 10], pa.int32())
                                ).to_pylist() == [False, True, False]
        b.set_current_key(1)
        assert m.items() == [(20, 2.0)]
        b.set_current_key(2)
        assert m.is_empty()  # removing the last user key removed the map
        ns = b.get_state(MapStateDescriptor("n", "string", "int64"), namespace_type="string")
        ns.put_batch(pa.array([1, 1]), pa.array(["u", "u"]), pa.array([5, 6]),
                     namespaces=pa.array(["w1", "w2"]))
        assert ns.get_batch(pa.array([1, 1]), pa.array(["u", "u"]),
                            namespaces=pa.array(["w2", "w1"])).to_pylist() == [6, 5]

    def test_list_and_map_batches_equal_the_rows_one_at_a_time(self):
        rng = random.Random(5)
        keys = [rng.randrange(20) for _ in range(300)]
        uks = [rng.choice("abcde") for _ in keys]
        vals = [rng.randrange(-50, 50) for _ in keys]
        batched, single = self.new_backend(), self.new_backend()
        for be, batch in ((batched, True), (single, False)):
            lst = be.get_state(ListStateDescriptor("l", "int64"))
            m = be.get_state(MapStateDescriptor("m", "string", "int64"))
            for lo in range(0, len(keys), 60):
                ks, us, vs = keys[lo:lo + 60], uks[lo:lo + 60], vals[lo:lo + 60]
                if batch:
                    lst.append_batch(pa.array(ks, pa.int64()), pa.array(vs, pa.int64()))
                    m.put_batch(pa.array(ks, pa.int64()), pa.array(us), pa.array(vs, pa.int64()))
                    m.remove_batch(pa.array(ks[::7], pa.int64()), pa.array(us[::3][:len(ks[::7])]))
                else:
                    for k, u, v in zip(ks, us, vs):
                        be.set_current_key(k)
                        lst.add(v)
                        m.put(u, v)
                    for k, u in zip(ks[::7], us[::3]):
                        be.set_current_key(k)
                        m.remove(u)
        assert snapshot_dump(batched.snapshot()) == snapshot_dump(single.snapshot())

    def test_batch_errors_leave_state_untouched(self):
        b = self.new_backend(key_group_range=(0, 63))
        inside = [k for k in range(1000) if K.spark_key_group(k, "int64", 128) <= 63][:3]
        outside = next(k for k in range(1000) if K.spark_key_group(k, "int64", 128) > 63)
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        s = b.get_state(ReducingStateDescriptor("s", "sum", "int64"))
        p = b.get_state(ValueStateDescriptor("p"))
        lst = b.get_state(ListStateDescriptor("l", "int64"))
        m = b.get_state(MapStateDescriptor("m", "string", "int64"))
        v.put_batch(pa.array(inside), pa.array([1, 2, 3]))
        s.add_batch(pa.array(inside), pa.array([1, 2, 3]))
        lst.append_batch(pa.array(inside), pa.array([1, 2, 3]))
        m.put_batch(pa.array(inside), pa.array(["a", "b", "c"]), pa.array([1, 2, 3]))
        before = snapshot_dump(b.snapshot())
        k2 = pa.array(inside[:2])
        bad_calls = [
            lambda: v.put_batch(pa.array([inside[0], None]), pa.array([9, 9])),
            lambda: v.put_batch(k2, pa.array([9])),
            lambda: v.put_batch(k2, pa.array([9, 9], pa.int32())),
            lambda: v.put_batch(k2, pa.array(["a", "b"])),
            lambda: v.put_batch(pa.array(inside[:2], pa.int32()), pa.array([9, 9])),
            lambda: v.put_batch(pa.array([inside[0], outside]), pa.array([9, 9])),
            lambda: v.put_batch([1, 2], pa.array([9, 9])),
            lambda: v.get_batch(pa.array([inside[0], None])),
            lambda: s.add_batch(pa.array([inside[0], outside]), pa.array([9, 9])),
            lambda: s.add_batch(pa.array([inside[0], inside[0]]), pa.array([5, (1 << 63) - 1])),
            lambda: s.add_batch(k2, pa.array([1.0, 2.0])),
            lambda: v.clear_batch(pa.array([inside[0], outside])),
            lambda: p.put_batch(k2, pa.array([1, 2])),
            lambda: p.get_batch(k2),
            lambda: lst.append_batch(k2, pa.array([1, None])),
            lambda: lst.append_batch(k2, pa.array([[1], [2, None]], pa.list_(pa.int64()))),
            lambda: lst.append_batch(k2, pa.array([[1], [2]], pa.list_(pa.int32()))),
            lambda: lst.append_batch(k2, pa.array([1])),
            lambda: lst.append_batch(pa.array([inside[0], outside]), pa.array([1, 2])),
            lambda: m.put_batch(k2, pa.array(["a", None]), pa.array([1, 2])),
            lambda: m.put_batch(k2, pa.array(["a", "b"]), pa.array([1, None])),
            lambda: m.put_batch(k2, pa.array([1, 2]), pa.array([1, 2])),
            lambda: m.put_batch(k2, pa.array(["a"]), pa.array([1, 2])),
            lambda: m.remove_batch(pa.array([inside[0], outside]), pa.array(["a", "b"])),
            lambda: m.get_batch(k2, pa.array(["a", None])),
            lambda: b.timers.register_batch(pa.array([inside[0], outside]), pa.array([1, 2])),
            lambda: b.timers.register_batch(k2, pa.array([1, None], pa.int64())),
            lambda: b.timers.register_batch(k2, pa.array([1.0, 2.0])),
            lambda: b.timers.register_batch(k2, pa.array([1])),
            lambda: b.timers.register_batch(k2, pa.array([1, 2]), namespaces=pa.array([1, 2])),
        ]
        for call in bad_calls:
            with pytest.raises(InvalidInputError):
                call()
            assert snapshot_dump(b.snapshot()) == before

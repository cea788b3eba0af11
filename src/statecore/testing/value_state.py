"""Value state part of the backend conformance suite (mixed into
:class:`statecore.testing.conformance.BackendConformance`): ``ValueState`` per record -- defaults,
every basic value type, pickle values copied in and out, values of the wrong type rejected.
"""

from __future__ import annotations

import pytest

from statecore.descriptors import ValueStateDescriptor
from statecore.errors import InvalidInputError
from statecore.testing.base import ConformanceBase

__all__ = ["ValueStateConformance"]


class ValueStateConformance(ConformanceBase):
    """``ValueState`` per record: update / value / clear, defaults, value types."""

    def test_value_state(self):
        b = self.new_backend()
        v = b.get_state(ValueStateDescriptor("v", "int64", default=7))
        b.set_current_key(1)
        assert v.value() == 7
        v.update(42)
        assert v.value() == 42
        b.set_current_key(2)
        assert v.value() == 7
        v.update(-(1 << 63))
        assert v.value() == -(1 << 63)
        b.set_current_key(1)
        assert v.value() == 42
        v.update(None)
        assert v.value() == 7
        v.update(5)
        v.clear()
        assert v.value() == 7
        assert b.num_entries() == 1

    @pytest.mark.parametrize("vt,val", [("float64", 1.25), ("bool", True), ("string", "héllo"),
                                        ("binary", b"\x00\xff"), ("int32", -3),
                                        ("pickle", {"a": [1, 2]})])
    def test_value_types(self, vt, val):
        b = self.new_backend()
        v = b.get_state(ValueStateDescriptor("v", vt))
        b.set_current_key(3)
        assert v.value() is None
        v.update(val)
        assert v.value() == val

    def test_pickle_values_are_copied(self):
        b = self.new_backend()
        v = b.get_state(ValueStateDescriptor("v"))
        b.set_current_key(1)
        obj = [1, 2]
        v.update(obj)
        obj.append(3)
        got = v.value()
        assert got == [1, 2]
        got.append(4)
        assert v.value() == [1, 2]
        d = b.get_state(ValueStateDescriptor("d", default=[]))
        d.value().append(1)
        assert d.value() == []

    def test_value_wrong_type_rejected(self):
        b = self.new_backend()
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        b.set_current_key(1)
        v.update(1)
        for bad in ["x", 1.5, 1 << 63, True]:
            with pytest.raises(InvalidInputError):
                v.update(bad)
        assert v.value() == 1

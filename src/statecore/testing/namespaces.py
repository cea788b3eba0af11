"""Namespace and state registration part of the backend conformance suite (mixed into
:class:`statecore.testing.conformance.BackendConformance`): per-state current namespaces of each
namespace type, and ``get_state`` refusing a descriptor that conflicts with the one registered
under the same name (StateMigrationError).
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from statecore.descriptors import ListStateDescriptor, ValueStateDescriptor
from statecore.errors import InvalidInputError, StateMigrationError
from statecore.testing.base import ConformanceBase

__all__ = ["NamespaceConformance"]


class NamespaceConformance(ConformanceBase):
    """Per-record namespaces and conflicting state registrations."""

    def test_namespaces(self):
        b = self.new_backend()
        v = b.get_state(ValueStateDescriptor("v", "int64"), namespace_type="int64")
        w = b.get_state(ValueStateDescriptor("w", "string"), namespace_type="string")
        b.set_current_key(1)
        with pytest.raises(InvalidInputError):
            v.value()
        v.set_current_namespace(10)
        v.update(1)
        v.set_current_namespace(20)
        assert v.value() is None
        v.update(2)
        v.set_current_namespace(10)
        assert v.value() == 1
        with pytest.raises(InvalidInputError):
            v.set_current_namespace("x")
        assert v.current_namespace == 10
        w.set_current_namespace("")
        w.update("e")
        w.set_current_namespace("a")
        assert w.value() is None
        assert b.num_entries() == 3
        void = b.get_state(ValueStateDescriptor("void"))
        with pytest.raises(InvalidInputError):
            void.set_current_namespace(1)
        void.set_current_namespace(None)

    def test_state_registration_conflicts(self):
        b = self.new_backend()
        b.get_state(ValueStateDescriptor("x", "int64"))
        with pytest.raises(StateMigrationError):
            b.get_state(ListStateDescriptor("x", "int64"))
        with pytest.raises(StateMigrationError):
            b.get_state(ValueStateDescriptor("x", "string"))
        with pytest.raises(StateMigrationError):
            b.get_state(ValueStateDescriptor("x", "int64"), namespace_type="int64")
        again = b.get_state(ValueStateDescriptor("x", "int64"))
        b.set_current_key(1)
        again.update(3)
        assert b.get_state(ValueStateDescriptor("x", pa.int64())).value() == 3
        with pytest.raises(InvalidInputError):
            b.get_state(ValueStateDescriptor("y"), namespace_type="float64")

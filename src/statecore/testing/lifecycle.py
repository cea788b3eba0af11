"""Life cycle part of the backend conformance suite (mixed into
:class:`statecore.testing.conformance.BackendConformance`): ``close`` is idempotent, and a closed
backend and its state objects raise StateError.
"""

from __future__ import annotations

import pytest

from statecore.descriptors import ValueStateDescriptor
from statecore.errors import StateError
from statecore.testing.base import ConformanceBase

__all__ = ["LifecycleConformance"]


class LifecycleConformance(ConformanceBase):
    """``KeyedStateBackend.close`` and what a closed backend refuses."""

    def test_close(self):
        b = self.new_backend()
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        b.set_current_key(1)
        v.update(1)
        b.close()
        b.close()
        with pytest.raises(StateError):
            b.set_current_key(1)

    def test_closed_backend_rejects_state_access(self):
        b = self.new_backend()
        v = b.get_state(ValueStateDescriptor("v", "int64"))
        b.set_current_key(1)
        v.update(1)
        assert v.value() == 1
        b.close()
        with pytest.raises(StateError):
            v.value()
        with pytest.raises(StateError):
            v.update(2)

"""Life cycle part of the backend conformance suite (mixed into
:class:`statecore.testing.conformance.BackendConformance`): ``close`` is idempotent, and a closed
backend and its state objects raise StateError, per record and per batch.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from statecore.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from statecore.errors import StateError
from statecore.testing.base import ConformanceBase
from statecore.testing.helpers import AverageAggregate

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

    def test_closed_backend_rejects_batch_calls(self):
        b = self.new_backend()
        ints = pa.array([1, 2], pa.int64())
        value = b.get_state(ValueStateDescriptor("value", "int64"))
        listed = b.get_state(ListStateDescriptor("list", "int64"))
        mapped = b.get_state(MapStateDescriptor("map", "int64", "int64"))
        summed = b.get_state(ReducingStateDescriptor("sum", "sum", "int64"))
        reduced = b.get_state(ReducingStateDescriptor("custom", lambda x, y: x + y, "int64"))
        averaged = b.get_state(AggregatingStateDescriptor("avg", AverageAggregate(), "pickle"))
        value.put_batch(ints, ints)
        calls = {
            "value.get_batch": lambda: value.get_batch(ints),
            "value.put_batch": lambda: value.put_batch(ints, ints),
            "value.contains_batch": lambda: value.contains_batch(ints),
            "value.clear_batch": lambda: value.clear_batch(ints),
            "list.append_batch": lambda: listed.append_batch(ints, ints),
            "list.get_batch": lambda: listed.get_batch(ints),
            "list.clear_batch": lambda: listed.clear_batch(ints),
            "map.put_batch": lambda: mapped.put_batch(ints, ints, ints),
            "map.get_batch": lambda: mapped.get_batch(ints, ints),
            "map.contains_batch": lambda: mapped.contains_batch(ints, ints),
            "map.remove_batch": lambda: mapped.remove_batch(ints, ints),
            "map.clear_batch": lambda: mapped.clear_batch(ints),
            "reducing.add_batch": lambda: summed.add_batch(ints, ints),
            "reducing.get_batch": lambda: summed.get_batch(ints),
            "reducing.clear_batch": lambda: summed.clear_batch(ints),
            "custom reducer add_batch": lambda: reduced.add_batch(ints, ints),
            "aggregating.add_batch": lambda: averaged.add_batch(ints, ints),
            "aggregating.get_batch": lambda: averaged.get_batch(ints),
            "aggregating.clear_batch": lambda: averaged.clear_batch(ints),
        }
        b.close()
        accepted = []
        for name, call in calls.items():
            try:
                call()
            except StateError:
                continue
            accepted.append(name)
        assert not accepted, f"batch calls a closed backend accepted: {accepted}"

"""Life cycle part of the backend conformance suite (mixed into
:class:`statecore.testing.conformance.BackendConformance`): ``dispose`` (Flink
``KeyedStateBackend.dispose``; ``close`` is its alias) is idempotent, and a disposed backend, its
state objects (per record and per batch) and its timers raise StateError.
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


def _accepted(calls: dict) -> list:
    """Names of the ``calls`` (name -> zero-argument callable) that did not raise StateError."""
    accepted = []
    for name, call in calls.items():
        try:
            call()
        except StateError:
            continue
        accepted.append(name)
    return accepted


class LifecycleConformance(ConformanceBase):
    """``KeyedStateBackend.dispose`` / ``close`` and what a disposed backend refuses."""

    def test_dispose_and_close_alias(self):
        for how in ("dispose", "close"):
            b = self.new_backend()
            assert not b.disposed
            getattr(b, how)()
            assert b.disposed
            b.dispose()
            b.close()
            with pytest.raises(StateError, match="disposed"):
                b.get_state(ValueStateDescriptor("v", "int64"))

    def test_disposed_backend_rejects_every_timer_call(self):
        """Both domains: event time and processing time."""
        b = self.new_backend(timer_namespace_type="int64")
        t = b.timers
        b.set_current_key(1)
        t.register_event_time_timer(10, namespace=0)
        t.register_processing_time_timer(10, namespace=0)
        ints = pa.array([1, 2], pa.int64())
        pt = "processing_time"
        calls = {
            "register_event_time_timer": lambda: t.register_event_time_timer(20, namespace=0),
            "delete_event_time_timer": lambda: t.delete_event_time_timer(10, namespace=0),
            "register_batch": lambda: t.register_batch(ints, ints, 0),
            "delete_batch": lambda: t.delete_batch(ints, ints, 0),
            "list_event_time_timers": t.list_event_time_timers,
            "all_timers": t.all_timers,
            "advance_watermark": lambda: t.advance_watermark(100),
            "num_timers": t.num_timers,
            "num_bytes": t.num_bytes,
            "register_processing_time_timer":
                lambda: t.register_processing_time_timer(20, namespace=0),
            "delete_processing_time_timer":
                lambda: t.delete_processing_time_timer(10, namespace=0),
            "register_batch(processing_time)": lambda: t.register_batch(ints, ints, 0, domain=pt),
            "delete_batch(processing_time)": lambda: t.delete_batch(ints, ints, 0, domain=pt),
            "list_processing_time_timers": t.list_processing_time_timers,
            "all_processing_time_timers": t.all_processing_time_timers,
            "advance_processing_time": lambda: t.advance_processing_time(100),
        }
        b.dispose()
        accepted = _accepted(calls)
        assert not accepted, f"timer calls a disposed backend accepted: {accepted}"

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
        accepted = _accepted(calls)
        assert not accepted, f"batch calls a closed backend accepted: {accepted}"

"""Timer part of the backend conformance suite (mixed into
:class:`statecore.testing.conformance.BackendConformance`): event-time and processing-time timers
per record and by batch -- registration (duplicates once), deletion, firing order (timestamp,
then key group and encoded timer key), times that never go back, the independence of the two
domains, timestamp arrays in ms, validation, snapshot/restore and rescaling of both domains, and
disposal.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from statecore import key_groups as K
from statecore import serializers as S
from statecore.errors import InvalidInputError
from statecore.testing.base import ConformanceBase
from statecore.testing.helpers import snapshot_dump

__all__ = ["TimerConformance"]


class TimerConformance(ConformanceBase):
    """Event-time and processing-time timers of ``backend.timers``."""

    def test_timers(self):
        b = self.new_backend(timer_namespace_type="int64")
        t = b.timers
        keys = list(range(20))
        for k in keys:
            b.set_current_key(k)
            t.register_event_time_timer(100, namespace=0)
            t.register_event_time_timer(100, namespace=0)  # duplicate: registered once
            t.register_event_time_timer(50 + k, namespace=1)
        assert t.num_timers() == 40
        b.set_current_key(3)
        assert t.list_event_time_timers() == [(53, 1), (100, 0)]
        t.delete_event_time_timer(53, namespace=1)
        t.delete_event_time_timer(999, namespace=1)  # absent: no-op
        assert t.advance_watermark(49) == []
        fired = t.advance_watermark(60)
        assert [(ts, k, ns) for ts, k, ns in fired] == [(50 + k, k, 1) for k in range(11) if k != 3]
        fired = t.advance_watermark(100)
        assert [(ts, k) for ts, k, _ in fired[:9]] == [(50 + k, k) for k in range(11, 20)]
        ties = fired[9:]
        assert len(ties) == 20 and all(ts == 100 and ns == 0 for ts, _, ns in ties)

        def tie_order(k):
            kg = K.spark_key_group(k, "int64", 128)
            return kg, S.encode_timer_key(kg, 128, 100, k, "int64", 0, "int64")

        assert [k for _, k, _ in ties] == sorted(keys, key=tie_order)
        assert t.num_timers() == 0
        assert t.advance_watermark(10_000) == []
        b.set_current_key(1)
        t.register_event_time_timer(-5, namespace=0)
        # the watermark never goes back: a lower value still fires what is behind 10_000
        assert t.advance_watermark(50) == [(-5, 1, 0)]
        assert t.current_watermark == 10_000

    def test_timer_batch_equals_the_rows_one_at_a_time(self):
        batched = self.new_backend(timer_namespace_type="int64")
        single = self.new_backend(timer_namespace_type="int64")
        keys, ts, nss = [1, 2, 1, 3, 1], [100, 50, 100, 70, 40], [0, 0, 0, 1, 2]
        batched.timers.register_batch(pa.array(keys, pa.int64()), pa.array(ts, pa.int64()),
                                      namespaces=pa.array(nss, pa.int64()))
        batched.timers.delete_batch(pa.array([3]), pa.array([70]), namespaces=1)
        for k, t, ns in zip(keys, ts, nss):
            single.set_current_key(k)
            single.timers.register_event_time_timer(t, namespace=ns)
        single.set_current_key(3)
        single.timers.delete_event_time_timer(70, namespace=1)
        assert batched.current_key is None  # the batch did not set a current key
        assert batched.timers.all_timers() == single.timers.all_timers()
        assert batched.timers.num_timers() == 3
        # Timestamp arrays are taken in ms, finer units floored.
        b = self.new_backend()
        b.timers.register_batch(pa.array([1, 2]), pa.array([1_500, -1], pa.int64()).cast(
            pa.timestamp("us", tz="UTC")))
        assert [ts for _, ts, _, _ in b.timers.all_timers()] == [-1, 1]
        b.timers.delete_batch(pa.array([1, 2]), pa.array([1, -1], pa.int64()))
        assert b.timers.num_timers() == 0

    def test_timer_ordering_and_validation(self):
        b = self.new_backend()
        t = b.timers
        with pytest.raises(InvalidInputError):
            t.register_event_time_timer(5)  # no current key
        b.set_current_key(1)
        for bad in [1.5, None, "1", 1 << 63]:
            with pytest.raises(InvalidInputError):
                t.register_event_time_timer(bad)
        with pytest.raises(InvalidInputError):
            t.register_event_time_timer(1, namespace=3)  # void timer namespace
        for ts in [30, -10, 20, 10]:
            t.register_event_time_timer(ts)
        t.delete_event_time_timer(20)
        t.register_event_time_timer(20)
        t.delete_event_time_timer(20)
        assert t.advance_watermark(25) == [(-10, 1, None), (10, 1, None)]
        t.register_event_time_timer(5)  # behind the watermark: fires at the next advance
        assert t.advance_watermark(25) == [(5, 1, None)]
        assert t.advance_watermark(30) == [(30, 1, None)]
        with pytest.raises(InvalidInputError):
            t.advance_watermark("x")

    def test_processing_time_timers(self):
        b = self.new_backend(timer_namespace_type="int64")
        t = b.timers
        assert t.current_processing_time == -(1 << 63)
        for k in range(20):
            b.set_current_key(k)
            t.register_processing_time_timer(100, namespace=0)
            t.register_processing_time_timer(100, namespace=0)  # duplicate: registered once
            t.register_processing_time_timer(50 + k, namespace=1)
            t.register_event_time_timer(50 + k, namespace=1)  # same time, the other domain
        assert t.num_timers() == 60
        b.set_current_key(3)
        assert t.list_processing_time_timers() == [(53, 1), (100, 0)]
        assert t.list_event_time_timers() == [(53, 1)]
        t.delete_processing_time_timer(53, namespace=1)
        t.delete_processing_time_timer(999, namespace=1)  # absent: no-op
        assert t.list_event_time_timers() == [(53, 1)]  # the event-time twin stays
        assert t.advance_processing_time(49) == []
        fired = t.advance_processing_time(60)
        assert fired == [(50 + k, k, 1) for k in range(11) if k != 3]
        # The domains are independent: neither clock fires the other's timers.
        assert t.current_watermark == -(1 << 63)
        assert len(t.all_timers()) == 20
        assert [ts for ts, _, _ in t.advance_watermark(52)] == [50, 51, 52]
        assert t.current_processing_time == 60
        fired = t.advance_processing_time(100)
        assert [(ts, k) for ts, k, _ in fired[:9]] == [(50 + k, k) for k in range(11, 20)]
        ties = fired[9:]

        def tie_order(k):
            kg = K.spark_key_group(k, "int64", 128)
            return kg, S.encode_timer_key(kg, 128, 100, k, "int64", 0, "int64",
                                          processing_time=True)

        assert [k for _, k, _ in ties] == sorted(range(20), key=tie_order)
        assert t.all_processing_time_timers() == []
        assert t.num_timers() == 17  # event-time timers at 53..69
        b.set_current_key(1)
        t.register_processing_time_timer(-5, namespace=0)
        # processing time never goes back: a lower value still fires what is behind 100
        assert t.advance_processing_time(50) == [(-5, 1, 0)]
        assert t.current_processing_time == 100
        for bad in ["x", 1.5, None, True, 1 << 63]:
            with pytest.raises(InvalidInputError):
                t.advance_processing_time(bad)
            with pytest.raises(InvalidInputError):
                t.register_processing_time_timer(bad)
        with pytest.raises(InvalidInputError):
            t.register_processing_time_timer(1, namespace="a")  # int64 namespace
        assert t.current_processing_time == 100 and t.num_timers() == 17

    def test_processing_time_timer_batch_equals_the_rows_one_at_a_time(self):
        batched = self.new_backend(timer_namespace_type="int64")
        single = self.new_backend(timer_namespace_type="int64")
        keys, ts, nss = [1, 2, 1, 3, 1], [100, 50, 100, 70, 40], [0, 0, 0, 1, 2]
        bt = batched.timers
        bt.register_batch(pa.array(keys, pa.int64()), pa.array(ts, pa.int64()),
                          namespaces=pa.array(nss, pa.int64()), domain="processing_time")
        bt.register_batch(pa.array([3]), pa.array([70]), namespaces=1)  # event time (default)
        bt.delete_batch(pa.array([3]), pa.array([70]), namespaces=1, domain="processing_time")
        for k, t, ns in zip(keys, ts, nss):
            single.set_current_key(k)
            single.timers.register_processing_time_timer(t, namespace=ns)
        single.set_current_key(3)
        single.timers.delete_processing_time_timer(70, namespace=1)
        assert batched.current_key is None
        assert bt.all_processing_time_timers() == single.timers.all_processing_time_timers()
        assert bt.all_timers() == [(K.spark_key_group(3, "int64", 128), 70, 3, 1)]
        assert bt.num_timers() == 4
        for bad in ["processing", None, "EVENT_TIME"]:
            with pytest.raises(InvalidInputError):
                bt.register_batch(pa.array([9]), pa.array([1]), namespaces=0, domain=bad)
            with pytest.raises(InvalidInputError):
                bt.delete_batch(pa.array([3]), pa.array([70]), namespaces=1, domain=bad)
        assert bt.num_timers() == 4

    def test_processing_time_timers_snapshot_restore_and_rescale(self):
        b = self.new_backend(timer_namespace_type="int64")
        t = b.timers
        for k in range(40):
            b.set_current_key(k)
            t.register_processing_time_timer(1000 + k, namespace=k % 3)
            if k % 2:
                t.register_event_time_timer(1000 + k, namespace=k % 3)
        snap = b.snapshot()
        # One pseudo-state holds both domains; a processing-time key is the event-time key of
        # the same timer plus the marker byte, so event-time keys keep their earlier layout.
        stored = {kb for rows in snapshot_dump(snap)["__timers__"].values() for kb, _ in rows}
        assert len(stored) == 60
        for k in range(40):
            kg = K.spark_key_group(k, "int64", 128)
            ev = S.encode_timer_key(kg, 128, 1000 + k, k, "int64", k % 3, "int64")
            assert ev + S.PROCESSING_TIME_MARKER in stored
            assert (ev in stored) == bool(k % 2)
        whole = self.new_backend(timer_namespace_type="int64")
        whole.restore(snap)
        assert whole.timers.all_processing_time_timers() == t.all_processing_time_timers()
        assert whole.timers.all_timers() == t.all_timers()
        # Rescaled: each half of the key groups takes exactly its timers of both domains.
        halves = [self.new_backend(timer_namespace_type="int64", key_group_range=r)
                  for r in ((0, 63), (64, 127))]
        for h in halves:
            h.restore(snap)
        for h, (lo, hi) in zip(halves, ((0, 63), (64, 127))):
            assert h.timers.all_processing_time_timers() == [
                x for x in t.all_processing_time_timers() if lo <= x[0] <= hi]
            assert h.timers.all_timers() == [x for x in t.all_timers() if lo <= x[0] <= hi]
        fired = sorted(x for h in halves for x in h.timers.advance_processing_time(1019))
        assert fired == [(1000 + k, k, k % 3) for k in range(20)]
        assert all(h.timers.advance_watermark(999) == [] for h in halves)
        assert sum(h.timers.num_timers() for h in halves) == 40

"""Conformance tests of state TTL rules every backend must follow, mixed into
:class:`statecore.testing.conformance.BackendConformance`.

A batch call on a TTL state does what its rows one at a time do. Incremental cleanup
(``cleanup_incrementally``) counts one state access per batch row and runs its step before
the row, so row i sees the table after the steps of rows 0..i and the writes of rows 0..i-1
-- each step stops at the end of a pass over the table, the next one starts a new pass -- and
a batch leaves the same entries, outputs and ``ttl_statistics()`` behind as the same rows read
or written through ``set_current_key`` and the per-record calls (under
``ReturnExpiredIfNotCleanedUp`` a row reads the stale value of an expired key the steps of
the earlier rows have not reached yet).

A processing-time clock reading outside int64 (timestamps are stored as int64) is refused with
InvalidInputError by the read or write that asks for it, the state unchanged.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from statecore.descriptors import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from statecore.errors import InvalidInputError
from statecore.testing.base import ConformanceBase
from statecore.testing.helpers import dump_backend
from statecore.ttl import ManualClock, StateTtlConfig

_EXPIRED = 1000  # keys written at time 0, expired at the time of the reads
_LIVE = 5000  # the one key written later, alive at the time of the reads
_ROWS = 300  # 300 rows x 5 entries per step > one pass over the table


def _filled(conformance, kind: str, visibility: str):
    """A backend with ``_EXPIRED`` expired entries and one live one (key ``_LIVE``) in state
    ``s`` (a value or a map state, TTL 100 ms, incremental cleanup of 5 entries per access);
    the writes moved the cleanup cursor into the middle of the table. Returns
    ``(backend, state, clock)`` with the clock at 120 ms."""
    clock = ManualClock(0)
    b = conformance.new_backend(ttl_clock=clock)
    cfg = StateTtlConfig(100, state_visibility=visibility, cleanup_incrementally=5)
    if kind == "value":
        d = ValueStateDescriptor("s", "int64")
    else:
        d = MapStateDescriptor("s", "int64", "int64")
    d.enable_time_to_live(cfg)
    s = b.get_state(d)

    def write(key, v):
        b.set_current_key(key)
        if kind == "value":
            s.update(v)
        else:
            s.put(1, v)

    for k in range(_EXPIRED):
        write(k, k)
    clock.set(50)
    write(_LIVE, 7)
    clock.set(120)
    return b, s, clock


def _per_record(b, s, kind: str, op: str, keys: list) -> list:
    out = []
    for i, k in enumerate(keys):
        b.set_current_key(k)
        if op == "put":
            s.update(i) if kind == "value" else s.put(1, i)
        elif kind == "value":
            out.append(s.value())
        else:
            out.append(s.get(1))
    return out


def _batch(s, kind: str, op: str, keys: list) -> list:
    ka = pa.array(keys, pa.int64())
    if op == "put":
        vals = pa.array(range(len(keys)), pa.int64())
        if kind == "value":
            s.put_batch(ka, vals)
        else:
            s.put_batch(ka, pa.array([1] * len(keys), pa.int64()), vals)
        return []
    if kind == "value":
        return s.get_batch(ka).to_pylist()
    return s.get_batch(ka, pa.array([1] * len(keys), pa.int64())).to_pylist()


class TtlConformance(ConformanceBase):
    """TTL: batch calls equal their rows one at a time (incremental cleanup included); clock
    readings outside int64 are refused."""

    @pytest.mark.parametrize("kind", ["value", "map"])
    @pytest.mark.parametrize("op", ["get", "put"])
    @pytest.mark.parametrize("visibility",
                             ["NeverReturnExpired", "ReturnExpiredIfNotCleanedUp"])
    def test_batch_incremental_cleanup_equals_rows(self, kind, op, visibility):
        # Reads: the live key and expired ones, some met by a row before a step reaches them.
        keys = ([_LIVE if i % 3 == 0 else (i * 337) % _EXPIRED for i in range(_ROWS)]
                if op == "get" else [_LIVE + 1 + i % 7 for i in range(_ROWS)])
        runs = []
        for one_by_one in (True, False):
            b, s, _ = _filled(self, kind, visibility)
            out = (_per_record(b, s, kind, op, keys) if one_by_one
                   else _batch(s, kind, op, keys))
            runs.append((out, b.ttl_statistics(), dump_backend(b)))
            b.close()
        assert runs[0][1] == runs[1][1]
        assert runs[0][0] == runs[1][0]
        assert runs[0][2] == runs[1][2]
        # 300 steps of 5 entries reach every entry: only what the rows wrote is left, each
        # expired entry removed by a step or by the row that read it.
        assert runs[0][1]["incremental"] + runs[0][1]["read"] == _EXPIRED
        if op == "get":
            assert 0 < runs[0][1]["read"] < _ROWS
            stale = [v for k, v in zip(keys, runs[0][0]) if k != _LIVE and v is not None]
            assert bool(stale) == (visibility == "ReturnExpiredIfNotCleanedUp")

    @pytest.mark.parametrize("reading", [2**63, -(2**63) - 1, 10**30])
    @pytest.mark.parametrize("cleanup", [None, 5])
    def test_clock_outside_int64_is_refused(self, reading, cleanup):
        clock = ManualClock(0)
        b = self.new_backend(ttl_clock=clock)
        cfg = StateTtlConfig(100, cleanup_incrementally=cleanup)
        states = {}
        for name, d in (("v", ValueStateDescriptor("v", "int64")),
                        ("l", ListStateDescriptor("l", "int64")),
                        ("m", MapStateDescriptor("m", "int64", "int64"))):
            d.enable_time_to_live(cfg)
            states[name] = b.get_state(d)
        b.set_current_key(1)
        states["v"].update(1)
        states["l"].add(1)
        states["m"].put(1, 1)
        before = dump_backend(b)
        clock.set(reading)
        keys = pa.array([1, 2], pa.int64())
        writes = [lambda: states["v"].update(2), lambda: states["l"].add(2),
                  lambda: states["m"].put(2, 2), lambda: states["v"].value(),
                  lambda: states["v"].put_batch(keys, pa.array([3, 4], pa.int64())),
                  lambda: states["v"].get_batch(keys)]
        for w in writes:
            b.set_current_key(1)
            with pytest.raises(InvalidInputError, match=str(reading)):
                w()
        clock.set(50)
        assert dump_backend(b) == before  # and the snapshot succeeds
        b.set_current_key(1)
        states["v"].update(5)
        assert states["v"].value() == 5

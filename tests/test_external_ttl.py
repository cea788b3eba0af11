"""TTL expiry in the external stores (statecore.external), against a real redis-server and a
real PostgreSQL server: each commit removes the expired entries of the key groups its logs ask
to sweep (the Redis commit script, a DELETE in the PostgreSQL commit transaction), also of key
groups no task ever read, never an entry not expired by the pre-committing task's clock, never
before the epoch commits; and the outside readers never return an expired value."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest

from statecore.backends import create_backend
from statecore.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from statecore.errors import InvalidInputError
from statecore.external import commit_epoch, read_committed
from statecore.ttl import INT64_MIN, ManualClock, StateTtlConfig
from support.postgres_server import shared_postgres_server  # noqa: F401  (fixture)
from support.redis_server import shared_redis_server  # noqa: F401  (fixture)

_namespaces = itertools.count()
_TTL = StateTtlConfig(100)
_VALUE = ValueStateDescriptor("v", "int64").enable_time_to_live(_TTL)
_MAP = MapStateDescriptor("m", "int64", "int64").enable_time_to_live(_TTL)
_LIST = ListStateDescriptor("l", "int64").enable_time_to_live(_TTL)
_KEYS = list(range(100))


@pytest.fixture(params=["redis", "postgres"])
def store(request):
    """(backend kind, URL) of a running server of each store."""
    server = "shared_redis_server" if request.param == "redis" else "shared_postgres_server"
    return request.param, request.getfixturevalue(server).url


def _open(store, namespace, clock, **kw):
    kind, url = store
    return create_backend(kind, url=url, namespace=namespace, key_type="int64",
                          max_parallelism=16, cache="native", ttl_clock=clock, **kw)


def _stored(store, namespace, state, key_group_range=None) -> list:
    """The keys of every entry of ``state`` in the store, expired or not (read as of before
    any time: nothing has expired then)."""
    t = read_committed(store[1], namespace, state, key_group_range, now_ms=INT64_MIN).table
    return sorted(set(t.column("key").to_pylist()))


def _ints(xs):
    return pa.array(list(xs), pa.int64())


def _commit(store, b, epoch):
    commit_epoch(store[1], b.namespace, epoch, [b.pre_commit(epoch)])
    b.notify_committed(epoch)


def test_commits_remove_expired_entries_never_live_ones(store):
    ns = f"ttl/{next(_namespaces)}"
    clock = ManualClock(1000)
    b = _open(store, ns, clock)
    v, m = b.get_state(_VALUE), b.get_state(_MAP)
    v.put_batch(_ints(_KEYS), _ints(_KEYS))
    m.put_batch(_ints(_KEYS), _ints([1] * 100), _ints(_KEYS))
    _commit(store, b, 1)
    clock.set(1050)
    v.put_batch(_ints(_KEYS[:10]), _ints(_KEYS[:10]))  # renewed: stamped 1050
    _commit(store, b, 2)
    assert _stored(store, ns, "v") == _KEYS
    b.dispose()
    # A new task that reads nothing: its commits sweep key groups it never read. At 1099
    # nothing is expired yet (ts + ttl <= now: 1000 + 100 > 1099).
    later = ManualClock(1099)
    t = _open(store, ns, later)
    t.get_state(_VALUE)
    t.get_state(_MAP)
    _commit(store, t, 3)
    assert _stored(store, ns, "v") == _KEYS and _stored(store, ns, "m") == _KEYS
    later.set(1100)
    wal = t.pre_commit(4)
    assert _stored(store, ns, "v") == _KEYS  # nothing leaves before the epoch commits
    commit_epoch(store[1], ns, 4, [wal])
    t.notify_committed(4)
    assert _stored(store, ns, "v") == _KEYS[:10]
    assert _stored(store, ns, "m") == []  # written at 1000 only
    assert t.loaded_key_groups == frozenset()
    later.set(1149)
    _commit(store, t, 5)
    assert _stored(store, ns, "v") == _KEYS[:10]
    later.set(1150)
    _commit(store, t, 6)
    assert _stored(store, ns, "v") == []
    t.dispose()


def test_each_commit_sweeps_the_next_key_groups(store):
    ns = f"ttl/{next(_namespaces)}"
    clock = ManualClock(1000)
    b = _open(store, ns, clock, ttl_sweep_key_groups=4)
    v = b.get_state(_VALUE)
    v.put_batch(_ints(_KEYS), _ints(_KEYS))
    _commit(store, b, 1)  # sweeps key groups 0..3: nothing expired yet
    clock.set(2000)
    for i, epoch in enumerate((2, 3, 4, 5)):
        _commit(store, b, epoch)  # key groups 4..7, 8..11, 12..15, then 0..3
        swept = [(4 + 4 * j) % 16 for j in range(i + 1)]
        for start in range(0, 16, 4):
            left = _stored(store, ns, "v", (start, start + 3))
            assert (left == []) == (start in swept), (epoch, start)
    off = _open(store, f"ttl/{next(_namespaces)}", clock, ttl_sweep_key_groups=0)
    off.get_state(_VALUE).put_batch(_ints(_KEYS), _ints(_KEYS))
    _commit(store, off, 1)
    clock.set(5000)
    _commit(store, off, 2)
    assert _stored(store, off.namespace, "v") == _KEYS
    # A pre-commit that asks for no sweep (the Spark operator's end-of-input flush) removes
    # nothing; the next one sweeps again.
    skip = _open(store, f"ttl/{next(_namespaces)}", clock, ttl_sweep_key_groups=16)
    skip.get_state(_VALUE).put_batch(_ints(_KEYS), _ints(_KEYS))
    _commit(store, skip, 1)
    clock.set(9000)
    commit_epoch(store[1], skip.namespace, 2, [skip.pre_commit(2, sweep_ttl=False)])
    assert _stored(store, skip.namespace, "v") == _KEYS
    _commit(store, skip, 3)
    assert _stored(store, skip.namespace, "v") == []
    b.dispose()
    off.dispose()
    skip.dispose()


def test_readers_never_return_expired_values(store):
    ns = f"ttl/{next(_namespaces)}"
    clock = ManualClock(1000)
    b = _open(store, ns, clock, ttl_sweep_key_groups=0)
    v, li = b.get_state(_VALUE), b.get_state(_LIST)
    v.put_batch(_ints([1, 2, 3]), _ints([10, 20, 30]))
    b.set_current_key(5)
    li.add_all([1, 2])
    clock.set(1060)
    v.put_batch(_ints([2]), _ints([21]))
    b.set_current_key(5)
    li.add(3)
    _commit(store, b, 1)
    url = store[1]
    at = {now: read_committed(url, ns, "v", now_ms=now).table.to_pydict()
          for now in (1099, 1100, 1160)}
    assert sorted(at[1099]["key"]) == [1, 2, 3]
    assert list(zip(at[1100]["key"], at[1100]["value"])) == [(2, 21)]
    assert at[1160]["key"] == []
    # A list's elements expire one by one; positions count the elements left.
    lst = read_committed(url, ns, "l", now_ms=1100).table.to_pydict()
    assert list(zip(lst["key"], lst["user_key"], lst["value"])) == [(5, 0, 3)]
    # Without now_ms, processing-time TTL expires by the wall clock (the default ttl_clock):
    # ManualClock's times lie long before it.
    assert read_committed(url, ns, "v").table.num_rows == 0
    with pytest.raises(InvalidInputError, match="now_ms"):
        read_committed(url, ns, "v", now_ms=1.5)
    b.dispose()


def test_event_time_ttl_sweeps_by_the_watermark_and_readers_need_it(store):
    ns = f"ttl/{next(_namespaces)}"
    d = ValueStateDescriptor("e", "int64").enable_time_to_live(
        StateTtlConfig(100, time_characteristic="event_time"))
    b = _open(store, ns, ManualClock(0), ttl_sweep_key_groups=16)
    e = b.get_state(d)
    e.put_batch(_ints(_KEYS[:50]), _ints(_KEYS[:50]))  # before any watermark: INT64_MIN
    _commit(store, b, 1)
    b.observe_watermark(5000)
    e.put_batch(_ints(_KEYS[50:]), _ints(_KEYS[50:]))  # stamped 5000
    _commit(store, b, 2)
    with pytest.raises(InvalidInputError, match="event-time TTL: pass now_ms"):
        read_committed(store[1], ns, "e")
    assert read_committed(store[1], ns, "e", now_ms=5099).table.num_rows == 100
    b.observe_watermark(5100)
    _commit(store, b, 3)
    assert _stored(store, ns, "e") == []
    assert read_committed(store[1], ns, "e", now_ms=5100).table.num_rows == 0
    b.dispose()

"""The bounded cache in front of the external stores (statecore.external.cached), against a
real redis-server and a real PostgreSQL server: clean key groups are evicted past the bound and
read through again, dirty ones (the epoch's write buffer, a log not known committed) never; an
evicted key group read again shows the committed updates and deletions; timers outlive
eviction; and a seeded hypothesis run compares a backend with a one-entry cache with an
unbounded one operation by operation, through commits and aborts."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statecore.backends import create_backend
from statecore.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from statecore.errors import InvalidInputError
from statecore.external import abort_epoch, commit_epoch
from support.postgres_server import shared_postgres_server  # noqa: F401  (fixture)
from support.redis_server import shared_redis_server  # noqa: F401  (fixture)

_namespaces = itertools.count()
_VALUE = ValueStateDescriptor("v", "int64")
_MAP = MapStateDescriptor("m", "int64", "string")
_LIST = ListStateDescriptor("l", "int64")


def _open(url, kind="redis", namespace=None, **kw):
    kw.setdefault("key_type", "int64")
    kw.setdefault("max_parallelism", 16)
    return create_backend(kind, url=url, namespace=namespace or f"c/{next(_namespaces)}", **kw)


def _ints(xs):
    return pa.array(list(xs), pa.int64())


def _commit(url, b, epoch):
    commit_epoch(url, b.namespace, epoch, [b.pre_commit(epoch)])
    b.notify_committed(epoch)


@pytest.fixture(params=["python", "native"])
def cache(request):
    return request.param


def test_dirty_key_groups_stay_until_their_epoch_is_committed(shared_redis_server, cache):  # noqa: F811
    url = shared_redis_server.url
    b = _open(url, cache=cache, cache_entries=1)
    v = b.get_state(_VALUE)
    v.put_batch(_ints(range(200)), _ints(range(200)))
    _commit(url, b, 1)
    b.evict(max_entries=0)
    # One key of each other key group.
    others = list({b.key_group_of(k): k for k in range(200)
                   if b.key_group_of(k) != b.key_group_of(7)}.values())
    b.set_current_key(7)
    v.update(70)
    kg7 = b.key_group_of(7)
    # Reading every other key group through evicts the clean ones, never key 7's: its write is
    # the epoch's write buffer.
    evicted = b.cache_statistics()["evictions"]
    for k in others:
        assert v.get_batch(_ints([k])).to_pylist() == [k]
    assert b.cache_statistics()["evictions"] > evicted
    assert kg7 in b.loaded_key_groups
    wal = b.pre_commit(2)
    for k in others:
        assert v.get_batch(_ints([k])).to_pylist() == [k]
    assert kg7 in b.loaded_key_groups  # in a log not committed yet
    b.set_current_key(others[0])
    commit_epoch(url, b.namespace, 2, [wal])
    b.notify_committed(2)
    assert kg7 not in b.loaded_key_groups  # clean now: the notification evicted it
    read = b.cache_statistics()["key_groups_read"]
    assert v.get_batch(_ints([7])).to_pylist() == [70]
    assert b.cache_statistics()["key_groups_read"] == read + 1
    # The current key's key group stays while other batches read through (per-record calls
    # read it without a read-through).
    b.set_current_key(7)
    for k in others:
        assert v.get_batch(_ints([k])).to_pylist() == [k]
    assert v.value() == 70
    b.dispose()


def test_evicted_key_groups_read_back_updates_and_deletions(shared_redis_server, cache):  # noqa: F811
    url = shared_redis_server.url
    b = _open(url, cache=cache, cache_entries=1)
    v, m, li = b.get_state(_VALUE), b.get_state(_MAP), b.get_state(_LIST)
    keys = list(range(40))
    v.put_batch(_ints(keys), _ints(keys))
    for k in keys:
        b.set_current_key(k)
        m.put(k, f"a{k}")
        m.put(k + 100, f"b{k}")
        li.add_all([k, k + 1])
    _commit(url, b, 1)
    v.put_batch(_ints(keys[:20]), _ints([k * 10 for k in keys[:20]]))
    v.clear_batch(_ints(keys[20:30]))
    for k in keys[:10]:
        b.set_current_key(k)
        m.remove(k)
        li.update([k * 3])
    _commit(url, b, 2)
    b.evict(max_entries=0)
    assert b.loaded_key_groups <= {b.current_key_group}
    want = [k * 10 for k in keys[:20]] + [None] * 10 + keys[30:]
    assert v.get_batch(_ints(keys)).to_pylist() == want
    for k in keys:
        b.set_current_key(k)
        assert dict(m.items()) == ({k + 100: f"b{k}"} if k < 10 else
                                   {k: f"a{k}", k + 100: f"b{k}"})
        assert li.get() == ([k * 3] if k < 10 else [k, k + 1])
    # The read-through brought back exactly the committed state: nothing more to write.
    _commit(url, b, 3)
    fresh = _open(url, cache=cache, namespace=b.namespace, cache_entries=None)
    assert fresh.get_state(_VALUE).get_batch(_ints(keys)).to_pylist() == want
    b.dispose()
    fresh.dispose()


def test_timers_outlive_eviction(shared_redis_server, cache):  # noqa: F811
    url = shared_redis_server.url
    b = _open(url, cache=cache, cache_entries=1)
    v = b.get_state(_VALUE)
    for k in range(10):
        b.set_current_key(k)
        v.update(k)
        b.timers.register_event_time_timer(100 + k)
    _commit(url, b, 1)
    b.evict(max_entries=0)
    b.set_current_key(3)
    b.timers.delete_event_time_timer(103)
    _commit(url, b, 2)
    b.evict(max_entries=0)
    fired = b.timers.advance_watermark(200)
    assert sorted(ts for ts, *_ in fired) == [100 + k for k in range(10) if k != 3]
    fresh = _open(url, cache=cache, namespace=b.namespace)
    assert len(fresh.timers.all_timers()) == 9
    b.dispose()
    fresh.dispose()


def test_cache_entries_must_be_a_positive_int(shared_redis_server):  # noqa: F811
    for bad in (0, -1, True, 1.5, "10"):
        with pytest.raises(InvalidInputError, match="cache_entries"):
            _open(shared_redis_server.url, cache_entries=bad)
    b = _open(shared_redis_server.url, cache_entries=None)
    stats = b.cache_statistics()
    assert stats["max_entries"] is None and stats["evictions"] == 0
    b.dispose()


_KEYS = st.integers(0, 39)
_OPS = st.one_of(
    st.tuples(st.just("put"), _KEYS, st.integers(-5, 5)),
    st.tuples(st.just("get"), _KEYS),
    st.tuples(st.just("map_put"), _KEYS, st.integers(0, 3), st.text("ab", max_size=3)),
    st.tuples(st.just("map_remove"), _KEYS, st.integers(0, 3)),
    st.tuples(st.just("list_add"), _KEYS, st.integers(0, 9)),
    st.tuples(st.just("read"), _KEYS),
    st.tuples(st.just("put_batch"), st.lists(_KEYS, min_size=1, max_size=6),
              st.integers(0, 9)),
    st.tuples(st.just("get_batch"), st.lists(_KEYS, min_size=1, max_size=6)),
    st.tuples(st.just("clear_batch"), st.lists(_KEYS, min_size=1, max_size=4)),
    st.tuples(st.just("again")),
    st.tuples(st.just("pre_commit")),
    st.tuples(st.just("commit")),
    st.tuples(st.just("abort")),
)


def _run(url, b, ops) -> list:
    """Apply ``ops`` to ``b`` (pre-committing, committing and aborting epochs in the store);
    what each read returned, and the committed values at the end."""
    out = []
    pending = None  # (epoch, log) pre-committed and not committed yet
    for op in ops:
        v, m, li = b.get_state(_VALUE), b.get_state(_MAP), b.get_state(_LIST)
        kind = op[0]
        if kind in ("put", "get", "map_put", "map_remove", "list_add", "read"):
            b.set_current_key(op[1])
        if kind == "put":
            v.update(op[2])
        elif kind == "get":
            out.append(v.value())
        elif kind == "map_put":
            m.put(op[2], op[3])
        elif kind == "map_remove":
            m.remove(op[2])
        elif kind == "list_add":
            li.add(op[2])
        elif kind == "read":
            out.append((v.value(), sorted(m.items()), li.get()))
        elif kind == "again" and b.current_key is not None:
            # The current key's value again, after whatever read through since it was set.
            out.append((v.value(), sorted(m.items()), li.get()))
        elif kind == "put_batch":
            v.put_batch(_ints(op[1]), _ints([op[2]] * len(op[1])))
        elif kind == "get_batch":
            out.append(v.get_batch(_ints(op[1])).to_pylist())
        elif kind == "clear_batch":
            v.clear_batch(_ints(op[1]))
        elif kind == "pre_commit" and pending is None:
            epoch = (b.committed_epoch or 0) + 1
            pending = (epoch, b.pre_commit(epoch))
        elif kind == "commit":
            if pending is None:
                epoch = (b.committed_epoch or 0) + 1
                pending = (epoch, b.pre_commit(epoch))
            commit_epoch(url, b.namespace, pending[0], [pending[1]])
            b.notify_committed(pending[0])
            pending = None
        elif kind == "abort":
            if pending is None:
                epoch = (b.committed_epoch or 0) + 1
                pending = (epoch, b.pre_commit(epoch))
            abort_epoch(url, b.namespace, pending[0])
            b.abort()
            pending = None
    if pending is not None:
        commit_epoch(url, b.namespace, pending[0], [pending[1]])
        b.notify_committed(pending[0])
    _commit(url, b, (b.committed_epoch or 0) + 1)
    fresh = _open(url, "redis" if url.startswith("redis") else "postgres",
                  namespace=b.namespace, cache="native", cache_entries=None)
    out.append(fresh.get_state(_VALUE).get_batch(_ints(range(40))).to_pylist())
    fresh.dispose()
    return out


def _differential(url, kind, cache):
    evictions = []

    @settings(max_examples=25, derandomize=True, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture,
                                     HealthCheck.too_slow])
    @given(st.lists(_OPS, min_size=10, max_size=40))
    def check(ops):
        bounded = _open(url, kind, cache=cache, cache_entries=1)
        unbounded = _open(url, kind, cache=cache, cache_entries=None)
        try:
            assert _run(url, bounded, ops) == _run(url, unbounded, ops)
            evictions.append(bounded.cache_statistics()["evictions"])
        finally:
            bounded.dispose()
            unbounded.dispose()

    check()
    assert sum(evictions) > 0


def test_bounded_cache_matches_unbounded_redis(shared_redis_server, cache):  # noqa: F811
    _differential(shared_redis_server.url, "redis", cache)


def test_bounded_cache_matches_unbounded_postgres(shared_postgres_server):  # noqa: F811
    _differential(shared_postgres_server.url, "postgres", "native")

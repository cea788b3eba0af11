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


def _raw(store, namespace, state) -> dict:
    """``{(kg, encoded key): stored value bytes}`` of ``state``'s committed entries, straight
    from the store (docs/formats.md "External state in Redis" / "in PostgreSQL")."""
    kind, url = store
    if kind == "redis":
        import redis

        from statecore.external.store import NamespaceKeys

        keys = NamespaceKeys(namespace)
        c = redis.Redis.from_url(url)
        try:
            return {(kg, k): v for kg in range(16)
                    for k, v in c.hgetall(keys.data(kg, state)).items()}
        finally:
            c.close()
    import psycopg

    with psycopg.connect(url) as conn:
        return {(kg, bytes(k)): bytes(v) for kg, k, v in conn.execute(
            "SELECT e.kg, e.key, e.value FROM statecore.entries e JOIN statecore.namespaces n "
            "ON n.id = e.ns WHERE n.name = %s AND e.state = %s AND e.epoch <= n.epoch",
            (namespace, state))}


def _put_raw(store, namespace, state, kg, key: bytes, value: bytes) -> None:
    """Write one committed entry behind the backends' back (a corrupt chunk)."""
    kind, url = store
    if kind == "redis":
        import redis

        from statecore.external.store import NamespaceKeys

        c = redis.Redis.from_url(url)
        try:
            c.hset(NamespaceKeys(namespace).data(kg, state), key, value)
        finally:
            c.close()
        return
    import psycopg

    with psycopg.connect(url) as conn:
        conn.execute(
            "INSERT INTO statecore.entries (ns, kg, state, key, epoch, value) SELECT id, %s, "
            "%s, %s, epoch, %s FROM statecore.namespaces WHERE name = %s",
            (kg, state, key, value, namespace))


_STR_LIST = ListStateDescriptor("s", "string").enable_time_to_live(_TTL)


def test_commits_trim_list_chunks_as_the_compaction_filter_does(store):
    """List chunks swept in the store equal the in-memory backends' compaction filter
    (statecore.ttl.filter_expired) of the committed chunks, element by element: the leading
    expired elements go, a chunk with none left goes, live elements are never touched."""
    from statecore.ttl import filter_expired

    ns = f"ttl/{next(_namespaces)}"
    clock = ManualClock(1000)
    b = _open(store, ns, clock, ttl_sweep_key_groups=16)
    li, st = b.get_state(_LIST), b.get_state(_STR_LIST)
    # Key 1: 40 elements at 1000 (chunk 0 full, chunk 1 with 8), then 10 more at 1050 (chunk 1);
    # key 2: 3 at 1000 and 3 at 1050 in one chunk; key 3: 2 at 1000 only; key 4: 2 at 1050.
    for k, n in ((1, 40), (2, 3), (3, 2)):
        b.set_current_key(k)
        li.add_all(list(range(n)))
        st.add_all([f"s{k}-{i}" * (i + 1) for i in range(n)])  # lengths 3 .. 200+ bytes
    _commit(store, b, 1)
    clock.set(1050)
    for k, n in ((1, 10), (2, 3), (4, 2)):
        b.set_current_key(k)
        li.add_all([100 + i for i in range(n)])
        st.add_all([f"t{k}-{i}" for i in range(n)])
    _commit(store, b, 2)
    b.dispose()
    before = {name: _raw(store, ns, name) for name in ("l", "s")}
    assert len(before["l"]) == 5  # key 1: two chunks; keys 2, 3, 4: one each
    # A task that reads nothing sweeps what it never read; at 1099 nothing expired yet.
    later = ManualClock(1099)
    t = _open(store, ns, later, ttl_sweep_key_groups=16)
    t.get_state(_LIST)
    t.get_state(_STR_LIST)
    _commit(store, t, 3)
    assert {name: _raw(store, ns, name) for name in ("l", "s")} == before
    for now, epoch in ((1100, 4), (1149, 5), (1150, 6)):
        later.set(now)
        wal = t.pre_commit(epoch)
        assert _raw(store, ns, "l") == before["l"] or epoch > 4  # not before the commit
        commit_epoch(store[1], ns, epoch, [wal])
        t.notify_committed(epoch)
        for name, width in (("l", 8), ("s", None)):
            want = {}
            for slot, v in before[name].items():
                kept = filter_expired("list", width, 100, now, v)
                if kept is not None:
                    want[slot] = kept
            got = _raw(store, ns, name)
            assert got == want, (name, now)
            before[name] = got
    assert before == {"l": {}, "s": {}}
    assert t.loaded_key_groups == frozenset()
    t.dispose()


def _delete_raw(store, namespace, state, kg, key: bytes) -> None:
    kind, url = store
    if kind == "redis":
        import redis

        from statecore.external.store import NamespaceKeys

        c = redis.Redis.from_url(url)
        try:
            c.hdel(NamespaceKeys(namespace).data(kg, state), key)
        finally:
            c.close()
        return
    import psycopg

    with psycopg.connect(url) as conn:
        conn.execute("DELETE FROM statecore.entries WHERE ns = (SELECT id FROM "
                     "statecore.namespaces WHERE name = %s) AND state = %s AND kg = %s AND "
                     "key = %s", (namespace, state, kg, key))


def test_the_list_sweep_skips_broken_chunks_and_reads_as_in_memory(store):
    ns = f"ttl/{next(_namespaces)}"
    clocks = [ManualClock(1000), ManualClock(1000)]
    b = _open(store, ns, clocks[0], ttl_sweep_key_groups=16)
    # The same writes into an in-memory backend: the reference of what a read returns.
    ref = create_backend("python", key_type="int64", max_parallelism=16, ttl_clock=clocks[1])
    lists = [x.get_state(_LIST) for x in (b, ref)]
    for x, li in zip((b, ref), lists):
        for k in _KEYS[:20]:
            x.set_current_key(k)
            li.add_all([k, k + 1])
    _commit(store, b, 1)
    for c in clocks:
        c.set(1060)
    for x, li in zip((b, ref), lists):
        for k in _KEYS[:10]:
            x.set_current_key(k)
            li.add(k + 2)
    _commit(store, b, 2)
    # A chunk whose layout the sweep cannot read (a truncated element) stays as it is, and
    # the rest of the epoch commits: a script error after its first write would leave Redis
    # with part of an epoch.
    # (a list not renewed: two int64 elements with their timestamps, all expired at 1100)
    slot = next(s for s, v in sorted(_raw(store, ns, "l").items()) if len(v) == 32)
    broken = b"\x00" * 11
    _put_raw(store, ns, "l", slot[0], slot[1], broken)
    clocks[0].set(1100)
    _commit(store, b, 3)
    raw = _raw(store, ns, "l")
    assert raw[slot] == broken
    assert len(raw) == 11  # the ten lists renewed at 1060, and the broken chunk
    _delete_raw(store, ns, "l", *slot)
    # A fresh task reads the swept lists through: what the in-memory backend returns.
    clocks[1].set(1100)
    t = _open(store, ns, ManualClock(1100), ttl_sweep_key_groups=0)
    tl = t.get_state(_LIST)
    got, want = {}, {}
    for x, li, out in ((t, tl, got), (ref, lists[1], want)):
        for k in _KEYS[:20]:
            x.set_current_key(k)
            out[k] = li.get()
    assert got == want
    assert want[3] == [5] and not want[15]
    b.dispose()
    t.dispose()
    ref.dispose()


def test_tables_from_before_the_list_sweep_get_its_function(shared_postgres_server):  # noqa: F811
    import psycopg

    store = ("postgres", shared_postgres_server.url)
    ns = f"ttl/{next(_namespaces)}"
    clock = ManualClock(1000)
    b = _open(store, ns, clock)
    b.get_state(_LIST)
    b.dispose()
    # Tables created by a version without the list sweep: no trimming function.
    with psycopg.connect(store[1], autocommit=True) as conn:
        conn.execute("DROP FUNCTION statecore.ttl_trim_list_chunk(bytea, integer, bigint)")
    b = _open(store, ns, clock)
    li = b.get_state(_LIST)
    b.set_current_key(7)
    li.add_all([1, 2])
    _commit(store, b, 1)
    clock.set(1100)
    _commit(store, b, 2)
    assert _raw(store, ns, "l") == {}
    b.dispose()

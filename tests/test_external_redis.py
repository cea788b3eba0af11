"""External keyed state in Redis (statecore.external) against a real redis-server: the epoch
protocol (pre-commit invisible, one atomic commit, idempotent repeats, abort), read-through by
key group in pipelined round trips, rescaling by key-group ranges without moving data, TTL in
the stored values, store failures as StateError subclasses with no half-committed epoch (the
server killed between pre-commit and commit and during a commit), and the outside reader."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from statecore.backends import create_backend
from statecore.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)
from statecore.errors import (
    EpochCommitError,
    ExternalStoreAuthError,
    ExternalStoreUnavailableError,
    InvalidInputError,
    StateError,
    StateMigrationError,
)
from statecore.external import abort_epoch, commit_epoch, read_committed, wal_keys
from statecore.key_groups import key_group_range_for_operator
from statecore.ttl import ManualClock, StateTtlConfig
from support.redis_server import (  # noqa: F401  (fixtures)
    RedisServer,
    redis_server,
    redis_server_aof,
)

NS = "job/op"


def _open(server, **kw):
    kw.setdefault("namespace", NS)
    kw.setdefault("key_type", "int64")
    kw.setdefault("max_parallelism", 128)
    return create_backend("redis", url=server.url, **kw)


def _values(server, state="v", ns=NS) -> tuple:
    """(committed epoch, {key: value}) of value state ``state`` as an outside reader sees it."""
    c = read_committed(server.url, ns, state)
    d = c.table.to_pydict()
    return c.epoch, dict(zip(d["key"], d["value"]))


def _write_epoch(b, keys, value):
    v = b.get_state(ValueStateDescriptor("v", "int64"))
    v.put_batch(pa.array(list(keys), pa.int64()), pa.array([value] * len(keys), pa.int64()))


@pytest.mark.parametrize("cache", ["python", "native"])
def test_epoch_visible_only_once_committed(redis_server, cache):  # noqa: F811
    b = _open(redis_server, cache=cache)
    v = b.get_state(ValueStateDescriptor("v", "int64"))
    m = b.get_state(MapStateDescriptor("m", "string", "int64"))
    ls = b.get_state(ListStateDescriptor("l", "string"))
    for k in range(20):
        b.set_current_key(k)
        v.update(k)
        m.put("a", k)
        m.put("b", -k)
        ls.add_all([str(k), "x"])
    wal = b.pre_commit(1)
    assert wal_keys(redis_server.url, NS, 1) == [wal]
    with pytest.raises(InvalidInputError, match="no statecore state namespace|no committed"):
        read_committed(redis_server.url, NS, "v")
    early = _open(redis_server, cache=cache)
    ev = early.get_state(ValueStateDescriptor("v", "int64"))
    assert ev.get_batch(pa.array([1, 2], pa.int64())).to_pylist() == [None, None]
    assert commit_epoch(redis_server.url, NS, 1, [wal]) is True
    assert commit_epoch(redis_server.url, NS, 1, [wal]) is False  # a repeat changes nothing
    assert wal_keys(redis_server.url, NS, 1) == []
    assert _values(redis_server) == (1, {k: k for k in range(20)})
    # Epoch 2: removals and updates; pre-committed only, then a new backend and a reader see 1.
    b.notify_committed(1)
    for k in range(10):
        b.set_current_key(k)
        v.clear()
        m.remove("a")
        ls.add("y")
    b.pre_commit(2)
    assert _values(redis_server) == (1, {k: k for k in range(20)})
    with pytest.raises(EpochCommitError, match="epoch 2 .* is not committed yet"):
        b.pre_commit(3)  # epochs commit in order
    fresh = _open(redis_server, cache=cache)
    fv = fresh.get_state(ValueStateDescriptor("v", "int64"))
    fm = fresh.get_state(MapStateDescriptor("m", "string", "int64"))
    fl = fresh.get_state(ListStateDescriptor("l", "string"))
    fresh.set_current_key(3)
    assert (fv.value(), fm.items(), fl.get()) == (3, [("a", 3), ("b", -3)], ["3", "x"])
    assert commit_epoch(redis_server.url, NS, 2, wal_keys(redis_server.url, NS, 2))
    assert _values(redis_server) == (2, {k: k for k in range(10, 20)})
    fresh = _open(redis_server, cache=cache)
    fm = fresh.get_state(MapStateDescriptor("m", "string", "int64"))
    fl = fresh.get_state(ListStateDescriptor("l", "string"))
    fresh.set_current_key(3)
    assert (fm.items(), fl.get()) == ([("b", -3)], ["3", "x", "y"])
    assert sorted(fresh.keys("v")) == list(range(10, 20))


def test_abort_discards_the_epoch(redis_server):  # noqa: F811
    b = _open(redis_server)
    _write_epoch(b, range(8), 1)
    commit_epoch(redis_server.url, NS, 1, [b.pre_commit(1)])
    b.notify_committed(1)
    _write_epoch(b, range(8), 2)
    st = b.get_state(ValueStateDescriptor("v", "int64"))
    b.pre_commit(2)
    assert abort_epoch(redis_server.url, NS, 2) == 1
    assert abort_epoch(redis_server.url, NS, 1) == -1  # committed: nothing deleted
    with pytest.raises(EpochCommitError, match="missing"):
        commit_epoch(redis_server.url, NS, 2, [f"statecore:{{{NS}}}:wal:2:kg0-127"])
    assert _values(redis_server) == (1, dict.fromkeys(range(8), 1))
    b.abort()
    with pytest.raises(StateError, match="get_state"):
        st.get_batch(pa.array([1], pa.int64()))
    st = b.get_state(ValueStateDescriptor("v", "int64"))
    assert st.get_batch(pa.array([1, 2], pa.int64())).to_pylist() == [1, 1]
    assert b.committed_epoch == 1
    _write_epoch(b, [1], 3)
    commit_epoch(redis_server.url, NS, 2, [b.pre_commit(2)])  # the replayed epoch 2
    assert _values(redis_server)[1][1] == 3


def _command_calls(client) -> dict:
    """{command: calls} since the last ``CONFIG RESETSTAT`` (``INFO commandstats``; commands a
    script runs count too), without the INFO itself."""
    stats = client.info("commandstats")
    return {k: v["calls"] for k, v in stats.items() if k != "cmdstat_info"}


def test_abort_and_commit_cost_does_not_grow_with_unrelated_keys(redis_server):  # noqa: F811
    """abort_epoch without names finds the epoch's logs in the namespace's pending set: the
    commands it runs are the same with 40,000 unrelated keys in the database as without, and
    no SCAN; the pending set empties on abort and commit."""
    import redis

    from statecore.key_groups import assign_key_group

    client = redis.Redis.from_url(redis_server.url)
    tasks = [_open(redis_server, key_group_range=r, task=f"t{i}")
             for i, r in enumerate([(0, 63), (64, 127)])]
    owned = [[k for k in range(64) if (assign_key_group(k, "int64", 128) < 64) == (i == 0)]
             for i in range(2)]

    def abort_calls(epoch):
        for t, keys in zip(tasks, owned):
            _write_epoch(t, keys, epoch)
            t.pre_commit(epoch)
        assert len(wal_keys(redis_server.url, NS, epoch)) == 2
        client.config_resetstat()
        assert abort_epoch(redis_server.url, NS, epoch) == 2
        calls = _command_calls(client)
        for t in tasks:
            t.abort()
        assert wal_keys(redis_server.url, NS, epoch) == []
        return calls

    small = abort_calls(1)
    for i in range(0, 40_000, 5_000):
        client.mset({f"unrelated:{j}": b"x" for j in range(i, i + 5_000)})
    assert client.dbsize() > 40_000
    large = abort_calls(1)
    assert "cmdstat_scan" not in small and "cmdstat_keys" not in small
    assert large == small, (small, large)
    # A commit removes its logs from the set; only the other epoch's stay listed.
    wals = []
    for t, keys in zip(tasks, owned):
        _write_epoch(t, keys, 7)
        wals.append(t.pre_commit(1))
    assert commit_epoch(redis_server.url, NS, 1, wals)
    assert client.smembers(f"statecore:{{{NS}}}:pending") == set()
    assert abort_epoch(redis_server.url, NS, 1) == -1
    with pytest.raises(InvalidInputError, match="not a write-ahead log of epoch 2"):
        abort_epoch(redis_server.url, NS, 2, ["unrelated:1"])


def test_batch_read_through_is_one_transaction(redis_server):  # noqa: F811
    """A batch touching many key groups reads them with one MULTI of pipelined HGETALLs (one
    per state and key group), never a round trip per row; later calls read nothing."""
    import redis

    b = _open(redis_server)
    b.get_state(ReducingStateDescriptor("r", "sum", "int64"))
    _write_epoch(b, range(500), 7)
    commit_epoch(redis_server.url, NS, 1, [b.pre_commit(1)])
    admin = redis.Redis.from_url(redis_server.url)
    admin.config_resetstat()
    fresh = _open(redis_server)
    v = fresh.get_state(ValueStateDescriptor("v", "int64"))
    keys = pa.array(list(range(500)) * 2, pa.int64())
    assert v.get_batch(keys).to_pylist() == [7] * 1000
    stats = admin.info("commandstats")
    kgs = {_kg(k) for k in range(500)}
    assert stats["cmdstat_exec"]["calls"] == 2  # opening the namespace, the read-through
    # (v, r, __timers__) x key groups; the state metas at get_state and at the read-through;
    # the meta hash on opening
    assert stats["cmdstat_hgetall"]["calls"] == 3 * len(kgs) + 3
    assert fresh.loaded_key_groups == kgs
    v.get_batch(pa.array([0, 1, 2, 3], pa.int64()))
    fresh.set_current_key(3)
    assert admin.info("commandstats")["cmdstat_hgetall"]["calls"] == 3 * len(kgs) + 3
    # 8 keys or more per key group not read yet: every key group, no hashing per key.
    big = _open(redis_server)
    bv = big.get_state(ValueStateDescriptor("v", "int64"))
    assert bv.get_batch(pa.array(range(1024), pa.int64())).to_pylist()[:500] == [7] * 500
    assert big.loaded_key_groups == frozenset(range(128))


def test_rescale_reads_by_key_group_ranges(redis_server):  # noqa: F811
    """Two tasks commit one epoch together; three tasks then own the key groups: nothing is
    moved, each reads its own range."""
    tasks = [_open(redis_server, key_group_range=key_group_range_for_operator(128, 2, i),
                   cache=c) for i, c in enumerate(["python", "native"])]
    keys = list(range(300))
    for t in tasks:
        _write_epoch(t, [k for k in keys if _kg(k) in t.key_group_range], 5)
    assert commit_epoch(redis_server.url, NS, 1, [t.pre_commit(1) for t in tasks])
    seen = []
    for i in range(3):
        t = _open(redis_server, key_group_range=key_group_range_for_operator(128, 3, i))
        seen += t.keys("v")
    assert sorted(seen) == keys


def _kg(k: int) -> int:
    from statecore.key_groups import assign_key_group

    return assign_key_group(k, "int64", 128)


def test_commit_checks_every_log_first(redis_server):  # noqa: F811
    a = _open(redis_server, key_group_range=(0, 63))
    b = _open(redis_server, key_group_range=(64, 127))
    for t in (a, b):
        _write_epoch(t, [k for k in range(100) if _kg(k) in t.key_group_range], 1)
    wa = a.pre_commit(1)
    with pytest.raises(EpochCommitError, match="kg64-127.*missing"):
        commit_epoch(redis_server.url, NS, 1, [wa, f"statecore:{{{NS}}}:wal:1:kg64-127"])
    with pytest.raises(InvalidInputError, match="not a write-ahead log of epoch 1"):
        commit_epoch(redis_server.url, NS, 1, [f"statecore:{{{NS}}}:wal:2:x"])
    assert wal_keys(redis_server.url, NS, 1) == [wa]  # nothing applied, nothing deleted
    with pytest.raises(InvalidInputError):
        read_committed(redis_server.url, NS, "v")
    wb = b.pre_commit(1)
    assert commit_epoch(redis_server.url, NS, 1, [wa, wb])
    assert _values(redis_server) == (1, dict.fromkeys(range(100), 1))
    # A log re-written for a committed epoch (a replayed pre-commit) is dropped, never applied.
    _write_epoch(a, [k for k in range(100) if _kg(k) in a.key_group_range], 9)
    with pytest.raises(EpochCommitError, match="not newer than the pre-committed epoch 1"):
        a.pre_commit(1)
    stale = _open(redis_server, namespace="other")
    assert stale.committed_epoch is None


def test_bad_configuration_and_arguments(redis_server):  # noqa: F811
    _open(redis_server)
    with pytest.raises(StateMigrationError, match="max_parallelism"):
        _open(redis_server, max_parallelism=256)
    with pytest.raises(StateMigrationError, match="key_type"):
        _open(redis_server, key_type="string")
    for kw in [dict(namespace="a{b}"), dict(namespace=""), dict(cache="rocksdb"),
               dict(task="a b"), dict(key_group_range=(0, 128))]:
        with pytest.raises(InvalidInputError):
            _open(redis_server, **kw)
    b = _open(redis_server)
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(InvalidInputError):
            b.pre_commit(bad)
    with pytest.raises(InvalidInputError, match="epochs"):
        b.snapshot(incremental=True)


def test_unreachable_and_refused_credentials(tmp_path, redis_server):  # noqa: F811
    from support.s3_server import free_port

    with pytest.raises(ExternalStoreUnavailableError, match="unreachable"):
        create_backend("redis", url=f"redis://127.0.0.1:{free_port()}/0", namespace=NS,
                       timeout_s=2)
    locked = RedisServer(str(tmp_path), password="s3cret")
    try:
        bad = locked.url.replace("s3cret", "wrong")
        with pytest.raises(ExternalStoreAuthError) as e:
            create_backend("redis", url=bad, namespace=NS)
        assert "wrong" not in str(e.value)
        b = create_backend("redis", url=locked.url, namespace=NS)
        _write_epoch(b, range(5), 1)
        w = b.pre_commit(1)
        with pytest.raises(ExternalStoreAuthError):
            commit_epoch(bad, NS, 1, [w])
        assert commit_epoch(locked.url, NS, 1, [w])
    finally:
        locked.kill()


def test_server_down_between_pre_commit_and_commit(redis_server_aof):  # noqa: F811
    """The server dies after the pre-commit: the commit fails with a clear error, the restarted
    server holds the previous epoch whole plus the write-ahead log, and the commit then
    completes; a pre-commit against a dead server keeps the changes for the retry."""
    s = redis_server_aof
    b = _open(s, timeout_s=2)
    _write_epoch(b, range(50), 1)
    commit_epoch(s.url, NS, 1, [b.pre_commit(1)])
    b.notify_committed(1)
    _write_epoch(b, range(50), 2)
    wal = b.pre_commit(2)
    s.kill()
    with pytest.raises(ExternalStoreUnavailableError):
        commit_epoch(s.url, NS, 2, [wal], timeout_s=2)
    _write_epoch(b, range(10), 3)  # key groups in the cache: no store access
    with pytest.raises(ExternalStoreUnavailableError):
        b.pre_commit(3)
    with pytest.raises(ExternalStoreUnavailableError):  # a key group to read through
        b.set_current_key(next(k for k in range(50, 500) if _kg(k) not in b.loaded_key_groups))
    s.start()
    assert _values(s) == (1, dict.fromkeys(range(50), 1))
    assert commit_epoch(s.url, NS, 2, [wal])
    assert _values(s) == (2, dict.fromkeys(range(50), 2))
    commit_epoch(s.url, NS, 3, [b.pre_commit(3)])  # the retried pre-commit has everything
    assert _values(s) == (3, {**dict.fromkeys(range(10), 3), **dict.fromkeys(range(10, 50), 2)})


@pytest.mark.slow
def test_server_killed_during_commit(redis_server_aof):  # noqa: F811
    """SIGKILL while the commit script of a large epoch may be running: after a restart the
    namespace holds either the old epoch whole or the new one whole, never a mix; repeating the
    commit then leaves the new epoch whole."""
    s = redis_server_aof
    n = 60_000
    b = _open(s, timeout_s=5)
    _write_epoch(b, range(n), 1)
    commit_epoch(s.url, NS, 1, [b.pre_commit(1)])
    b.notify_committed(1)
    _write_epoch(b, range(n), 2)
    wal = b.pre_commit(2)
    outcome = []

    def commit():
        try:
            outcome.append(commit_epoch(s.url, NS, 2, [wal], timeout_s=5))
        except StateError as e:
            outcome.append(e)

    t = threading.Thread(target=commit)
    t.start()
    time.sleep(0.02)
    s.kill()
    t.join(30)
    s.start()
    epoch, values = _values(s)
    assert len(values) == n
    assert set(values.values()) == {epoch}  # one epoch whole, never a mix
    if epoch == 1:
        assert isinstance(outcome[0], ExternalStoreUnavailableError)
        assert wal_keys(s.url, NS, 2) == [wal]
    assert commit_epoch(s.url, NS, 2, [wal]) is (epoch == 1)
    assert _values(s) == (2, dict.fromkeys(range(n), 2))


def test_reader_never_sees_an_uncommitted_epoch(redis_server):  # noqa: F811
    """While epochs commit back to back (each sets every key to the epoch, and pre-commits the
    next), a reader sees every key at the committed epoch's value in every read."""
    b = _open(redis_server)
    keys = range(2000)
    _write_epoch(b, keys, 1)
    commit_epoch(redis_server.url, NS, 1, [b.pre_commit(1)])
    stop = threading.Event()
    reads, errors = [], []

    def reader():
        while not stop.is_set():
            try:
                epoch, values = _values(redis_server)
                reads.append(epoch)
                if set(values.values()) != {epoch} or len(values) != len(keys):
                    errors.append((epoch, set(values.values())))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

    t = threading.Thread(target=reader)
    t.start()
    try:
        for epoch in range(2, 12):
            _write_epoch(b, keys, epoch)
            wal = b.pre_commit(epoch)
            commit_epoch(redis_server.url, NS, epoch, [wal])
    finally:
        stop.set()
        t.join(60)
    assert not errors
    assert len(reads) > 0 and reads == sorted(reads)


@pytest.mark.parametrize("cache", ["python", "native"])
def test_ttl_values_expire_across_epochs(redis_server, cache):  # noqa: F811
    clock = ManualClock(1000)
    d = ValueStateDescriptor("v", "int64").enable_time_to_live(StateTtlConfig(100))
    b = _open(redis_server, ttl_clock=clock, cache=cache)
    v = b.get_state(d)
    v.put_batch(pa.array([1, 2], pa.int64()), pa.array([10, 20], pa.int64()))
    commit_epoch(redis_server.url, NS, 1, [b.pre_commit(1)])
    c = read_committed(redis_server.url, NS, "v", now_ms=1099)
    assert c.table.column("ttl_timestamp_ms").to_pylist() == [1000, 1000]
    assert read_committed(redis_server.url, NS, "v", now_ms=1100).table.num_rows == 0
    later = ManualClock(1050)
    fresh = _open(redis_server, ttl_clock=later, cache=cache)
    fv = fresh.get_state(ValueStateDescriptor("v", "int64").enable_time_to_live(
        StateTtlConfig(100)))
    assert fv.get_batch(pa.array([1, 2], pa.int64())).to_pylist() == [10, 20]
    later.advance(100)
    fresh.set_current_key(1)
    assert fv.value() is None
    # Registered without TTL: the committed entries carry TTL timestamps.
    plain = _open(redis_server)
    with pytest.raises(StateMigrationError, match="does not migrate TTL"):
        plain.get_state(ValueStateDescriptor("v", "int64"))


def test_restore_imports_a_snapshot_as_epoch_writes(redis_server):  # noqa: F811
    src = create_backend("native", key_type="int64")
    v = src.get_state(ValueStateDescriptor("v", "int64"))
    v.put_batch(pa.array(range(40), pa.int64()), pa.array(range(40), pa.int64()))
    b = _open(redis_server)
    b.restore(src.snapshot())
    commit_epoch(redis_server.url, NS, 1, [b.pre_commit(1)])
    assert _values(redis_server) == (1, {k: k for k in range(40)})


@pytest.mark.parametrize("cache", ["python", "native"])
def test_timers_survive_in_redis(redis_server, cache):  # noqa: F811
    """Timers are committed with the epoch (a key group's set replaced when it changed) and
    fire from a new backend; firing reads every key group through first."""
    b = _open(redis_server, cache=cache)
    for k in range(30):
        b.set_current_key(k)
        b.timers.register_event_time_timer(100 + k)
    commit_epoch(redis_server.url, NS, 1, [b.pre_commit(1)])
    b.notify_committed(1)
    b.set_current_key(0)
    b.timers.delete_event_time_timer(100)
    w = b.pre_commit(2)
    assert commit_epoch(redis_server.url, NS, 2, [w])
    fresh = _open(redis_server, cache=cache)
    fired = fresh.timers.advance_watermark(110)
    assert [(ts, k) for ts, k, _ in fired] == [(100 + k, k) for k in range(1, 11)]
    assert fresh.loaded_key_groups == frozenset(range(128))
    commit_epoch(redis_server.url, NS, 3, [fresh.pre_commit(3)])
    again = _open(redis_server, cache=cache)
    assert [ts for ts, _, _ in again.timers.advance_watermark(1000)] == list(range(111, 130))


@pytest.mark.parametrize("cache", ["python", "native"])
def test_ttl_setting_changes_are_refused(redis_server, cache):  # noqa: F811
    """A state committed without TTL registered with TTL (even with enable_ttl_migration), or
    the other way round: StateMigrationError at registration, nothing registered, the backend
    usable for its other states."""
    b = _open(redis_server, cache=cache)
    _write_epoch(b, range(30), 4)
    commit_epoch(redis_server.url, NS, 1, [b.pre_commit(1)])
    m = _open(redis_server, cache=cache, ttl_clock=ManualClock(5000))
    ttl = StateTtlConfig(100)
    for d in (ValueStateDescriptor("v", "int64").enable_time_to_live(ttl),
              ValueStateDescriptor("v", "int64").enable_time_to_live(ttl).enable_ttl_migration()):
        with pytest.raises(StateMigrationError, match="does not migrate TTL"):
            m.get_state(d)
    assert "v" not in m.cache.state_tables()
    other = m.get_state(ValueStateDescriptor("w", "int64").enable_time_to_live(ttl))
    other.put_batch(pa.array([1], pa.int64()), pa.array([1], pa.int64()))
    mv = m.get_state(ValueStateDescriptor("v", "int64"))
    assert mv.get_batch(pa.array([1, 2], pa.int64())).to_pylist() == [4, 4]
    # Registered before another task committed the state with the other setting: refused at
    # the first read-through, which then leaves the cache as it was.
    early = _open(redis_server, cache=cache, key_group_range=(0, 63))
    early.get_state(ValueStateDescriptor("u", "int64").enable_time_to_live(ttl))
    late = _open(redis_server, cache=cache, key_group_range=(64, 127))
    late.get_state(ValueStateDescriptor("u", "int64"))
    late.read_through(range(64, 128))
    commit_epoch(redis_server.url, NS, 2, [late.pre_commit(2)])
    with pytest.raises(StateMigrationError, match="does not migrate TTL"):
        early.set_current_key(next(k for k in range(100) if _kg(k) < 64))
    assert early.loaded_key_groups == frozenset()


def test_operator_state_needs_opening_naming_why(redis_server):  # noqa: F811
    b = _open(redis_server)
    with pytest.raises(StateError, match="committed with the epochs .* open_operator_state"):
        b.operator_state  # noqa: B018
    b.dispose()


def test_the_url_comes_from_redis_url_when_none_is_given(redis_server, monkeypatch):  # noqa: F811
    monkeypatch.delenv("REDIS_URL", raising=False)
    with pytest.raises(InvalidInputError, match="REDIS_URL"):
        create_backend("redis", namespace=NS)
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    b = create_backend("redis", namespace=NS)
    _write_epoch(b, range(3), 1)
    assert commit_epoch(redis_server.url, NS, 1, [b.pre_commit(1)])
    b.dispose()
    assert read_committed(redis_server.url, NS, "v").epoch == 1
    with pytest.raises(InvalidInputError, match="not both"):
        create_backend("redis", url=redis_server.url, namespace=NS,
                       client=object())

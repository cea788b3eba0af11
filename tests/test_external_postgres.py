"""External keyed state in PostgreSQL (statecore.external.PostgresBackend) against a real
PostgreSQL server: the epoch protocol (pre-commit invisible, one transaction commits, idempotent
repeats, abort, stale epochs and unnamed logs never committed), bulk reads and writes (one
query per read-through, one COPY per pre-commit), rescaling by key-group ranges, connection
settings from URLs and libpq's environment variables, store failures as StateError subclasses
with no half-committed epoch (the server killed between pre-commit and commit and during a
commit; a restart continues), timeouts, and the outside reader."""

from __future__ import annotations

import socket
import threading
import time

import pyarrow as pa
import pytest

from statecore.backends import create_backend
from statecore.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
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
from statecore.external import (
    abort_epoch,
    commit_epoch,
    read_committed,
    read_committed_epoch,
    wal_keys,
)
from statecore.key_groups import assign_key_group, key_group_range_for_operator
from statecore.ttl import ManualClock, StateTtlConfig
from support.postgres_server import PASSWORD, USER, postgres_server  # noqa: F401  (fixture)
from support.s3_server import free_port

NS = "job/op"


def _open(server, **kw):
    kw.setdefault("namespace", NS)
    kw.setdefault("key_type", "int64")
    kw.setdefault("max_parallelism", 128)
    return create_backend("postgres", url=kw.pop("url", server.url), **kw)


def _values(server, state="v", ns=NS) -> tuple:
    """(committed epoch, {key: value}) of value state ``state`` as an outside reader sees it."""
    c = read_committed(server.url, ns, state)
    d = c.table.to_pydict()
    return c.epoch, dict(zip(d["key"], d["value"]))


def _write_epoch(b, keys, value):
    v = b.get_state(ValueStateDescriptor("v", "int64"))
    v.put_batch(pa.array(list(keys), pa.int64()), pa.array([value] * len(keys), pa.int64()))


def _kg(k: int) -> int:
    return assign_key_group(k, "int64", 128)


def _sql(server, query, params=()):
    import psycopg

    with psycopg.connect(server.url, autocommit=True) as c:
        return c.execute(query, params).fetchall()


@pytest.mark.parametrize("cache", ["python", "native"])
def test_epoch_visible_only_once_committed(postgres_server, cache):  # noqa: F811
    s = postgres_server
    b = _open(s, cache=cache)
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
    assert wal_keys(s.url, NS, 1) == [wal] == [f"statecore:{{{NS}}}:wal:1:kg0-127"]
    with pytest.raises(InvalidInputError, match="no committed state"):
        read_committed(s.url, NS, "v")
    assert read_committed_epoch(s.url, NS) is None
    assert read_committed_epoch(s.url, "no/such/namespace") is None
    early = _open(s, cache=cache)
    ev = early.get_state(ValueStateDescriptor("v", "int64"))
    assert ev.get_batch(pa.array([1, 2], pa.int64())).to_pylist() == [None, None]
    assert commit_epoch(s.url, NS, 1, [wal]) is True
    assert commit_epoch(s.url, NS, 1, [wal]) is False  # a repeat changes nothing
    assert read_committed_epoch(s.url, NS) == 1
    assert wal_keys(s.url, NS, 1) == []
    assert _values(s) == (1, {k: k for k in range(20)})
    b.notify_committed(1)
    for k in range(10):
        b.set_current_key(k)
        v.clear()
        m.remove("a")
        ls.add("y")
    b.pre_commit(2)
    assert _values(s) == (1, {k: k for k in range(20)})
    with pytest.raises(EpochCommitError, match="epoch 2 .* is not committed yet"):
        b.pre_commit(3)
    fresh = _open(s, cache=cache)
    fv = fresh.get_state(ValueStateDescriptor("v", "int64"))
    fm = fresh.get_state(MapStateDescriptor("m", "string", "int64"))
    fl = fresh.get_state(ListStateDescriptor("l", "string"))
    fresh.set_current_key(3)
    assert (fv.value(), fm.items(), fl.get()) == (3, [("a", 3), ("b", -3)], ["3", "x"])
    assert commit_epoch(s.url, NS, 2, wal_keys(s.url, NS, 2))
    assert _values(s) == (2, {k: k for k in range(10, 20)})
    fresh = _open(s, cache=cache)
    fm = fresh.get_state(MapStateDescriptor("m", "string", "int64"))
    fl = fresh.get_state(ListStateDescriptor("l", "string"))
    fresh.set_current_key(3)
    assert (fm.items(), fl.get()) == ([("b", -3)], ["3", "x", "y"])
    assert sorted(fresh.keys("v")) == list(range(10, 20))
    # A commit leaves one version per entry and no deletion markers.
    assert _sql(s, "SELECT count(*) FROM statecore.entries WHERE value IS NULL "
                   "OR epoch < 2 AND (kg, state, key) IN (SELECT kg, state, key FROM "
                   "statecore.entries WHERE epoch = 2)") == [(0,)]


def test_a_large_epoch_refreshes_the_planner_statistics(postgres_server):  # noqa: F811
    """A commit of at least 10,000 rows ANALYZEs the entries table first: with statistics from
    before the epoch's COPY the planner joined the superseded versions by a nested loop that
    scans the namespace once per new row (a first epoch of 180k rows ran for minutes). ANALYZE
    updates pg_class.reltuples in the commit's own transaction."""
    import psycopg

    s = postgres_server
    b = _open(s)
    _write_epoch(b, range(12_000), 1)
    wal = b.pre_commit(1)

    def reltuples():
        with psycopg.connect(s.url) as c:
            return c.execute("SELECT reltuples FROM pg_class WHERE oid = "
                             "'statecore.entries'::regclass").fetchone()[0]

    assert reltuples() < 12_000  # never analyzed yet (-1), the COPY did not count
    assert commit_epoch(s.url, NS, 1, [wal])
    assert reltuples() >= 12_000
    assert _values(s)[0] == 1


def test_abort_discards_the_epoch(postgres_server):  # noqa: F811
    s = postgres_server
    # A fresh database (no statecore tables yet): nothing to abort, as a coordinator's
    # first epoch finds it.
    assert abort_epoch(s.url, NS, 0) == 0
    b = _open(s)
    _write_epoch(b, range(8), 1)
    commit_epoch(s.url, NS, 1, [b.pre_commit(1)])
    b.notify_committed(1)
    _write_epoch(b, range(8), 2)
    st = b.get_state(ValueStateDescriptor("v", "int64"))
    b.pre_commit(2)
    assert abort_epoch(s.url, NS, 2) == 1
    assert abort_epoch(s.url, NS, 1) == -1  # committed: nothing deleted
    assert _sql(s, "SELECT count(*) FROM statecore.entries WHERE epoch = 2") == [(0,)]
    with pytest.raises(EpochCommitError, match="missing"):
        commit_epoch(s.url, NS, 2, [f"statecore:{{{NS}}}:wal:2:kg0-127"])
    assert _values(s) == (1, dict.fromkeys(range(8), 1))
    b.abort()
    with pytest.raises(StateError, match="get_state"):
        st.get_batch(pa.array([1], pa.int64()))
    st = b.get_state(ValueStateDescriptor("v", "int64"))
    assert st.get_batch(pa.array([1, 2], pa.int64())).to_pylist() == [1, 1]
    assert b.committed_epoch == 1
    _write_epoch(b, [1], 3)
    commit_epoch(s.url, NS, 2, [b.pre_commit(2)])  # the replayed epoch 2
    assert _values(s)[1][1] == 3


def test_commit_checks_every_log_and_drops_stale_rows(postgres_server):  # noqa: F811
    """A missing log refuses the commit before anything changes; rows of logs not named and of
    epochs never committed (a failed run that was not aborted) are discarded by the commit,
    never made visible."""
    s = postgres_server
    a = _open(s, key_group_range=(0, 63))
    b = _open(s, key_group_range=(64, 127))
    for t in (a, b):
        _write_epoch(t, [k for k in range(100) if _kg(k) in t.key_group_range], 1)
    wa = a.pre_commit(1)
    with pytest.raises(EpochCommitError, match="kg64-127 is missing"):
        commit_epoch(s.url, NS, 1, [wa, f"statecore:{{{NS}}}:wal:1:kg64-127"])
    with pytest.raises(InvalidInputError, match="not a write-ahead log of epoch 1"):
        commit_epoch(s.url, NS, 1, [f"statecore:{{{NS}}}:wal:2:x"])
    assert wal_keys(s.url, NS, 1) == [wa]
    with pytest.raises(InvalidInputError):
        read_committed(s.url, NS, "v")
    wb = b.pre_commit(1)
    assert commit_epoch(s.url, NS, 1, [wa, wb])
    assert _values(s) == (1, dict.fromkeys(range(100), 1))
    # A failed run: task a pre-committed epoch 2 (value 2), nobody aborted it; the replay
    # commits epoch 3 from task b alone (value 3 on b's keys): a's epoch 2 never shows.
    a.notify_committed(1)
    b.notify_committed(1)
    _write_epoch(a, [k for k in range(100) if _kg(k) < 64], 2)
    a.pre_commit(2)
    _write_epoch(b, [k for k in range(100) if _kg(k) >= 64], 3)
    wb3 = b.pre_commit(3)
    assert commit_epoch(s.url, NS, 3, [wb3])
    assert _values(s) == (3, {k: 1 if _kg(k) < 64 else 3 for k in range(100)})
    assert _sql(s, "SELECT count(*) FROM statecore.entries WHERE epoch = 2") == [(0,)]
    assert wal_keys(s.url, NS, 2) == []
    # An unnamed log of the committed epoch is dropped with its rows.
    a.abort()
    b.notify_committed(3)
    _write_epoch(a, [k for k in range(100) if _kg(k) < 64], 4)
    _write_epoch(b, [k for k in range(100) if _kg(k) >= 64], 4)
    a.pre_commit(4)
    late = _open(s, key_group_range=(0, 63))  # knows epoch 3 as the committed one
    assert commit_epoch(s.url, NS, 4, [b.pre_commit(4)])
    assert _values(s) == (4, {k: 1 if _kg(k) < 64 else 4 for k in range(100)})
    # A backend that does not know of the commit yet is refused by the store.
    _write_epoch(late, [next(k for k in range(100) if _kg(k) < 64)], 9)
    with pytest.raises(EpochCommitError, match="not newer than the committed epoch 4"):
        late.pre_commit(4)


def test_rescale_reads_by_key_group_ranges(postgres_server):  # noqa: F811
    s = postgres_server
    tasks = [_open(s, key_group_range=key_group_range_for_operator(128, 2, i), cache=c)
             for i, c in enumerate(["python", "native"])]
    keys = list(range(300))
    for t in tasks:
        _write_epoch(t, [k for k in keys if _kg(k) in t.key_group_range], 5)
    # The tasks pre-commit at the same time (each in its own thread, as executors would).
    names = [None] * len(tasks)

    def pre_commit(i):
        names[i] = tasks[i].pre_commit(1)

    threads = [threading.Thread(target=pre_commit, args=(i,)) for i in range(len(tasks))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert commit_epoch(s.url, NS, 1, names)
    seen = []
    for i in range(3):
        t = _open(s, key_group_range=key_group_range_for_operator(128, 3, i))
        seen += t.keys("v")
        assert t.loaded_key_groups == frozenset(t.key_group_range)
    assert sorted(seen) == keys


def test_bulk_statements(postgres_server):  # noqa: F811
    """A pre-commit writes its entries with one COPY; a batch read-through touching many key
    groups is one query; later calls on those key groups query nothing (the server's
    statement log, ``log_statement=all`` for these connections)."""
    s = postgres_server
    url = s.url + "?options=-c%20log_statement%3Dall"
    b = _open(s, url=url)
    _write_epoch(b, range(500), 7)
    start = len(s.log_tail(10**9))
    commit_epoch(s.url, NS, 1, [b.pre_commit(1)])
    log = s.log_tail(10**9)[start:]
    assert log.count("COPY statecore.entries") == 1
    assert "INSERT INTO statecore.entries" not in log
    fresh = _open(s, url=url)
    v = fresh.get_state(ValueStateDescriptor("v", "int64"))
    start = len(s.log_tail(10**9))
    assert v.get_batch(pa.array(list(range(500)) * 2, pa.int64())).to_pylist() == [7] * 1000
    v.get_batch(pa.array([0, 1, 2, 3], pa.int64()))
    fresh.set_current_key(3)
    log = s.log_tail(10**9)[start:]
    assert log.count("FROM statecore.entries") == 1
    assert fresh.loaded_key_groups == {_kg(k) for k in range(500)}


def test_bad_configuration_and_arguments(postgres_server):  # noqa: F811
    s = postgres_server
    _open(s)
    with pytest.raises(StateMigrationError, match="max_parallelism"):
        _open(s, max_parallelism=256)
    with pytest.raises(StateMigrationError, match="key_type"):
        _open(s, key_type="string")
    for kw in [dict(namespace="a{b}"), dict(namespace=""), dict(cache="rocksdb"),
               dict(task="a b"), dict(key_group_range=(0, 128)), dict(timeout_s=0),
               dict(url="postgresql://h/x?no_such_parameter=1")]:
        with pytest.raises(InvalidInputError):
            _open(s, **kw)
    b = _open(s)
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(InvalidInputError):
            b.pre_commit(bad)
    with pytest.raises(InvalidInputError, match="epochs"):
        b.snapshot(incremental=True)


def test_connection_settings_from_libpq_environment(postgres_server, monkeypatch):  # noqa: F811
    s = postgres_server
    for k, v in dict(PGHOST="127.0.0.1", PGPORT=str(s.port), PGUSER=USER, PGPASSWORD=PASSWORD,
                     PGDATABASE="postgres").items():
        monkeypatch.setenv(k, v)
    b = create_backend("postgres", url=None, namespace=NS)
    _write_epoch(b, range(5), 1)
    assert commit_epoch("postgresql://", NS, 1, [b.pre_commit(1)])
    assert read_committed("postgresql://", NS, "v").epoch == 1
    monkeypatch.setenv("PGPASSWORD", "wrong")
    with pytest.raises(ExternalStoreAuthError):
        create_backend("postgres", url="postgresql://", namespace=NS)
    # The caller's own connection, for the backend and the coordinator's calls.
    import psycopg

    with psycopg.connect(s.url, autocommit=True) as conn:
        b = create_backend("postgres", conn=conn, namespace=NS)
        b.notify_committed(1)
        _write_epoch(b, range(5), 2)
        w = b.pre_commit(2)
        assert wal_keys(conn, NS, 2) == [w]
        assert commit_epoch(conn, NS, 2, [w])
        b.dispose()
        assert not conn.closed
        assert read_committed(conn, NS, "v").table.column("value").to_pylist() == [2] * 5


def test_unreachable_refused_credentials_and_timeouts(postgres_server):  # noqa: F811
    s = postgres_server
    with pytest.raises(ExternalStoreUnavailableError, match="unreachable"):
        _open(s, url=s.url_with(port=free_port()), timeout_s=2)
    bad = s.url_with(password="wrong")
    with pytest.raises(ExternalStoreAuthError) as e:
        _open(s, url=bad)
    assert "wrong" not in str(e.value)
    with pytest.raises(ExternalStoreAuthError):
        _open(s, url=s.url_with(user="nobody_here"))
    b = _open(s, timeout_s=1)
    _write_epoch(b, range(5), 1)
    w = b.pre_commit(1)
    with pytest.raises(ExternalStoreAuthError):
        commit_epoch(bad, NS, 1, [w])
    assert commit_epoch(s.url, NS, 1, [w])
    b.notify_committed(1)
    # A listener that never answers: the connect times out.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        t0 = time.monotonic()
        with pytest.raises(ExternalStoreUnavailableError):
            _open(s, url=s.url_with(port=silent.getsockname()[1]), timeout_s=1)
        assert time.monotonic() - t0 < 30
    # A commit holding the namespace row: the pre-commit's lock wait times out, then the
    # same pre-commit succeeds.
    import psycopg

    _write_epoch(b, range(5), 2)
    with psycopg.connect(s.url) as holder:
        holder.execute("SELECT epoch FROM statecore.namespaces WHERE name = %s FOR UPDATE",
                       (NS,))
        with pytest.raises(ExternalStoreUnavailableError, match="not answering in time"):
            b.pre_commit(2)
        with pytest.raises(ExternalStoreUnavailableError):
            commit_epoch(s.url, NS, 2, [], timeout_s=1)
    assert commit_epoch(s.url, NS, 2, [b.pre_commit(2)])
    assert _values(s) == (2, dict.fromkeys(range(5), 2))


def test_server_killed_between_pre_commit_and_commit(postgres_server):  # noqa: F811
    """The server dies after the pre-commit: the commit fails with a clear error, the restarted
    server holds the previous epoch whole plus the pre-committed rows, the commit then
    completes, and the same backend continues (it reconnects); a pre-commit against a dead
    server keeps the changes for the retry."""
    s = postgres_server
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
    with pytest.raises(ExternalStoreUnavailableError):
        b.set_current_key(next(k for k in range(50, 500) if _kg(k) not in b.loaded_key_groups))
    s.start()
    assert _values(s) == (1, dict.fromkeys(range(50), 1))
    assert wal_keys(s.url, NS, 2) == [wal]
    assert commit_epoch(s.url, NS, 2, [wal])
    assert _values(s) == (2, dict.fromkeys(range(50), 2))
    commit_epoch(s.url, NS, 3, [b.pre_commit(3)])  # the retried pre-commit has everything
    assert _values(s) == (3, {**dict.fromkeys(range(10), 3), **dict.fromkeys(range(10, 50), 2)})


def test_a_backend_idle_through_a_server_restart_continues(postgres_server):  # noqa: F811
    """A backend whose connection the server ended while it was idle (a restart between two
    micro-batches) opens a new one for its next statement instead of failing it."""
    s = postgres_server
    b = _open(s, timeout_s=5)
    _write_epoch(b, range(20), 1)
    commit_epoch(s.url, NS, 1, [b.pre_commit(1)])
    b.notify_committed(1)
    s.kill()
    s.start()
    _write_epoch(b, range(20), 2)  # key groups in the cache: no store access
    commit_epoch(s.url, NS, 2, [b.pre_commit(2)])  # its first statement since the restart
    assert _values(s) == (2, dict.fromkeys(range(20), 2))


def test_server_killed_during_commit(postgres_server):  # noqa: F811
    """SIGKILL while the commit transaction of a large epoch may be running: after crash
    recovery the namespace holds either the old epoch whole or the new one whole, never a mix;
    repeating the commit then leaves the new epoch whole."""
    s = postgres_server
    n = 40_000
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
    time.sleep(0.05)
    s.kill()
    t.join(30)
    s.start()
    epoch, values = _values(s)
    assert len(values) == n
    assert set(values.values()) == {epoch}
    if epoch == 1:
        assert isinstance(outcome[0], ExternalStoreUnavailableError)
        assert wal_keys(s.url, NS, 2) == [wal]
    assert commit_epoch(s.url, NS, 2, [wal]) is (epoch == 1)
    assert _values(s) == (2, dict.fromkeys(range(n), 2))


def test_reader_never_sees_an_uncommitted_epoch(postgres_server):  # noqa: F811
    s = postgres_server
    b = _open(s)
    keys = range(2000)
    _write_epoch(b, keys, 1)
    commit_epoch(s.url, NS, 1, [b.pre_commit(1)])
    stop = threading.Event()
    reads, errors = [], []

    def reader():
        while not stop.is_set():
            try:
                epoch, values = _values(s)
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
            commit_epoch(s.url, NS, epoch, [wal])
    finally:
        stop.set()
        t.join(60)
    assert not errors
    assert len(reads) > 0 and reads == sorted(reads)


@pytest.mark.parametrize("cache", ["python", "native"])
def test_ttl_and_timers_through_postgres(postgres_server, cache):  # noqa: F811
    s = postgres_server
    clock = ManualClock(1000)
    d = ValueStateDescriptor("v", "int64").enable_time_to_live(StateTtlConfig(100))
    b = _open(s, ttl_clock=clock, cache=cache)
    v = b.get_state(d)
    v.put_batch(pa.array([1, 2], pa.int64()), pa.array([10, 20], pa.int64()))
    for k in range(30):
        b.set_current_key(k)
        b.timers.register_event_time_timer(100 + k)
    commit_epoch(s.url, NS, 1, [b.pre_commit(1)])
    b.notify_committed(1)
    assert read_committed(s.url, NS, "v", now_ms=1099).table.column(
        "ttl_timestamp_ms").to_pylist() == [1000, 1000]
    assert read_committed(s.url, NS, "v", now_ms=1100).table.num_rows == 0
    b.set_current_key(0)
    b.timers.delete_event_time_timer(100)
    commit_epoch(s.url, NS, 2, [b.pre_commit(2)])
    later = ManualClock(1050)
    fresh = _open(s, ttl_clock=later, cache=cache)
    fv = fresh.get_state(d)
    assert fv.get_batch(pa.array([1, 2], pa.int64())).to_pylist() == [10, 20]
    later.advance(100)
    fresh.set_current_key(1)
    assert fv.value() is None
    fired = fresh.timers.advance_watermark(110)
    assert [(ts, k) for ts, k, _ in fired] == [(100 + k, k) for k in range(1, 11)]
    commit_epoch(s.url, NS, 3, [fresh.pre_commit(3)])
    again = _open(s, cache=cache, ttl_clock=later)
    assert [ts for ts, _, _ in again.timers.advance_watermark(1000)] == list(range(111, 130))
    with pytest.raises(StateMigrationError, match="does not migrate TTL"):
        _open(s).get_state(ValueStateDescriptor("v", "int64"))

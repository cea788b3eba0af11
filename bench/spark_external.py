"""End-to-end Spark case on external keyed state: the running count per key of
:mod:`bench.spark_e2e` through :class:`statecore.spark.StatefulOperator` with its keyed state in
memory (native backend, a checkpoint every micro-batch), in Redis and in PostgreSQL
(``state_store=``, native cache), on ``local[2]`` with parallelism 2; and, in the same run,
the same running count as users write it today in ``foreachBatch`` with the client libraries
(at-least-once: a replayed micro-batch counts twice), each micro-batch repartitioned by key
into 2 partitions (so that no two tasks update one key) and each partition counting with one
client connection:

* ``redis client per row`` / ``postgres client per row``: the read-modify-write loop, per row
  ``HGET`` then ``HSET`` of one hash / ``SELECT`` then ``INSERT ... ON CONFLICT DO UPDATE`` of
  one table (one transaction per partition), on a tenth of the events (the same keys and
  number of micro-batches; these loops are too slow for the whole stream);
* ``redis client pipelined`` / ``postgres client pipelined``: per row one ``HINCRBY``,
  pipelined and executed every 10k rows / one ``INSERT ... ON CONFLICT DO UPDATE SET c = c +
  1``, 10k rows per psycopg ``executemany`` (pipeline mode), one transaction per partition.

Workload: ``events`` int64 keys uniform over ``keys`` distinct values (2M over 200k; ``--quick``
200k over 20k) in ``files`` Parquet files, one micro-batch each (4; ``--quick`` 3), read with
``readStream.parquet(maxFilesPerTrigger=1)`` and ``trigger(availableNow=True)`` into Spark's
``noop`` sink. Then a restart: the Spark session is stopped (its Python workers, with the
operator's cached state, end) and started again, one more file of ``events / files`` rows
lands, and the query runs again: one micro-batch that an in-memory operator begins by restoring
the previous version from its checkpoint and an external one by reading the key groups it
touches through from the store.

Records (impl ``native+checkpoint``, ``redis``, ``postgres`` and the four client loops):
``events_per_s`` (the first query's events over its wall-clock seconds, micro-batch planning
included); ``events_per_batch``; for ``redis`` and ``postgres`` the cache's
``cache_hit_rate`` (hits over hits + misses, the tasks' accesses of the first query:
``BatchReport.partitions``) and ``key_groups_read_per_batch``;
``first_batch_after_restart_s`` (the restarted query's micro-batch, as the operator reports
it: restore or read-through, processing and commit); per micro-batch of the first query:
``checkpoint_bytes_per_batch`` (in memory: the runs written), for Redis
``commands_per_batch``, ``net_in_bytes_per_batch``, ``net_out_bytes_per_batch`` and
``server_reads_per_batch`` (``INFO stats`` deltas: the commands the server ran, those of the
commit scripts included, the bytes it received and sent, and its socket reads: one per request,
about one per 16 kB of a pipeline, :func:`bench.external_servers.redis_stats`), for PostgreSQL
``transactions_per_batch`` and ``rows_written_per_batch`` (``pg_stat_database`` deltas of the
database: commits and rows inserted + updated + deleted; read after the session stopped, when
every connection's statistics are flushed); for the client loops ``round_trips_per_batch``
(counted by the loops: a command, a pipeline execution, a statement, an ``executemany`` or a
commit each). After each query the
committed counts (the client loops' hash or table) are checked against numpy's ``bincount``
(RuntimeError otherwise).

Redis: a Debian ``redis-server`` started on a free loopback port (no persistence), left out
without it or the ``redis`` client. PostgreSQL: the server of ``$STATECORE_BENCH_POSTGRES``
(as :mod:`bench.external_store`), left out without it or psycopg.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import has_native
from bench.external_servers import drop_postgres_namespace, redis_server, redis_stats
from bench.harness import Size, case, record
from bench.spark_e2e import RunningCount, landing_stream, make_stream, run_available_now

__all__ = ["run_query", "run_plain_query", "PlainCount"]

_CASE = "spark_running_count_external"
_MP = 128
_PARALLELISM = 2
_PG_ENV = "STATECORE_BENCH_POSTGRES"
#: Rows per pipeline execution / executemany of the pipelined client loops.
_PIPELINE_ROWS = 10_000
#: The per-row client loops run on this fraction of the events.
_PER_ROW_SHARE = 10


def _noop(df, _version) -> None:
    df.write.format("noop").mode("overwrite").save()


def _session():
    from statecore.spark import local_session

    return local_session("statecore-bench", master="local[2]", shuffle_partitions=2)


def run_query(spark, landing: str, workdir: str, state_store=None, namespace=None):
    """Run the running count over the files of ``landing`` not yet processed by the streaming
    checkpoint under ``workdir`` (``trigger(availableNow=True)``), keyed state in memory or in
    ``state_store``; returns ``(seconds, operator)``. Errors: the query's."""
    from statecore.spark import StatefulOperator

    op = StatefulOperator("count", RunningCount(), "k", os.path.join(workdir, "state"),
                          sink=_noop, parallelism=_PARALLELISM, max_parallelism=_MP,
                          backend="native", state_store=state_store,
                          state_namespace=namespace,
                          # A first epoch's commit on a busy 2-core machine can exceed 10 s.
                          state_store_timeout_s=300.0)
    seconds = run_available_now(landing_stream(spark, landing).writeStream.foreachBatch(op),
                                os.path.join(workdir, "spark"))
    return seconds, op


def _redis_partition(url: str, target: str, mode: str):
    """The partition function of a Redis client loop: counts the partition's rows into hash
    ``target``, returns ``[round trips]``."""
    def run(rows):
        import redis

        client = redis.Redis.from_url(url)
        trips = 0
        try:
            if mode == "per_row":
                for row in rows:
                    old = client.hget(target, row.k)
                    client.hset(target, row.k, (int(old) if old is not None else 0) + 1)
                    trips += 2
            else:
                pipe = client.pipeline(transaction=False)
                n = 0
                for row in rows:
                    pipe.hincrby(target, row.k, 1)
                    n += 1
                    if n == _PIPELINE_ROWS:
                        pipe.execute()
                        trips, n = trips + 1, 0
                if n:
                    pipe.execute()
                    trips += 1
        finally:
            client.close()
        yield trips
    return run


def _pg_partition(url: str, table: str, mode: str):
    """The partition function of a PostgreSQL client loop: counts the partition's rows into
    ``table`` in one transaction, returns ``[round trips]``."""
    def run(rows):
        import psycopg

        upsert = (f"INSERT INTO {table} (k, c) VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET "
                  + ("c = EXCLUDED.c" if mode == "per_row" else f"c = {table}.c + 1"))
        trips = 0
        with psycopg.connect(url) as conn:
            with conn.cursor() as cur:
                if mode == "per_row":
                    for row in rows:
                        old = cur.execute(f"SELECT c FROM {table} WHERE k = %s",
                                          (row.k,)).fetchone()
                        cur.execute(upsert, (row.k, (old[0] if old else 0) + 1))
                        trips += 2
                else:
                    chunk = []
                    for row in rows:
                        chunk.append((row.k, 1))
                        if len(chunk) == _PIPELINE_ROWS:
                            cur.executemany(upsert, chunk)
                            trips, chunk = trips + 1, []
                    if chunk:
                        cur.executemany(upsert, chunk)
                        trips += 1
            conn.commit()
            trips += 1
        yield trips
    return run


class PlainCount:
    """A ``foreachBatch`` function doing the running count with a client library, as users
    write it without statecore (module docstring): ``kind`` "redis" or "postgres", ``mode``
    "per_row" or "pipelined", counting into ``target`` (a hash / a table ``(k bigint primary
    key, c bigint)``) at ``url``. ``round_trips``: per micro-batch, the loops' round trips."""

    def __init__(self, kind: str, mode: str, url: str, target: str):
        self.kind, self.mode, self.url, self.target = kind, mode, url, target
        self.round_trips: list = []

    def __call__(self, df, batch_id: int) -> None:
        fn = (_redis_partition if self.kind == "redis" else _pg_partition)(
            self.url, self.target, self.mode)
        parts = df.repartition(_PARALLELISM, "k").rdd.mapPartitions(fn)
        self.round_trips.append(sum(parts.collect()))

    def counts(self, keys: int) -> np.ndarray:
        """The committed counts of keys ``0 .. keys - 1``."""
        got = np.zeros(keys, np.int64)
        if self.kind == "redis":
            import redis

            client = redis.Redis.from_url(self.url)
            try:
                for k, c in client.hgetall(self.target).items():
                    got[int(k)] = int(c)
            finally:
                client.close()
            return got
        import psycopg

        with psycopg.connect(self.url) as conn:
            for k, c in conn.execute(f"SELECT k, c FROM {self.target}"):
                got[k] = c
        return got

    def drop(self) -> None:
        if self.kind == "redis":
            import redis

            client = redis.Redis.from_url(self.url)
            try:
                client.delete(self.target)
            finally:
                client.close()
            return
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {self.target}")


def run_plain_query(spark, landing: str, workdir: str, fn: PlainCount) -> float:
    """Run ``fn`` as the ``foreachBatch`` function over the files of ``landing``
    (``trigger(availableNow=True)``, one file per micro-batch); returns the seconds."""
    from pyspark import cloudpickle

    # The partition functions travel by value: the workers do not have this package.
    cloudpickle.register_pickle_by_value(sys.modules[__name__.split(".")[0]])
    return run_available_now(landing_stream(spark, landing).writeStream.foreachBatch(fn),
                             os.path.join(workdir, "spark"))


def _pg_stats(url: str) -> np.ndarray:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit, tup_inserted + tup_updated + tup_deleted FROM "
            "pg_stat_database WHERE datname = current_database()").fetchone()
    return np.array(row, dtype=np.int64)


def _check_counts(op, files, keys: int) -> None:
    """RuntimeError unless the operator's committed state counts every row of ``files``."""
    from statecore import CheckpointStore, ReducingStateDescriptor, create_backend
    from statecore.external import read_committed

    want = np.bincount(np.concatenate([pq.read_table(f).column("k").to_numpy() for f in files]),
                       minlength=keys)
    got = np.zeros(keys, np.int64)
    if op.state_store is None:
        b = create_backend("native", key_type="int64", max_parallelism=_MP)
        CheckpointStore(op.store_uri).restore(b)
        st = b.get_state(ReducingStateDescriptor("count", "count"))
        got = np.array([v or 0 for v in st.get_batch(pa.array(np.arange(keys))).to_pylist()])
    else:
        t = read_committed(op.state_store, op.state_namespace, "count").table
        got[np.array(t.column("key").to_pylist(), np.int64)] = t.column("value").to_pylist()
    if not np.array_equal(got, want):
        raise RuntimeError(f"{_CASE}: the committed counts differ from the input's")


_REDIS_LABELS = (("commands_per_batch", "commands"), ("net_in_bytes_per_batch", "bytes"),
                 ("net_out_bytes_per_batch", "bytes"), ("server_reads_per_batch", "reads"))
_PG_LABELS = (("transactions_per_batch", "transactions"), ("rows_written_per_batch", "rows"))


def _plain_variant(kind: str, mode: str, url: str, stats, root: str, keys: int, events: int,
                   batches: int) -> list:
    """Run one client loop (module docstring) on a stream of its own and return its records;
    ``stats()`` the server's counters (:func:`bench.external_servers.redis_stats`,
    :func:`_pg_stats`)."""
    name = f"{kind} client {mode.replace('_', ' ')}"
    if mode == "per_row":
        events //= _PER_ROW_SHARE
    landing = os.path.join(root, f"{kind}-{mode}", "landing")
    files = make_stream(landing, keys, events, batches)
    target = f"plain_{mode}_{uuid.uuid4().hex[:8]}"
    fn = PlainCount(kind, mode, url, target if kind == "postgres" else f"plain:{target}")
    if kind == "postgres":
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {target} (k bigint PRIMARY KEY, c bigint NOT NULL)")
    try:
        spark = _session()
        before = stats()
        secs = run_plain_query(spark, landing, os.path.join(root, f"{kind}-{mode}", "work"), fn)
        spark.stop()
        delta = (stats() - before) / batches
        want = np.bincount(np.concatenate([pq.read_table(f).column("k").to_numpy()
                                           for f in files]), minlength=keys)
        if not np.array_equal(fn.counts(keys), want):
            raise RuntimeError(f"{_CASE}: {name}: the counts differ from the input's")
    finally:
        fn.drop()
    out = [record(_CASE, name, "events_per_s", events / secs, "events/s"),
           record(_CASE, name, "events_per_batch", events / batches, "events")]
    out += [record(_CASE, name, m, v, u)
            for (m, u), v in zip(_REDIS_LABELS if kind == "redis" else _PG_LABELS, delta)]
    out.append(record(_CASE, name, "round_trips_per_batch", sum(fn.round_trips) / batches,
                      "round trips"))
    print(f"  {_CASE}: {name:<26} {events / secs:>10,.0f} events/s")
    return out


def _variant(name: str, landing: str, new_file, work: str, keys: int, events: int, batches: int,
             store=None) -> list:
    """Run one variant (module docstring) and return its records. ``store``: None (in
    memory) or ``(kind, url, stats())``."""
    url = None if store is None else store[1]
    ns = None if store is None else f"bench/{uuid.uuid4().hex[:12]}"
    spark = _session()
    before = None if store is None else store[2]()
    secs, op = run_query(spark, landing, work, url, ns)
    files = sorted(os.path.join(landing, f) for f in os.listdir(landing))
    _check_counts(op, files, keys)
    ckpt_bytes = sum(r.checkpoint_bytes for r in op.reports)
    loads: dict = {}
    for r in op.reports:
        for kind, n in r.loads.items():
            loads[kind] = loads.get(kind, 0) + n
    spark.stop()  # the restart: the Python workers and the state they cache end
    out = [record(_CASE, name, "events_per_s", events / secs, "events/s"),
           record(_CASE, name, "events_per_batch", events / batches, "events")]
    if store is not None:
        parts = [p for r in op.reports for p in r.partitions]
        hits = sum(p["cache_hits"] for p in parts)
        misses = sum(p["cache_misses"] for p in parts)
        out += [record(_CASE, name, "cache_hit_rate", hits / max(1, hits + misses), "ratio"),
                record(_CASE, name, "key_groups_read_per_batch",
                       sum(p["cache_key_groups_read"] for p in parts) / batches, "key groups")]
    if store is None:
        out.append(record(_CASE, name, "checkpoint_bytes_per_batch", ckpt_bytes / batches,
                          "bytes"))
    else:
        delta = (store[2]() - before) / batches
        labels = _REDIS_LABELS if store[0] == "redis" else _PG_LABELS
        out += [record(_CASE, name, m, v, u) for (m, u), v in zip(labels, delta)]
    new_file()
    spark = _session()
    _secs, op = run_query(spark, landing, work, url, ns)
    last = op.reports[-1]
    files = sorted(os.path.join(landing, f) for f in os.listdir(landing))
    _check_counts(op, files, keys)
    out.append(record(_CASE, name, "first_batch_after_restart_s", last.seconds, "s"))
    print(f"  {_CASE}: {name:<18} {events / secs:>10,.0f} events/s (loads {loads}); after "
          f"the restart {last.seconds:.2f} s (loads {last.loads})")
    if store is not None and store[0] == "postgres":
        drop_postgres_namespace(url, ns)
    return out


@case(_CASE, "running count through Structured Streaming local[2] with the keyed state in memory "
             "(native, checkpoints), in Redis and in PostgreSQL, and foreachBatch client loops "
             "on the same stores: events/s, cache hit rate, store round trips and bytes per "
             "micro-batch, the first micro-batch after a restart")
def spark_running_count_external(size: Size) -> list:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print(f"  {_CASE}: pyspark is not installed; skipped")
        return []
    if not has_native():
        return []
    keys = size.n(200_000, 20_000)
    events = size.n(2_000_000, 200_000)
    batches = 3 if size.quick else 4
    root = tempfile.mkdtemp(prefix="statecore-bench-spark-ext-")
    out = []
    try:
        def prepare(name):
            landing = os.path.join(root, name, "landing")
            make_stream(landing, keys, events, batches)

            def new_file():
                # One more micro-batch after the restart, newer than the others.
                rng = np.random.default_rng(99)
                f = os.path.join(landing, "events-9999.parquet")
                pq.write_table(pa.table({"k": rng.integers(0, keys, events // batches,
                                                          dtype=np.int64)}), f)
                os.utime(f, (1_800_000_000, 1_800_000_000))
            return landing, new_file, os.path.join(root, name, "work")

        # The first streaming query of a session pays for JVM warm-up and code generation.
        warm = os.path.join(root, "warm")
        make_stream(warm, 100, 1000, 2)
        run_query(_session(), warm, os.path.join(root, "warm-work"))
        out += _variant("native+checkpoint", *prepare("native"), keys, events, batches)
        with redis_server(_CASE) as server:
            if server is not None:
                client, url = server
                out += _variant("redis", *prepare("redis"), keys, events, batches,
                                ("redis", url, lambda: redis_stats(client)))
                for mode in ("pipelined", "per_row"):
                    out += _plain_variant("redis", mode, url, lambda: redis_stats(client), root,
                                          keys, events, batches)
        pg = os.environ.get(_PG_ENV)
        try:
            import psycopg  # noqa: F401
        except ImportError:
            pg = None
        if pg:
            out += _variant("postgres", *prepare("postgres"), keys, events, batches,
                            ("postgres", pg, lambda: _pg_stats(pg)))
            for mode in ("pipelined", "per_row"):
                out += _plain_variant("postgres", mode, pg, lambda: _pg_stats(pg), root, keys,
                                      events, batches)
        else:
            print(f"{_CASE}: ${_PG_ENV} is not set or psycopg is missing; PostgreSQL left out",
                  file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out

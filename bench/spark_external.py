"""End-to-end Spark case on external keyed state: the running count per key of
:mod:`bench.spark_e2e` through :class:`statecore.spark.StatefulOperator` with its keyed state in
memory (native backend, a checkpoint every micro-batch), in Redis and in PostgreSQL
(``state_store=``, native cache), on ``local[2]`` with parallelism 2.

Workload: ``events`` int64 keys uniform over ``keys`` distinct values (2M over 200k; ``--quick``
200k over 20k) in ``files`` Parquet files, one micro-batch each (4; ``--quick`` 3), read with
``readStream.parquet(maxFilesPerTrigger=1)`` and ``trigger(availableNow=True)`` into Spark's
``noop`` sink. Then a restart: the Spark session is stopped (its Python workers, with the
operator's cached state, end) and started again, one more file of ``events / files`` rows
lands, and the query runs again: one micro-batch that an in-memory operator begins by restoring
the previous version from its checkpoint and an external one by reading the key groups it
touches through from the store.

Records (impl ``native+checkpoint``, ``redis``, ``postgres``): ``events_per_s`` (the first
query's events over its wall-clock seconds, micro-batch planning included);
``first_batch_after_restart_s`` (the restarted query's micro-batch, as the operator reports
it: restore or read-through, processing and commit); per micro-batch of the first query:
``checkpoint_bytes_per_batch`` (in memory: the runs written), for Redis
``commands_per_batch``, ``net_in_bytes_per_batch`` and ``net_out_bytes_per_batch`` (``INFO
stats`` deltas: the commands the server ran, those of the commit scripts included, and the
bytes it received and sent), for PostgreSQL ``transactions_per_batch`` and
``rows_written_per_batch`` (``pg_stat_database`` deltas of the database: commits and rows
inserted + updated + deleted; read after the session stopped, when every connection's
statistics are flushed). After each query the committed counts are checked against numpy's
``bincount`` (RuntimeError otherwise).

Redis: a Debian ``redis-server`` started on a free loopback port (no persistence), left out
without it or the ``redis`` client. PostgreSQL: the server of ``$STATECORE_BENCH_POSTGRES``
(as :mod:`bench.external_store`), left out without it or psycopg.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import has_native
from bench.external_servers import drop_postgres_namespace, redis_server, redis_stats
from bench.harness import Size, case, record
from bench.spark_e2e import RunningCount, make_stream

__all__ = ["run_query"]

_CASE = "spark_running_count_external"
_MP = 128
_PARALLELISM = 2
_PG_ENV = "STATECORE_BENCH_POSTGRES"


def _noop(df, _version) -> None:
    df.write.format("noop").mode("overwrite").save()


def _session():
    from statecore.spark import local_session

    return local_session("statecore-bench", master="local[2]", shuffle_partitions=2)


def run_query(spark, landing: str, workdir: str, state_store=None, namespace=None):
    """Run the running count over the files of ``landing`` not yet processed by the streaming
    checkpoint under ``workdir`` (``trigger(availableNow=True)``), keyed state in memory or in
    ``state_store``; returns ``(seconds, operator)``. Errors: the query's."""
    from pyspark.sql.types import LongType, StructField, StructType

    from statecore.spark import StatefulOperator

    op = StatefulOperator("count", RunningCount(), "k", os.path.join(workdir, "state"),
                          sink=_noop, parallelism=_PARALLELISM, max_parallelism=_MP,
                          backend="native", state_store=state_store,
                          state_namespace=namespace,
                          # A first epoch's commit on a busy 2-core machine can exceed 10 s.
                          state_store_timeout_s=300.0)
    source = (spark.readStream.schema(StructType([StructField("k", LongType())]))
              .option("maxFilesPerTrigger", 1).option("maxFileAge", "36500d").parquet(landing))
    t0 = time.perf_counter()
    query = (source.writeStream.foreachBatch(op)
             .option("checkpointLocation", os.path.join(workdir, "spark"))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination()
    finally:
        if query.isActive:
            query.stop()
    return time.perf_counter() - t0, op


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
    spark.stop()  # the restart: the Python workers and the state they cache end
    out = [record(_CASE, name, "events_per_s", events / secs, "events/s")]
    if store is None:
        out.append(record(_CASE, name, "checkpoint_bytes_per_batch", ckpt_bytes / batches,
                          "bytes"))
    else:
        delta = (store[2]() - before) / batches
        labels = (("commands_per_batch", "commands"), ("net_in_bytes_per_batch", "bytes"),
                  ("net_out_bytes_per_batch", "bytes")) if store[0] == "redis" else (
                  ("transactions_per_batch", "transactions"),
                  ("rows_written_per_batch", "rows"))
        out += [record(_CASE, name, m, v, u) for (m, u), v in zip(labels, delta)]
    new_file()
    spark = _session()
    _secs, op = run_query(spark, landing, work, url, ns)
    last = op.reports[-1]
    files = sorted(os.path.join(landing, f) for f in os.listdir(landing))
    _check_counts(op, files, keys)
    out.append(record(_CASE, name, "first_batch_after_restart_s", last.seconds, "s"))
    print(f"  {_CASE}: {name:<18} {events / secs:>10,.0f} events/s; after the restart "
          f"{last.seconds:.2f} s (loads {last.loads})")
    if store is not None and store[0] == "postgres":
        drop_postgres_namespace(url, ns)
    return out


@case(_CASE, "running count through Structured Streaming local[2] with the keyed state in memory "
             "(native, checkpoints), in Redis and in PostgreSQL: events/s, store round trips "
             "and bytes per micro-batch, the first micro-batch after a restart")
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
        pg = os.environ.get(_PG_ENV)
        try:
            import psycopg  # noqa: F401
        except ImportError:
            pg = None
        if pg:
            out += _variant("postgres", *prepare("postgres"), keys, events, batches,
                            ("postgres", pg, lambda: _pg_stats(pg)))
        else:
            print(f"{_CASE}: ${_PG_ENV} is not set or psycopg is missing; PostgreSQL left out",
                  file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out

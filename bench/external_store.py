"""External keyed state in PostgreSQL: one epoch's writes (``put_batch``, ``pre_commit``,
``commit_epoch``) and a new task's read-through against plain psycopg upserts into a
``(key bigint primary key, value bigint)`` table of the same server in the same run.

The server is the one of ``$STATECORE_BENCH_POSTGRES`` (a ``postgresql://`` URL of a
database the benchmark may create tables in); without it, or without psycopg, the case is left
out (stderr). Workload: one int64 ValueState, keys ``0 .. n-1`` written once as a new epoch
and once more as the next epoch (updates), n = 200k (``--quick``: 50k); native cache (python
when the extension is missing). Every figure is the median of three repetitions, in rows/s:

* ``epoch_insert`` / ``epoch_update``: ``put_batch`` of n rows, ``pre_commit`` (one ``COPY``)
  and ``commit_epoch`` of a new / the next epoch;
* ``read_through``: a new backend's ``get_batch`` of every key (one query);
* peers ``psycopg_loop``: one ``INSERT ... ON CONFLICT DO UPDATE`` per row in one transaction
  (``cursor.execute`` in a loop); ``psycopg_executemany``: the same statement through
  ``executemany`` (pipelined); ``psycopg_copy``: ``COPY`` of the rows into an empty table.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import uuid

import pyarrow as pa

from bench.common import has_native
from bench.external_servers import drop_postgres_namespace
from bench.harness import Size, case, record

_REPEAT = 3
_ENV = "STATECORE_BENCH_POSTGRES"


def _median_rate(n: int, fn) -> float:
    times = []
    for _ in range(_REPEAT):
        times.append(fn())
    return n / statistics.median(times)


@case("external_postgres", "external state in PostgreSQL: rows/s of put_batch + pre_commit + "
                           "commit_epoch and of a read-through vs psycopg upserts (loop, "
                           "executemany, COPY); needs $STATECORE_BENCH_POSTGRES")
def external_postgres(size: Size):
    """Records: impl ``statecore_<cache>``: ``epoch_insert``, ``epoch_update``,
    ``read_through`` (rows/s); impls ``psycopg_loop``, ``psycopg_executemany``,
    ``psycopg_copy``: ``upsert`` (rows/s, COPY: insert); ``ratio_epoch_update_over_loop`` and
    ``ratio_epoch_update_over_executemany``."""
    c = "external_postgres"
    url = os.environ.get(_ENV)
    try:
        import psycopg
    except ImportError:
        print(f"{c}: psycopg is not installed (statecore[postgres]); case left out",
              file=sys.stderr)
        return []
    if not url:
        print(f"{c}: ${_ENV} is not set (a postgresql:// URL); case left out", file=sys.stderr)
        return []
    from statecore import ValueStateDescriptor, create_backend
    from statecore.external import commit_epoch

    cache = "native" if has_native() else "python"
    impl = f"statecore_{cache}"
    n = size.n(200_000, 50_000)
    keys = pa.array(range(n), pa.int64())
    out = [record(c, impl, "entries", n, "entries")]
    figures: dict = {}

    def epoch_run(new_namespace: bool):
        ns = f"bench/{uuid.uuid4().hex}"
        b = create_backend("postgres", url=url, namespace=ns, cache=cache)
        try:
            st = b.get_state(ValueStateDescriptor("v", "int64"))
            epoch = 1
            if not new_namespace:
                st.put_batch(keys, keys)
                commit_epoch(url, ns, 1, [b.pre_commit(1)])
                b.notify_committed(1)
                epoch = 2
            t0 = time.perf_counter()
            st.put_batch(keys, pa.array(range(1, n + 1), pa.int64()))
            commit_epoch(url, ns, epoch, [b.pre_commit(epoch)])
            took = time.perf_counter() - t0
            fresh = create_backend("postgres", url=url, namespace=ns, cache=cache)
            fs = fresh.get_state(ValueStateDescriptor("v", "int64"))
            t0 = time.perf_counter()
            fs.get_batch(keys)
            figures.setdefault("read", []).append(time.perf_counter() - t0)
            fresh.dispose()
            return took
        finally:
            b.dispose()
            drop_postgres_namespace(url, ns)

    figures["insert"] = _median_rate(n, lambda: epoch_run(True))
    figures["update"] = _median_rate(n, lambda: epoch_run(False))
    out += [record(c, impl, "epoch_insert", figures["insert"], "rows/s"),
            record(c, impl, "epoch_update", figures["update"], "rows/s"),
            record(c, impl, "read_through", n / statistics.median(figures["read"]), "rows/s")]

    rows = [(k, k + 1) for k in range(n)]
    upsert = ("INSERT INTO bench_kv (k, v) VALUES (%s, %s) "
              "ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v")

    def peer(kind: str) -> float:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS bench_kv")
            conn.execute("CREATE TABLE bench_kv (k bigint PRIMARY KEY, v bigint)")
            if kind != "copy":  # upserts of existing rows, as epoch_update
                with conn.cursor().copy("COPY bench_kv (k, v) FROM STDIN") as cp:
                    for r in rows:
                        cp.write_row(r)
            t0 = time.perf_counter()
            with conn.transaction(), conn.cursor() as cur:
                if kind == "loop":
                    for r in rows:
                        cur.execute(upsert, r)
                elif kind == "executemany":
                    cur.executemany(upsert, rows)
                else:
                    with cur.copy("COPY bench_kv (k, v) FROM STDIN (FORMAT BINARY)") as cp:
                        cp.set_types(["int8", "int8"])
                        for r in rows:
                            cp.write_row(r)
            took = time.perf_counter() - t0
            conn.execute("DROP TABLE bench_kv")
            return took

    for kind in ("loop", "executemany", "copy"):
        figures[kind] = _median_rate(n, lambda kind=kind: peer(kind))
        out.append(record(c, f"psycopg_{kind}", "upsert", figures[kind], "rows/s"))
    out += [record(c, impl, "ratio_epoch_update_over_loop", figures["update"] / figures["loop"],
                   "ratio"),
            record(c, impl, "ratio_epoch_update_over_executemany",
                   figures["update"] / figures["executemany"], "ratio")]
    return out

"""External state case: a running count per key with its committed copy in Redis
(``create_backend("redis")``), against the in-memory native backend checkpointing every
micro-batch, and against what users write today in ``foreachBatch`` with a plain Redis client.

A Debian ``redis-server`` is started on a free loopback port (no persistence) for the run; the
case is left out without ``redis-server`` or the ``redis`` client. Workload: ``n`` int64 keys
(1M / 100k), micro-batches of ``rows`` uniformly random keys (500k / 100k), 4 of them; one task
owning every key group of max parallelism 128. Per micro-batch, each variant:

* ``redis+native_cache`` / ``redis+python_cache``: ``ReducingState.add_batch`` (sum) in
  64k-row Arrow batches, then ``pre_commit(epoch)``, ``commit_epoch`` and
  ``notify_committed`` -- exactly-once, the committed copy readable by other services;
* ``native+checkpoint``: the same rows into the in-memory native backend, then an incremental
  checkpoint (``CheckpointStore.checkpoint``) to a local temporary directory;
* ``client_pipelined``: one ``HINCRBY`` per row into one hash, pipelined, executed every 10k
  rows (at-least-once: a replayed micro-batch counts twice);
* ``client_per_row``: ``HGET`` then ``HSET`` per row, one round trip each (the read-modify-write
  loop), on the first 20k / 5k rows of each micro-batch only, scaled to rows/s.

Metrics (impl = variant): ``rows_per_s`` (all micro-batches, commits included);
``{process,pre_commit,commit}_s_per_batch`` (external variants); ``commands_per_batch`` and
``net_in_bytes_per_batch`` / ``net_out_bytes_per_batch`` (Redis ``INFO stats`` deltas per
micro-batch: the commands the server ran -- those a commit script runs included -- and the bytes
it received and sent); ``key_groups_read_through`` (the cache's
misses: key groups read from Redis, all in the first micro-batch); and recovery:
``first_batch_after_restart_s`` (a new backend on the namespace: the first 64k-row
``add_batch``, which reads through the key groups it touches) against ``native+checkpoint``'s
``restore_s`` (a new native backend restoring the whole state from its checkpoint), and
``ratio_over_native`` of ``rows_per_s``. The external variants check that Redis then holds
the last epoch and counts every row (``read_committed``), else the case raises RuntimeError.
"""

from __future__ import annotations

import shutil
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)

from bench.common import has_native
from bench.external_servers import redis_server, redis_stats
from bench.harness import Size, case, record
from statecore import CheckpointStore, ReducingStateDescriptor, create_backend

_CASE = "external_redis"
_BATCH = 65_536
_MP = 128
_BATCHES = 4
_PIPELINE_ROWS = 10_000


def _micro_batches(n: int, rows: int) -> list:
    rng = np.random.default_rng(7)
    return [rng.integers(0, n, rows, dtype=np.int64) for _ in range(_BATCHES)]


def _add(state, keys: np.ndarray) -> None:
    ones = pa.array(np.ones(_BATCH, dtype=np.int64))
    for i in range(0, len(keys), _BATCH):
        k = pa.array(keys[i:i + _BATCH])
        state.add_batch(k, ones.slice(0, len(k)))


def _external(client, url: str, cache: str, batches: list) -> dict:
    from statecore.external import commit_epoch, read_committed

    ns = f"bench/{cache}"
    b = create_backend("redis", url=url, namespace=ns, key_type="int64", max_parallelism=_MP,
                       cache=cache)
    st = b.get_state(ReducingStateDescriptor("count", "sum", "int64"))
    phases = np.zeros(3)
    deltas = []
    t0 = time.perf_counter()
    for epoch, keys in enumerate(batches):
        before = redis_stats(client)
        ta = time.perf_counter()
        _add(st, keys)
        tb = time.perf_counter()
        wal = b.pre_commit(epoch)
        tc = time.perf_counter()
        commit_epoch(client, ns, epoch, [wal])
        b.notify_committed(epoch)
        td = time.perf_counter()
        phases += (tb - ta, tc - tb, td - tc)
        deltas.append(redis_stats(client) - before)
    total = time.perf_counter() - t0
    read_through = len(b.loaded_key_groups)
    b.dispose()
    committed = read_committed(client, ns, "count")
    counted = pa.compute.sum(committed.table.column("value")).as_py()
    if committed.epoch != len(batches) - 1 or counted != sum(map(len, batches)):
        raise RuntimeError(f"{_CASE}: Redis holds epoch {committed.epoch} counting {counted} "
                           f"rows, expected epoch {len(batches) - 1} and "
                           f"{sum(map(len, batches))} rows")
    # Recovery: a new task on the namespace; its first batch reads its key groups through.
    r = create_backend("redis", url=url, namespace=ns, key_type="int64", max_parallelism=_MP,
                       cache=cache)
    st = r.get_state(ReducingStateDescriptor("count", "sum", "int64"))
    t = time.perf_counter()
    _add(st, batches[0][:_BATCH])
    first = time.perf_counter() - t
    r.dispose()
    d = np.mean(deltas, axis=0)
    return {"rows_per_s": sum(map(len, batches)) / total,
            "process_s_per_batch": phases[0] / len(batches),
            "pre_commit_s_per_batch": phases[1] / len(batches),
            "commit_s_per_batch": phases[2] / len(batches),
            "commands_per_batch": d[0], "net_in_bytes_per_batch": d[1],
            "net_out_bytes_per_batch": d[2], "key_groups_read_through": read_through,
            "first_batch_after_restart_s": first}


def _native(batches: list) -> dict:
    root = tempfile.mkdtemp(prefix="statecore-bench-external-")
    try:
        store = CheckpointStore(root)
        b = create_backend("native", key_type="int64", max_parallelism=_MP)
        st = b.get_state(ReducingStateDescriptor("count", "sum", "int64"))
        t0 = time.perf_counter()
        for v, keys in enumerate(batches):
            _add(st, keys)
            store.checkpoint(b, v)
        total = time.perf_counter() - t0
        b.dispose()
        r = create_backend("native", key_type="int64", max_parallelism=_MP)
        r.get_state(ReducingStateDescriptor("count", "sum", "int64"))
        t = time.perf_counter()
        store.restore(r)
        restore = time.perf_counter() - t
        r.dispose()
        return {"rows_per_s": sum(map(len, batches)) / total, "restore_s": restore}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _pipelined(client, batches: list) -> dict:
    deltas = []
    t0 = time.perf_counter()
    for keys in batches:
        before = redis_stats(client)
        pipe = client.pipeline(transaction=False)
        for i, k in enumerate(keys.tolist()):
            pipe.hincrby("plain:pipelined", k, 1)
            if (i + 1) % _PIPELINE_ROWS == 0:
                pipe.execute()
        pipe.execute()
        deltas.append(redis_stats(client) - before)
    total = time.perf_counter() - t0
    d = np.mean(deltas, axis=0)
    return {"rows_per_s": sum(map(len, batches)) / total, "commands_per_batch": d[0],
            "net_in_bytes_per_batch": d[1], "net_out_bytes_per_batch": d[2]}


def _per_row(client, batches: list, sample: int) -> dict:
    rows = 0
    t0 = time.perf_counter()
    for keys in batches:
        for k in keys[:sample].tolist():
            old = client.hget("plain:per_row", k)
            client.hset("plain:per_row", k, (int(old) if old is not None else 0) + 1)
            rows += 1
    return {"rows_per_s": rows / (time.perf_counter() - t0)}


_UNITS = {"rows_per_s": "rows/s", "commands_per_batch": "commands",
          "net_in_bytes_per_batch": "bytes", "net_out_bytes_per_batch": "bytes",
          "key_groups_read_through": "key groups"}


@case(_CASE, "running count with its committed copy in Redis (exactly-once per micro-batch) "
             "vs the native backend with checkpoints vs plain redis-py loops")
def external_redis(size: Size) -> list:
    if not has_native():
        return []
    n, rows = size.n(1_000_000, 100_000), size.n(500_000, 100_000)
    batches = _micro_batches(n, rows)
    out = [record(_CASE, "workload", "distinct_keys", n, "keys"),
           record(_CASE, "workload", "rows_per_batch", rows, "rows")]
    with redis_server(_CASE) as server:
        if server is None:
            return []
        client, url = server
        results = {"native+checkpoint": _native(batches)}
        for cache in ("native", "python"):
            results[f"redis+{cache}_cache"] = _external(client, url, cache, batches)
        results["client_pipelined"] = _pipelined(client, batches)
        results["client_per_row"] = _per_row(client, batches, size.n(20_000, 5_000))
    native = results["native+checkpoint"]["rows_per_s"]
    for impl, figures in results.items():
        for metric, value in figures.items():
            unit = _UNITS.get(metric, "s" if metric.endswith("_s") or "_s_" in metric
                              else "count")
            out.append(record(_CASE, impl, metric, float(value), unit))
        if impl != "native+checkpoint":
            out.append(record(_CASE, impl, "ratio_over_native",
                              figures["rows_per_s"] / native, "ratio"))
    return out

"""Map state per entry: the cost of one map operation as the map of one key grows.

Map state keeps one table entry per user key (docs/formats.md "Map state"), so every operation
on one user key should cost the same whatever the size of the map: the curves here should be
flat. Workload: MapState int64 user key -> int64 value, one key (0), void namespace; user keys
0..n-1 for n = 10, 1k, 100k and 1M (python: up to 100k; ``--quick``: 10, 1k, 10k for both).

* ``put_batch``: ``put_batch`` of the n rows of the key into an empty map (64k-row batches),
  microseconds per row;
* ``get_batch``: ``get_batch`` of the same n rows, microseconds per row;
* per record (``set_current_key(0)`` once, then ``OPS`` operations on random user keys of the
  full map): ``get``, ``contains``, ``put`` (an existing user key: overwrites), ``remove`` then
  ``put`` back (the pair, so the map keeps its size), microseconds per operation;
* ``items``: one ``items()`` of the whole map, microseconds per entry;
* memory: ``state_bytes()`` per entry (keys and values as stored) and, native, the estimated
  bytes of the map index (``map_index_stats``) per entry.

Checkpoint bytes (``checkpoint_*``): the 100k-entry map (``--quick``: 10k) checkpointed with
``CheckpointStore.checkpoint`` (full), then one user key changed and checkpointed again
(incremental): the stored bytes of each run and the entries the incremental run holds.
"""

from __future__ import annotations

import random
import time

import numpy as np
import pyarrow as pa

from bench.collection_sizes import BATCH, OPS, checkpoint_records, impls, per_us, sizes
from bench.harness import Size, case, record
from statecore import MapStateDescriptor, create_backend

_CASE = "map_entries"


def _backend(impl: str):
    b = create_backend(impl, key_type="int64", max_parallelism=128)
    st = b.get_state(MapStateDescriptor("m", "int64", "int64"))
    return b, st


def _batches(n: int) -> list:
    uks = np.arange(n, dtype=np.int64)
    return [(pa.array(np.zeros(min(BATCH, n - i), np.int64)), pa.array(uks[i:i + BATCH]),
             pa.array(uks[i:i + BATCH] * 2)) for i in range(0, n, BATCH)]


def _run(impl: str, n: int) -> list:
    b, st = _backend(impl)
    batches = _batches(n)
    t = time.perf_counter()
    for k, u, v in batches:
        st.put_batch(k, u, v)
    put_batch = time.perf_counter() - t
    t = time.perf_counter()
    for k, u, _ in batches:
        st.get_batch(k, u)
    get_batch = time.perf_counter() - t
    b.set_current_key(0)
    rng = random.Random(n)
    picks = [rng.randrange(n) for _ in range(OPS)]
    out = [record(_CASE, impl, f"put_batch_us_per_row_{n}", per_us(put_batch, n), "us"),
           record(_CASE, impl, f"get_batch_us_per_row_{n}", per_us(get_batch, n), "us")]
    for name, fn in (("get", lambda uk: st.get(uk)),
                     ("contains", lambda uk: st.contains(uk)),
                     ("put", lambda uk: st.put(uk, uk)),
                     ("remove_put", lambda uk: (st.remove(uk), st.put(uk, uk)))):
        t = time.perf_counter()
        for uk in picks:
            fn(uk)
        out.append(record(_CASE, impl, f"{name}_us_per_op_{n}",
                          per_us(time.perf_counter() - t, OPS), "us"))
    t = time.perf_counter()
    items = st.items()
    out.append(record(_CASE, impl, f"items_us_per_entry_{n}",
                      per_us(time.perf_counter() - t, len(items)), "us"))
    assert len(items) == n and st.size() == n
    # Memory per entry: the table's key and value bytes, and (native) the index of user keys.
    out.append(record(_CASE, impl, f"state_bytes_per_entry_{n}", b.state_bytes() / n, "bytes"))
    if impl == "native":
        ix = b.map_index_stats()["m"]
        out.append(record(_CASE, impl, f"index_bytes_per_entry_{n}", ix["bytes"] / n, "bytes"))
    b.dispose()
    return out


def _checkpoint_bytes(impl: str, n: int) -> list:
    b, st = _backend(impl)
    for k, u, v in _batches(n):
        st.put_batch(k, u, v)
    return checkpoint_records(_CASE, impl, n, b, "m", lambda: st.put(n // 2, -1))


def _panel(r) -> object:
    m = r["metric"]
    if m.startswith("checkpoint_"):
        return ("checkpoint bytes after one change", m)
    if "bytes_per_entry" in m:
        return ("bytes per entry", f"{r['impl']} {m}")
    op, _, n = m.rpartition("_")
    return (f"us per {op.split('_us_')[0]} (one key's map)", f"{r['impl']} n={n}")


@case(_CASE, "MapState per entry: one user key's cost at 10 .. 1M entries per key, and the "
      "incremental checkpoint after one change", panel=_panel)
def map_entries(size: Size):
    out = []
    for impl in impls():
        _run(impl, 10)  # warm-up, untimed: the first calls of a process pay one-off costs
        for n in sizes(size, impl):
            out.extend(_run(impl, n))
        out.extend(_checkpoint_bytes(impl, 10_000 if size.quick else 100_000))
    return out

"""Chunked list state: the cost of one list operation as the list of one key grows.

List state keeps a list as chunks of up to ``LIST_CHUNK_ELEMENTS`` elements, each one table
entry (docs/formats.md "List state"), so appending to a list should cost the same whatever its
size (the per-append curves flat) and reading it the same per element. Workload: ListState of
int64 elements, one key (0), void namespace; lists of n = 10, 1k, 100k and 1M elements
(python: up to 100k; ``--quick``: 10, 1k, 10k for both).

* ``append_batch``: ``append_batch`` of n rows of the key (one element a row, 64k-row
  batches) into an empty list, microseconds per row;
* ``get_batch``: ``get_batch`` of one row of the key (the whole list), microseconds per element;
* per record (``set_current_key(0)`` once, on the full list): ``add`` of ``OPS`` elements,
  microseconds per add; ``get``: one ``get()`` of the whole list, microseconds per element;
* memory: ``state_bytes()`` per element (keys and values as stored) and, native, the
  estimated bytes of the list index of chunks (``list_index_stats``) per element.

Checkpoint bytes (``checkpoint_*``): the 100k-element list (``--quick``: 10k) checkpointed with
``CheckpointStore.checkpoint`` (full), then one element appended and checkpointed again
(incremental): the stored bytes of each run and the entries the incremental run holds.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from bench.collection_sizes import BATCH, OPS, checkpoint_records, impls, per_us, sizes
from bench.harness import Size, case, record
from statecore import ListStateDescriptor, create_backend

_CASE = "list_entries"


def _backend(impl: str):
    b = create_backend(impl, key_type="int64", max_parallelism=128)
    st = b.get_state(ListStateDescriptor("l", "int64"))
    return b, st


def _batches(n: int) -> list:
    vals = np.arange(n, dtype=np.int64)
    return [(pa.array(np.zeros(min(BATCH, n - i), np.int64)), pa.array(vals[i:i + BATCH]))
            for i in range(0, n, BATCH)]


def _run(impl: str, n: int) -> list:
    b, st = _backend(impl)
    batches = _batches(n)
    t = time.perf_counter()
    for k, v in batches:
        st.append_batch(k, v)
    append_batch = time.perf_counter() - t
    t = time.perf_counter()
    got = st.get_batch(pa.array([0], pa.int64()))
    get_batch = time.perf_counter() - t
    assert len(got.values) == n
    b.set_current_key(0)
    t = time.perf_counter()
    for i in range(OPS):
        st.add(i)
    add = time.perf_counter() - t
    t = time.perf_counter()
    elements = st.get()
    get = time.perf_counter() - t
    assert len(elements) == n + OPS
    out = [record(_CASE, impl, f"append_batch_us_per_row_{n}", per_us(append_batch, n), "us"),
           record(_CASE, impl, f"get_batch_us_per_element_{n}", per_us(get_batch, n), "us"),
           record(_CASE, impl, f"add_us_per_op_{n}", per_us(add, OPS), "us"),
           record(_CASE, impl, f"get_us_per_element_{n}", per_us(get, n + OPS), "us"),
           record(_CASE, impl, f"state_bytes_per_element_{n}", b.state_bytes() / (n + OPS),
                  "bytes")]
    if impl == "native" and hasattr(b, "list_index_stats"):  # absent before the list index
        ix = b.list_index_stats()["l"]
        out.append(record(_CASE, impl, f"index_bytes_per_element_{n}",
                          ix["bytes"] / (n + OPS), "bytes"))
    b.dispose()
    return out


def _checkpoint_bytes(impl: str, n: int) -> list:
    b, st = _backend(impl)
    for k, v in _batches(n):
        st.append_batch(k, v)
    return checkpoint_records(_CASE, impl, n, b, "l", lambda: st.add(-1))


def _panel(r) -> object:
    m = r["metric"]
    if m.startswith("checkpoint_"):
        return ("checkpoint bytes after one append", m)
    if "bytes_per_element" in m:
        return ("bytes per element", f"{r['impl']} {m}")
    op, _, n = m.rpartition("_")
    return (f"us per {op.split('_us_')[0]} (one key's list)", f"{r['impl']} n={n}")


@case(_CASE, "ListState in chunks: one key's append and read cost at 10 .. 1M elements per "
      "key, and the incremental checkpoint after one append", panel=_panel)
def list_entries(size: Size):
    out = []
    for impl in impls():
        _run(impl, 10)  # warm-up, untimed: the first calls of a process pay one-off costs
        for n in sizes(size, impl):
            out.extend(_run(impl, n))
        out.extend(_checkpoint_bytes(impl, 10_000 if size.quick else 100_000))
    return out

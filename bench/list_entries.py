"""List state per element: the cost of one list operation as the list of one key grows.

List state keeps one table entry per element (docs/formats.md "List state"), so appending to a
list should cost the same whatever its size (the per-append curves flat) and reading it the
same per element. Workload: ListState of int64 elements, one key (0), void namespace; lists of
n = 10, 1k, 100k and 1M elements (python: up to 100k; ``--quick``: 10, 1k, 10k for both).

* ``append_batch``: ``append_batch`` of n rows of the key (one element a row, 64k-row
  batches) into an empty list, microseconds per row;
* ``get_batch``: ``get_batch`` of one row of the key (the whole list), microseconds per element;
* per record (``set_current_key(0)`` once, on the full list): ``add`` of ``_OPS`` elements,
  microseconds per add; ``get``: one ``get()`` of the whole list, microseconds per element;
* memory: ``state_bytes()`` per element (keys and values as stored) and, native, the
  estimated bytes of the list index (``list_index_stats``) per element.

Checkpoint bytes (``checkpoint_*``): the 100k-element list (``--quick``: 10k) checkpointed with
``CheckpointStore.checkpoint`` (full), then one element appended and checkpointed again
(incremental): the stored bytes of each run and the entries the incremental run holds.
"""

from __future__ import annotations

import shutil
import tempfile
import time

import numpy as np
import pyarrow as pa

from bench.common import has_native
from bench.harness import Size, case, record
from statecore import ListStateDescriptor, create_backend
from statecore.checkpoint import CheckpointStore

_CASE = "list_entries"
_OPS = 2000
_BATCH = 65536


def _impls() -> list:
    return (["native"] if has_native() else []) + ["python"]


def _sizes(size: Size, impl: str) -> list:
    if size.quick:
        return [10, 1000, 10_000]
    return [10, 1000, 100_000] + ([1_000_000] if impl == "native" else [])


def _backend(impl: str):
    b = create_backend(impl, key_type="int64", max_parallelism=128)
    st = b.get_state(ListStateDescriptor("l", "int64"))
    return b, st


def _batches(n: int) -> list:
    vals = np.arange(n, dtype=np.int64)
    return [(pa.array(np.zeros(min(_BATCH, n - i), np.int64)), pa.array(vals[i:i + _BATCH]))
            for i in range(0, n, _BATCH)]


def _per_us(seconds: float, count: int) -> float:
    return seconds * 1e6 / max(count, 1)


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
    for i in range(_OPS):
        st.add(i)
    add = time.perf_counter() - t
    t = time.perf_counter()
    elements = st.get()
    get = time.perf_counter() - t
    assert len(elements) == n + _OPS
    out = [record(_CASE, impl, f"append_batch_us_per_row_{n}", _per_us(append_batch, n), "us"),
           record(_CASE, impl, f"get_batch_us_per_element_{n}", _per_us(get_batch, n), "us"),
           record(_CASE, impl, f"add_us_per_op_{n}", _per_us(add, _OPS), "us"),
           record(_CASE, impl, f"get_us_per_element_{n}", _per_us(get, n + _OPS), "us"),
           record(_CASE, impl, f"state_bytes_per_element_{n}", b.state_bytes() / (n + _OPS),
                  "bytes")]
    if impl == "native" and hasattr(b, "list_index_stats"):  # absent before per-element lists
        ix = b.list_index_stats()["l"]
        out.append(record(_CASE, impl, f"index_bytes_per_element_{n}",
                          ix["bytes"] / (n + _OPS), "bytes"))
    b.dispose()
    return out


def _checkpoint_bytes(impl: str, n: int) -> list:
    b, st = _backend(impl)
    for k, v in _batches(n):
        st.append_batch(k, v)
    root = tempfile.mkdtemp(prefix="statecore-bench-")
    try:
        store = CheckpointStore(root)
        full = store.checkpoint(b, 1)
        b.set_current_key(0)
        st.add(-1)
        inc = store.checkpoint(b, 2)
        d1, d2 = store.describe(1), store.describe(2)
        assert full["files"] and inc["files"]
        return [record(_CASE, impl, f"checkpoint_full_bytes_{n}", d1["bytes_added"], "bytes"),
                record(_CASE, impl, f"checkpoint_incremental_bytes_{n}", d2["bytes_added"],
                       "bytes"),
                record(_CASE, impl, f"checkpoint_incremental_entries_{n}",
                       sum(r["entries"]["l"] for r in d2["run_list"] if r["version"] == 2),
                       "entries")]
    finally:
        b.dispose()
        shutil.rmtree(root, ignore_errors=True)


def _panel(r) -> object:
    m = r["metric"]
    if m.startswith("checkpoint_"):
        return ("checkpoint bytes after one append", m)
    if "bytes_per_element" in m:
        return ("bytes per element", f"{r['impl']} {m}")
    op, _, n = m.rpartition("_")
    return (f"us per {op.split('_us_')[0]} (one key's list)", f"{r['impl']} n={n}")


@case(_CASE, "ListState per element: one key's append and read cost at 10 .. 1M elements per "
      "key, and the incremental checkpoint after one append", panel=_panel)
def list_entries(size: Size):
    out = []
    for impl in _impls():
        _run(impl, 10)  # warm-up, untimed: the first calls of a process pay one-off costs
        for n in _sizes(size, impl):
            out.extend(_run(impl, n))
        out.extend(_checkpoint_bytes(impl, 10_000 if size.quick else 100_000))
    return out

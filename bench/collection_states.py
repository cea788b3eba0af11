"""Peer cases of the collection states, in the manner of :mod:`bench.peers` (same impls,
timing, ratio records, goals and plot panels; see its docstring and :mod:`bench.compare`):

* ``list_append`` -- ListState of int64 elements: ``append_batch(keys, values)``, every key of
  100k int64 keys appended to 10 times in random order (1M rows; ``--quick``: 20k keys, 200k
  rows), one element a row.
* ``map_put`` -- MapState int64 user key -> int64 value: ``put_batch(keys, user_keys, values)``,
  the same key stream, user keys drawn uniformly from 0..15 (so a user map holds up to 16 pairs
  and later puts mostly overwrite).
* ``list_get`` -- ListState get_batch of the lists ``list_append`` builds (every key 10 int64
  elements, built untimed): 1M get rows, every key 10 times in another random order
  (``--quick``: 200k), each row one ``list<int64>`` row of the result.
* ``map_get`` -- MapState get_batch on the maps ``map_put`` builds (untimed): 1M (key, user key)
  rows, user keys uniform in 0..15 (some absent: null).

For the get cases rocksdict (and python under ``--quick``) builds and reads a state of a tenth
of the keys (10k keys x 10 rows, 100k get rows; ``--quick`` 2k keys), so that each list / map
holds what it holds for the others (a smaller table only favours them, through the caches); in
full-size runs python reads the same state as native.

Impls: ``native`` / ``python`` (the backends, 64k-row batches; python on the whole stream, as
the goal is a ratio over it and a prefix holds shorter lists and smaller maps; ``--quick``: on a
prefix of 20k rows), ``dict`` (a dict of lists / of dicts fed from the same Arrow batches via
``to_numpy().tolist()``), ``rocksdict`` when importable (read-modify-write per row of a pickled
list / dict, on a prefix of 100k rows, ``--quick`` 20k: its figure is flattered by the shorter
lists and maps) and the C++ reference (``list``: ``Map<int64,
std::vector<int64>>`` push_back; ``map``: ``Map<int64, sorted vector of pairs>``, the
``list``/``map`` modes of ``cpp/hashmap_ref.cpp``). Records: ``rows_per_s_<n>_keys``,
``rows_measured_<n>_keys``, ratios over the C++ reference and over python, and the goal native
>= 20x python.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from typing import Callable, List, Tuple

import numpy as np
import pyarrow as pa

from bench.common import has_native, label
from bench.compare import TempRdict, measure, peer_panel, ratio_records, reference, rocksdict_module
from bench.harness import Size, case, record
from bench.workloads import int64_keys, pylist, row_order, slices
from statecore import ListStateDescriptor, MapStateDescriptor, create_backend

_REPS = 10
_USER_KEYS = 16


def _workload(size: Size, seed: int) -> Tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """``(distinct, keys, user_keys, values)``: int64 rows, every key ``_REPS`` times in random
    order, user keys uniform in 0..15, values the row index."""
    return _workload_of(size.n(100_000, 20_000), seed)


def _workload_of(distinct: int, seed: int) -> Tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    keys = int64_keys(distinct, seed=seed)[row_order(distinct, _REPS, seed=seed + 1)]
    uks = np.random.default_rng(seed + 2).integers(0, _USER_KEYS, len(keys)).astype(np.int64)
    return distinct, keys, uks, np.arange(len(keys), dtype=np.int64)


def _backend_run(kind: str, batches: list, is_map: bool) -> float:
    b = create_backend(kind, key_type="int64")
    if is_map:
        st = b.get_state(MapStateDescriptor("m", "int64", "int64"))
        t = time.perf_counter()
        for k, u, v in batches:
            st.put_batch(k, u, v)
    else:
        st = b.get_state(ListStateDescriptor("l", "int64"))
        t = time.perf_counter()
        for k, v in batches:
            st.append_batch(k, v)
    dt = time.perf_counter() - t
    b.close()
    return dt


def _dict_run(batches: list, is_map: bool) -> float:
    d: dict = {}
    t = time.perf_counter()
    if is_map:
        for k, u, v in batches:
            for key, uk, val in zip(pylist(k), pylist(u), pylist(v)):
                m = d.get(key)
                if m is None:
                    d[key] = {uk: val}
                else:
                    m[uk] = val
    else:
        for k, v in batches:
            for key, val in zip(pylist(k), pylist(v)):
                lst = d.get(key)
                if lst is None:
                    d[key] = [val]
                else:
                    lst.append(val)
    return time.perf_counter() - t


def _rocksdict_run(rocksdict, batches: list, is_map: bool) -> float:
    with TempRdict(rocksdict) as db:
        get = db.get
        t = time.perf_counter()
        if is_map:
            for k, u, v in batches:
                for key, uk, val in zip(pylist(k), pylist(u), pylist(v)):
                    m = get(key) or {}
                    m[uk] = val
                    db[key] = m
        else:
            for k, v in batches:
                for key, val in zip(pylist(k), pylist(v)):
                    lst = get(key)
                    db[key] = [val] if lst is None else lst + [val]
        return time.perf_counter() - t


def _collection_case(c: str, size: Size, is_map: bool) -> list:
    rdb, ref, native = rocksdict_module(), reference(), has_native()
    distinct, keys, uks, values = _workload(size, seed=11 if is_map else 21)
    slow_rows = size.n(100_000, 20_000)
    tag = f"{label(distinct)}_keys"
    cols = [pa.array(keys)] + ([pa.array(uks)] if is_map else []) + [pa.array(values)]
    full = list(zip(*(slices(a) for a in cols)))
    slow = list(zip(*(slices(a, slow_rows) for a in cols)))
    n_full, n_slow = len(keys), min(slow_rows, len(keys))
    runs: List[Tuple[str, int, Callable[[], float]]] = []
    if native:
        runs.append(("native", n_full, lambda: _backend_run("native", full, is_map)))
    py_rows, n_py = (slow, n_slow) if size.quick else (full, n_full)
    runs.append(("python", n_py, lambda: _backend_run("python", py_rows, is_map)))
    runs.append(("dict", n_full, lambda: _dict_run(full, is_map)))
    if rdb is not None:
        runs.append(("rocksdict", n_slow, lambda: _rocksdict_run(rdb, slow, is_map)))
    out: list = []
    workdir = tempfile.mkdtemp(prefix="statecore-bench-cpp-")
    try:
        if ref is not None:
            if is_map:
                runs.append((ref.impl, n_full,
                             lambda: ref.map_put(keys, uks, values, workdir)["seconds"]))
            else:
                runs.append((ref.impl, n_full,
                             lambda: ref.list_append(keys, values, workdir)["seconds"]))
        rates, measured = measure(c, tag, runs, ref.impl if ref else None)
        out += measured
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out.append(record(c, "workload", f"distinct_keys_{tag}", distinct, "keys"))
    out += ratio_records(c, tag, rates, ref.impl if ref else None, None)
    return out


@case("list_append", "ListState append_batch of int64 elements, 1M rows over 100k int64 keys: "
                     "native vs python vs dict vs rocksdict vs C++ hash map of vectors",
      panel=peer_panel)
def list_append(size: Size):
    """rows/s per impl (``rows_per_s_<n>_keys``), ratios and the goal native >= 20x python; see
    the module docstring. ``--quick``: 20k keys, 200k rows."""
    return _collection_case("list_append", size, is_map=False)


@case("map_put", "MapState put_batch int64 user key (0..15) -> int64, 1M rows over 100k int64 "
                 "keys: native vs python vs dict vs rocksdict vs C++ hash map of sorted vectors",
      panel=peer_panel)
def map_put(size: Size):
    """As ``list_append`` with ``put_batch(keys, user_keys, values)``."""
    return _collection_case("map_put", size, is_map=True)


# ------------------------------------------------------------------------------- get cases

def _get_stream(distinct: int, seed: int) -> Tuple[np.ndarray, np.ndarray]:
    """``(keys, user_keys)`` of the get rows: the workload's keys, each ``_REPS`` times in
    another random order, user keys uniform in 0..15."""
    keys = int64_keys(distinct, seed=seed)[row_order(distinct, _REPS, seed=seed + 3)]
    uks = np.random.default_rng(seed + 4).integers(0, _USER_KEYS, len(keys)).astype(np.int64)
    return keys, uks


def _backend_get_run(kind: str, puts: list, gets: list, is_map: bool) -> float:
    b = create_backend(kind, key_type="int64")
    if is_map:
        st = b.get_state(MapStateDescriptor("m", "int64", "int64"))
        for k, u, v in puts:
            st.put_batch(k, u, v)
        t = time.perf_counter()
        for k, u in gets:
            st.get_batch(k, u)
    else:
        st = b.get_state(ListStateDescriptor("l", "int64"))
        for k, v in puts:
            st.append_batch(k, v)
        t = time.perf_counter()
        for (k,) in gets:
            st.get_batch(k)
    dt = time.perf_counter() - t
    b.close()
    return dt


def _dict_fill(puts: list, is_map: bool) -> dict:
    d: dict = {}
    for row in puts:
        if is_map:
            for key, uk, val in zip(*(pylist(a) for a in row)):
                d.setdefault(key, {})[uk] = val
        else:
            for key, val in zip(*(pylist(a) for a in row)):
                d.setdefault(key, []).append(val)
    return d


def _dict_get_run(puts: list, gets: list, is_map: bool) -> float:
    d = _dict_fill(puts, is_map)
    get = d.get
    t = time.perf_counter()
    for row in gets:
        if is_map:
            out = []
            for key, uk in zip(pylist(row[0]), pylist(row[1])):
                m = get(key)
                out.append(None if m is None else m.get(uk))
        else:
            out = [get(key, []) for key in pylist(row[0])]
    return time.perf_counter() - t


def _rocksdict_get_run(rocksdict, puts: list, gets: list, is_map: bool) -> float:
    with TempRdict(rocksdict) as db:
        for key, val in _dict_fill(puts, is_map).items():
            db[key] = val
        get = db.get
        t = time.perf_counter()
        for row in gets:
            if is_map:
                out = []
                for key, uk in zip(pylist(row[0]), pylist(row[1])):
                    m = get(key)
                    out.append(None if m is None else m.get(uk))
            else:
                out = [get(key) or [] for key in pylist(row[0])]
        return time.perf_counter() - t


def _get_case(c: str, size: Size, is_map: bool) -> list:
    rdb, ref, native = rocksdict_module(), reference(), has_native()
    seed = 31 if is_map else 41
    distinct, keys, uks, values = _workload(size, seed)
    gkeys, guks = _get_stream(distinct, seed)
    small = max(1, size.n(100_000, 20_000) // _REPS)
    _, skeys, suks, svalues = _workload_of(small, seed)
    sgkeys, sguks = _get_stream(small, seed)
    tag = f"{label(distinct)}_keys"

    def batches(k, u, v, gk, gu):
        cols = [pa.array(k)] + ([pa.array(u)] if is_map else []) + [pa.array(v)]
        gcols = [pa.array(gk)] + ([pa.array(gu)] if is_map else [])
        return (list(zip(*(slices(a) for a in cols))), list(zip(*(slices(a) for a in gcols))))

    full_puts, full_gets = batches(keys, uks, values, gkeys, guks)
    slow_puts, slow_gets = batches(skeys, suks, svalues, sgkeys, sguks)
    n_full, n_slow = len(gkeys), len(sgkeys)
    runs: List[Tuple[str, int, Callable[[], float]]] = []
    if native:
        runs.append(("native", n_full, lambda: _backend_get_run("native", full_puts, full_gets,
                                                                 is_map)))
    # python reads the same state as native (see the module docstring), rocksdict the small one.
    py_puts, py_gets, n_py = ((slow_puts, slow_gets, n_slow) if size.quick
                              else (full_puts, full_gets, n_full))
    runs.append(("python", n_py, lambda: _backend_get_run("python", py_puts, py_gets, is_map)))
    runs.append(("dict", n_full, lambda: _dict_get_run(full_puts, full_gets, is_map)))
    if rdb is not None:
        runs.append(("rocksdict", n_slow, lambda: _rocksdict_get_run(rdb, slow_puts, slow_gets,
                                                                       is_map)))
    out: list = []
    workdir = tempfile.mkdtemp(prefix="statecore-bench-cpp-")
    try:
        if ref is not None:
            if is_map:
                runs.append((ref.impl, n_full, lambda: ref.map_get(
                    keys, uks, values, gkeys, guks, workdir)["seconds"]))
            else:
                runs.append((ref.impl, n_full, lambda: ref.list_get(
                    keys, values, gkeys, workdir)["seconds"]))
        rates, measured = measure(c, tag, runs, ref.impl if ref else None)
        out += measured
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out.append(record(c, "workload", f"distinct_keys_{tag}", distinct, "keys"))
    out += ratio_records(c, tag, rates, ref.impl if ref else None, None)
    return out


@case("list_get", "ListState get_batch of 10-element int64 lists, 1M rows over 100k int64 keys: "
                  "native vs python vs dict vs rocksdict vs C++ hash map of vectors",
      panel=peer_panel)
def list_get(size: Size):
    """rows/s per impl (``rows_per_s_<n>_keys``), ratios and the goal native >= 20x python; see
    the module docstring. ``--quick``: 20k keys, 200k rows."""
    return _get_case("list_get", size, is_map=False)


@case("map_get", "MapState get_batch int64 user key (0..15) -> int64, 1M rows over 100k int64 "
                 "keys: native vs python vs dict vs rocksdict vs C++ hash map of sorted vectors",
      panel=peer_panel)
def map_get(size: Size):
    """As ``list_get`` with ``get_batch(keys, user_keys)`` on the maps of ``map_put``."""
    return _get_case("map_get", size, is_map=True)

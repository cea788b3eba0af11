"""Peer cases: the native backend against the pure-Python backend and against what a Python
stream processor could use instead -- a Python ``dict``, ``rocksdict`` (the RocksDB binding) and
a C++ hash map compiled at run time (:mod:`bench.cpp_reference`: ``absl::flat_hash_map``, else
``std::unordered_map``; the practical limit of a hash map on the machine) -- all in one run, so
that the ratios between them mean something.

Cases (records ``rows/s`` per impl, ``ratio`` records, goals; see each function):

* ``wordcount_int64`` -- WordCount-style increment with int64 keys: for each row ``count[key] +=
  1`` and the running count per row as output (what ``ReducingState("count", "sum", "int64")
  .add_batch(keys, ones)`` returns), at 200k distinct keys (the state fits in cache) and 10M
  (it does not; ``--quick``: 2M).
* ``wordcount_string`` -- the same with 8-32 byte string keys, 200k and 10M distinct
  (``--quick``: 500k).
* ``binary_values`` -- ValueState ``put_batch`` then ``get_batch`` of 64-byte binary values by
  int64 key, 1M keys (``--quick``: 200k).
* ``memory_int64`` -- bytes per entry (RSS growth / entries, each in a fresh process) of int64 ->
  int64 state at 10M entries (``--quick``: 1M): native vs dict vs the C++ map.

The per-record API comparison is ``per_record`` in :mod:`bench.state_ops`.

Workloads (:mod:`bench.workloads`). Keys are distinct pseudo-random values (int64: a bijective
64-bit mix of 0..n-1; strings: 8 base-32 characters from a bijective 40-bit mix of the index,
padded with random lowercase letters to a uniformly random length of 8-32 bytes, mean 20). The
row stream holds every key exactly ``reps`` times in random order (200k keys: 10 times = 2M
rows, ``--quick`` 4; larger states: twice), so the distinct count is exact and half or more of
the rows update an existing key. Native and python get the rows as 64k-row Arrow slices of one
array.

Implementations (impl names):

* ``native`` / ``python`` -- ``add_batch`` / ``put_batch`` / ``get_batch`` of a fresh backend
  per run, one call per 64k-row batch; the per-row output arrays are built.
* ``dict`` -- a Python dict fed from the same Arrow batches (int64: ``to_numpy().tolist()``,
  faster than ``to_pylist()``; strings and binary values: ``to_pylist()``), ``d[k] = d.get(k,
  0) + 1`` per row, the per-row output made an Arrow array per batch as native returns one.
* ``rocksdict`` -- ``Rdict`` in a temporary directory with the defaults except the write-ahead
  log off (:class:`bench.compare.TempRdict`): per row ``db[k] = db.get(k, 0) + 1`` (``db[k] =
  v`` / ``db.get(k)`` for binary values). ``rocksdict+batch`` -- what a careful user would do
  per Arrow batch with its batch API: one multi-get (``db.get(list)``) of the batch's distinct
  keys, the increments in a dict, one ``WriteBatch`` written with ``db.write`` (binary values: a
  ``WriteBatch`` of the puts, a multi-get of the gets). rocksdict is optional (``pip install
  'statecore[bench]'``); without it the cases say so and leave it out.
* ``cpp_absl`` / ``cpp_unordered_map`` -- the C++ reference on the whole row stream written to
  files, timing only its loop (``std::chrono``), the per-row output array written too. Without a
  compiler the cases say so and leave it out (and the ratios to it).

Sizes: native, dict and the C++ reference run the whole row stream. So does python in full-size
runs, because the goals are ratios over it: a prefix would be mostly inserts into a state a tenth
of the size the others reach, which is not the same work. rocksdict, much slower, runs a prefix
(``rows_measured_*`` records say how many rows): its rows/s are normalised (rows / seconds) and
flattered by the smaller state. ``--quick`` runs python on that prefix too, to stay quick.

Timing: see :mod:`bench.compare` (best of up to three runs on fresh state; native and the C++
reference alternated). Workload generation and conversion to files (C++) are not timed;
converting an Arrow batch to Python objects (dict, rocksdict) is, as a Python user of these pays
it.

Ratios (``unit: "ratio"``, impl = the one measured): ``ratio_over_cpp_<tag>`` (rows/s over the
C++ reference's) and ``ratio_over_python_<tag>`` (over the python backend's). Goals, each as a
``goal_min_*`` / ``goal_max_*`` record (the threshold, drawn as a dashed line) and a
``goal_met_*`` record (1 met / 0 not, ``unit: "bool"``): batched increment (both key types)
native >= 0.5x the C++ reference in cache (200k keys) and >= 0.7x out of cache; native >= 20x
the python backend on batches (increments, puts, gets); <= 40 bytes per int64 -> int64 entry.
"""

from __future__ import annotations

import gc
import shutil
import tempfile
import time
from typing import Callable, Dict, List, Tuple

import numpy as np
import pyarrow as pa

from bench import cpp_reference
from bench.common import has_native, label, probe_in_child, rss_bytes
from bench.compare import (
    TempRdict,
    best,
    measure,
    peer_panel,
    ratio_records,
    reference,
    rocksdict_module,
)
from bench.harness import Size, case, record
from bench.workloads import (
    BATCH,
    int64_keys,
    pylist,
    row_order,
    slices,
    string_buffers,
    string_keys,
)
from bench.workloads import binary_values as make_binary_values
from statecore import ReducingStateDescriptor, ValueStateDescriptor, create_backend

_GOAL_CPP = {"in_cache": 0.5, "out_of_cache": 0.7}
_GOAL_MAX_BYTES_PER_ENTRY = 40.0


# --------------------------------------------------------------------------- increment impls

def _backend_counts(kind: str, key_type: str, batches: List[pa.Array]) -> float:
    """Seconds of ``add_batch(keys, ones)`` over ``batches`` on a fresh ``kind`` backend."""
    b = create_backend(kind, key_type=key_type)
    st = b.get_state(ReducingStateDescriptor("count", "sum", "int64"))
    ones = pa.array(np.ones(BATCH, np.int64))
    pairs = [(k, ones.slice(0, len(k))) for k in batches]
    t = time.perf_counter()
    for k, v in pairs:
        st.add_batch(k, v)
    dt = time.perf_counter() - t
    b.close()
    return dt


def _dict_counts(batches: List[pa.Array]) -> float:
    d: dict = {}
    get = d.get
    t = time.perf_counter()
    for k in batches:
        res = []
        append = res.append
        for key in pylist(k):
            acc = get(key, 0) + 1
            d[key] = acc
            append(acc)
        pa.array(res, pa.int64())
    return time.perf_counter() - t


def _rocksdict_counts(rocksdict, batches: List[pa.Array], batched: bool) -> float:
    with TempRdict(rocksdict) as db:
        get = db.get
        t = time.perf_counter()
        for k in batches:
            keys = pylist(k)
            res = []
            append = res.append
            if batched:
                uniq = list(dict.fromkeys(keys))
                cur = dict(zip(uniq, get(uniq)))  # multi-get: None where absent
                for key in keys:
                    acc = (cur[key] or 0) + 1
                    cur[key] = acc
                    append(acc)
                wb = rocksdict.WriteBatch()
                for key, acc in cur.items():
                    wb.put(key, acc)
                db.write(wb)
            else:
                for key in keys:
                    acc = get(key, 0) + 1
                    db[key] = acc
                    append(acc)
            pa.array(res, pa.int64())
        return time.perf_counter() - t


def _cpp_counts(ref: cpp_reference.Reference, rows: pa.Array, workdir: str) -> float:
    if pa.types.is_integer(rows.type):
        got = ref.int64_counts(rows.to_numpy(), workdir)
    else:
        got = ref.string_counts(*string_buffers(rows), workdir)
    return got["seconds"]


# --------------------------------------------------------------------------- wordcount

def _wordcount(c: str, size: Size, key_type: str, sizes: list) -> list:
    """The WordCount cases: ``sizes`` = [(regime, distinct, reps, prefix rows of rocksdict, and
    of python under ``--quick``)]."""
    rdb = rocksdict_module()
    ref = reference()
    out: list = []
    for regime, distinct, reps, slow_rows in sizes:
        out += _wordcount_size(c, size, key_type, rdb, ref, regime, distinct, reps, slow_rows)
        gc.collect()  # the rows of this size go before the next size's are made
    return out


def _wordcount_size(c: str, size: Size, key_type: str, rdb, ref, regime: str, distinct: int,
                    reps: int, slow_rows: int) -> list:
    """The records of one size of :func:`_wordcount`. A function of its own so that the rows
    it makes are released when it returns."""
    tag = f"{label(distinct)}_keys"
    keys = int64_keys(distinct) if key_type == "int64" else string_keys(distinct)
    idx = row_order(distinct, reps)
    rows = pa.array(keys[idx]) if key_type == "int64" else keys.take(pa.array(idx))
    del keys, idx
    full, slow = slices(rows), slices(rows, slow_rows)
    n_full, n_slow = len(rows), sum(len(k) for k in slow)
    py_rows, n_py = (slow, n_slow) if size.quick else (full, n_full)
    runs: List[Tuple[str, int, Callable[[], float]]] = []
    if has_native():
        runs.append(("native", n_full, lambda: _backend_counts("native", key_type, full)))
    runs.append(("python", n_py, lambda: _backend_counts("python", key_type, py_rows)))
    runs.append(("dict", n_full, lambda: _dict_counts(full)))
    if rdb is not None:
        runs.append(("rocksdict", n_slow, lambda: _rocksdict_counts(rdb, slow, False)))
        runs.append(("rocksdict+batch", n_slow, lambda: _rocksdict_counts(rdb, slow, True)))
    out: list = []
    workdir = tempfile.mkdtemp(prefix="statecore-bench-cpp-")
    try:
        if ref is not None:
            runs.append((ref.impl, n_full, lambda: _cpp_counts(ref, rows, workdir)))
        rates, measured = measure(c, tag, runs, ref.impl if ref else None)
        out += measured
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out.append(record(c, "workload", f"distinct_keys_{tag}", distinct, "keys"))
    out += ratio_records(c, tag, rates, ref.impl if ref else None, _GOAL_CPP[regime])
    return out


@case("wordcount_int64", "WordCount increment (running count per row), int64 keys, 200k and 10M "
                         "distinct: native vs python vs dict vs rocksdict vs C++ hash map",
      panel=peer_panel)
def wordcount_int64(size: Size):
    """rows/s per impl (``rows_per_s_<n>_keys``), ratios and goals; see the module docstring.
    Full: 200k keys x 10 (2M rows; rocksdict 400k) and 10M keys x 2 (20M rows; rocksdict 1M).
    ``--quick``: 200k x 4 and 2M x 2, python and rocksdict 100k / 200k rows."""
    return _wordcount("wordcount_int64", size, "int64", [
        ("in_cache", size.n(200_000, 200_000), 10 if not size.quick else 4,
         size.n(400_000, 100_000)),
        ("out_of_cache", size.n(10_000_000, 2_000_000), 2, size.n(1_000_000, 200_000)),
    ])


@case("wordcount_string", "WordCount increment, 8-32 byte string keys, 200k and 10M distinct: "
                          "native vs python vs dict vs rocksdict vs C++ hash map", panel=peer_panel)
def wordcount_string(size: Size):
    """As ``wordcount_int64`` with string keys. Full: 200k keys x 10 (rocksdict 400k rows) and
    10M keys x 2 (20M rows; rocksdict 1M). ``--quick``: 200k x 4 and 500k x 2, python and
    rocksdict 100k / 200k rows."""
    return _wordcount("wordcount_string", size, "string", [
        ("in_cache", size.n(200_000, 200_000), 10 if not size.quick else 4,
         size.n(400_000, 100_000)),
        ("out_of_cache", size.n(10_000_000, 500_000), 2, size.n(1_000_000, 200_000)),
    ])


# --------------------------------------------------------------------------- binary values

def _backend_binary(kind: str, puts: list, gets: list) -> Tuple[float, float]:
    b = create_backend(kind, key_type="int64")
    st = b.get_state(ValueStateDescriptor("v", "binary"))
    t = time.perf_counter()
    for k, v in puts:
        st.put_batch(k, v)
    put_s = time.perf_counter() - t
    t = time.perf_counter()
    for k in gets:
        st.get_batch(k)
    get_s = time.perf_counter() - t
    b.close()
    return put_s, get_s


def _dict_binary(puts: list, gets: list) -> Tuple[float, float]:
    d: dict = {}
    t = time.perf_counter()
    for k, v in puts:
        d.update(zip(pylist(k), v.to_pylist()))
    put_s = time.perf_counter() - t
    get = d.get
    t = time.perf_counter()
    for k in gets:
        pa.array([get(key) for key in pylist(k)], pa.binary())
    return put_s, time.perf_counter() - t


def _rocksdict_binary(rocksdict, puts: list, gets: list, batched: bool) -> Tuple[float, float]:
    with TempRdict(rocksdict) as db:
        t = time.perf_counter()
        for k, v in puts:
            if batched:
                wb = rocksdict.WriteBatch()
                for key, val in zip(pylist(k), v.to_pylist()):
                    wb.put(key, val)
                db.write(wb)
            else:
                for key, val in zip(pylist(k), v.to_pylist()):
                    db[key] = val
        put_s = time.perf_counter() - t
        get = db.get
        t = time.perf_counter()
        for k in gets:
            keys = pylist(k)
            pa.array(get(keys) if batched else [get(key) for key in keys], pa.binary())
        return put_s, time.perf_counter() - t


def _best_pair(run_once: Callable[[], Tuple[float, float]]) -> Tuple[float, float]:
    """:func:`bench.compare.best` of a run timing two phases: the fewest seconds of each phase."""
    fewest = [float("inf"), float("inf")]

    def once():
        got = run_once()
        fewest[0], fewest[1] = min(fewest[0], got[0]), min(fewest[1], got[1])
        return sum(got)

    best(once)
    return fewest[0], fewest[1]


@case("binary_values", "ValueState put_batch then get_batch of 64-byte binary values by int64 "
                       "key, 1M keys: native vs python vs dict vs rocksdict vs C++ hash map",
      panel=peer_panel)
def binary_values(size: Size):
    """rows/s of puts (``rows_per_s_put_<n>_keys``: every key put twice in random order, an
    insert then an overwrite) and of gets (``rows_per_s_get_<n>_keys``: every key read twice in
    another random order, the values gathered into a binary array), 1M keys (``--quick``
    200k); rocksdict (and python under ``--quick``) on the first 400k put rows and 400k get
    rows (``--quick`` 100k), of keys those puts wrote. Ratios over the C++ reference and python
    per phase; goal: native >= 20x python for puts and for gets."""
    c = "binary_values"
    rdb, ref, native = rocksdict_module(), reference(), has_native()
    distinct = size.n(1_000_000, 200_000)
    slow_rows = size.n(400_000, 100_000)
    tag = f"{label(distinct)}_keys"
    keys = int64_keys(distinct, seed=3)
    put_keys = keys[row_order(distinct, 2, seed=4)]
    get_keys = keys[row_order(distinct, 2, seed=5)]
    values = make_binary_values(len(put_keys))
    pk = pa.array(put_keys)
    puts = list(zip(slices(pk), slices(values)))
    gets = slices(pa.array(get_keys))
    # The slow impls: a prefix of the puts and gets of only the keys those puts wrote (all hits,
    # as in the full run).
    slow_puts = list(zip(slices(pk, slow_rows), slices(values, slow_rows)))
    written = np.unique(put_keys[:slow_rows])
    picks = np.random.default_rng(6).integers(0, len(written), slow_rows)
    slow_gets = slices(pa.array(written[picks]))
    n_full, n_slow = len(put_keys), min(slow_rows, len(put_keys))
    runs = []
    if native:
        runs.append(("native", n_full, lambda: _backend_binary("native", puts, gets)))
    if size.quick:
        runs.append(("python", n_slow, lambda: _backend_binary("python", slow_puts, slow_gets)))
    else:
        runs.append(("python", n_full, lambda: _backend_binary("python", puts, gets)))
    runs.append(("dict", n_full, lambda: _dict_binary(puts, gets)))
    if rdb is not None:
        runs.append(("rocksdict", n_slow,
                     lambda: _rocksdict_binary(rdb, slow_puts, slow_gets, False)))
        runs.append(("rocksdict+batch", n_slow,
                     lambda: _rocksdict_binary(rdb, slow_puts, slow_gets, True)))
    out: list = []
    workdir = tempfile.mkdtemp(prefix="statecore-bench-cpp-")
    try:
        if ref is not None:
            poff, pdata = string_buffers(values)

            def cpp_run():
                got = ref.binary_get_put(put_keys, poff, pdata, get_keys, workdir)
                return got["put_seconds"], got["get_seconds"]

            runs.append((ref.impl, n_full, cpp_run))
        rates: Dict[str, Dict[str, float]] = {"put": {}, "get": {}}
        for impl, n, fn in runs:
            put_s, get_s = _best_pair(fn)
            rates["put"][impl], rates["get"][impl] = n / put_s, n / get_s
            for op in ("put", "get"):
                out.append(record(c, impl, f"rows_per_s_{op}_{tag}", rates[op][impl], "rows/s"))
            out.append(record(c, impl, f"rows_measured_{tag}", n, "rows"))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out.append(record(c, "workload", f"distinct_keys_{tag}", distinct, "keys"))
    for op in ("put", "get"):
        out += ratio_records(c, f"{op}_{tag}", rates[op], ref.impl if ref else None, None)
    return out


# --------------------------------------------------------------------------- memory

def dict_rss_probe(n: int) -> dict:
    """Load ``n`` entries int -> int (keys 0..n-1, value = key as its own int object, as the
    native probe stores value = key) into a dict: ``{"rss_delta": bytes, "entries": int}``.
    Meant for a fresh interpreter (:func:`bench.common.probe_in_child`)."""
    gc.collect()
    r0 = rss_bytes()
    d: dict = {}
    for s in range(0, n, 1_000_000):
        k = np.arange(s, min(n, s + 1_000_000), dtype=np.int64)
        d.update(zip(k.tolist(), k.tolist()))
    del k
    gc.collect()
    return {"rss_delta": rss_bytes() - r0, "entries": len(d)}


@case("memory_int64", "bytes per entry (RSS growth / entries, fresh process each) of int64 -> "
                      "int64 state at 10M entries: native vs dict vs C++ hash map",
      panel=peer_panel)
def memory_int64(size: Size):
    """``rss_bytes_per_entry_<n>_entries`` (unit bytes) of the native backend
    (:func:`bench.ttl.rss_probe`: keys 0..n-1 loaded with ``add_batch`` in 64k-row
    batches), a dict (:func:`dict_rss_probe`) and the C++ map (its ``memory`` mode: the RSS
    growth of its own process), each in a fresh process; native's ``state_bytes_per_entry``
    (key + value bytes it accounts) too. n = 10M (``--quick``: 1M). Goal: native <= 40 bytes
    per entry. Raises RuntimeError when a probe process fails."""
    c = "memory_int64"
    n = size.n(10_000_000, 1_000_000)
    tag = f"{label(n)}_entries"
    out = []
    per_entry = {}
    if has_native():
        got = probe_in_child("bench.ttl", "rss_probe", "native", n, False)
        per_entry["native"] = got["rss_delta"] / max(1, got["entries"])
        out.append(record(c, "native", f"state_bytes_per_entry_{tag}",
                          got["state_bytes"] / max(1, got["entries"]), "bytes"))
    got = probe_in_child("bench.peers", "dict_rss_probe", n)
    per_entry["dict"] = got["rss_delta"] / max(1, got["entries"])
    ref = reference()
    if ref is not None:
        got = ref.rss_probe(n)
        per_entry[ref.impl] = got["rss_delta"] / max(1, got["entries"])
    for impl, v in per_entry.items():
        # max(0, ...): at tiny (test) sizes another allocation's release can outweigh the growth
        per_entry[impl] = v = max(0.0, v)
        out.append(record(c, impl, f"rss_bytes_per_entry_{tag}", v, "bytes"))
    if "native" in per_entry:
        v = per_entry["native"]
        metric = f"rss_bytes_per_entry_{tag}"
        out.append(record(c, "native", f"goal_max_{metric}", _GOAL_MAX_BYTES_PER_ENTRY, "bytes"))
        out.append(record(c, "native", f"goal_met_{metric}_le_{_GOAL_MAX_BYTES_PER_ENTRY:g}",
                          float(v <= _GOAL_MAX_BYTES_PER_ENTRY), "bool"))
        for impl, w in per_entry.items():
            if impl != "native" and w > 0:  # tiny test sizes may not grow the RSS at all
                out.append(record(c, "native", f"rss_ratio_over_{impl}_{tag}", v / w, "ratio"))
    return out

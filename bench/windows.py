"""Windowed state through namespaces: ``window_count`` -- a running count per (key,
tumbling window), the window start (int64 ms) as the state's namespace, as Flink's window
operators key their state.

Workload: 1M events (``--quick`` 200k) over 100k int64 keys with event times spread over 24 hours
in order, one-hour tumbling windows, in 64k-row batches: ``add_batch(keys, ones,
namespaces=window_starts)`` on a reducing ``sum`` state with ``namespace_type="int64"``.

Impls: ``native`` (the kernels: keys and namespaces read from the Arrow buffers), ``python`` (the
reference backend: the whole stream as native, as the goal is a ratio over it; ``--quick`` a
prefix of 50k rows) and ``dict`` (a dict keyed by
``(key, window)`` tuples fed from the same batches, the running count per row made an Arrow
array per batch). Records: ``rows_per_s_<n>_keys``, ``rows_measured_<n>_keys``, the ratios over
python and the goal native >= 20x python.
"""

from __future__ import annotations

import time
from typing import List, Tuple

import numpy as np
import pyarrow as pa

from bench.common import has_native, label
from bench.compare import measure, peer_panel, ratio_records
from bench.harness import Size, case, record
from statecore import ReducingStateDescriptor, create_backend

_BATCH = 65536
_HOUR_MS = 3600_000


def _workload(size: Size) -> Tuple[int, pa.Array, pa.Array]:
    """(distinct keys, keys int64, window starts int64 ms) of ``size``'s events."""
    n, distinct = size.n(1_000_000, 200_000), size.n(100_000, 20_000)
    rng = np.random.default_rng(31)
    keys = rng.integers(0, distinct, n)
    event_ms = np.sort(rng.integers(0, 24 * _HOUR_MS, n))
    return (distinct, pa.array(keys, pa.int64()),
            pa.array(event_ms - event_ms % _HOUR_MS, pa.int64()))


def _batches(keys: pa.Array, wins: pa.Array, rows: int) -> List[Tuple[pa.Array, pa.Array]]:
    rows = min(rows, len(keys))
    return [(keys.slice(s, min(_BATCH, rows - s)), wins.slice(s, min(_BATCH, rows - s)))
            for s in range(0, rows, _BATCH)]


def _backend_run(kind: str, batches) -> float:
    b = create_backend(kind, key_type="int64")
    st = b.get_state(ReducingStateDescriptor("count", "sum", "int64"), namespace_type="int64")
    ones = pa.array(np.ones(_BATCH, np.int64))
    t = time.perf_counter()
    for k, w in batches:
        st.add_batch(k, ones.slice(0, len(k)), namespaces=w)
    dt = time.perf_counter() - t
    b.close()
    return dt


def _dict_run(batches) -> float:
    d: dict = {}
    get = d.get
    t = time.perf_counter()
    for k, w in batches:
        res = []
        append = res.append
        for pair in zip(k.to_numpy().tolist(), w.to_numpy().tolist()):
            acc = get(pair, 0) + 1
            d[pair] = acc
            append(acc)
        pa.array(res, pa.int64())
    return time.perf_counter() - t


@case("window_count", "running count per (key, one-hour tumbling window), the window start as "
                      "the namespace: native vs python vs dict", panel=peer_panel)
def window_count(size: Size):
    """rows/s per impl, ratios over python and the goal native >= 20x python; see the module
    docstring."""
    c = "window_count"
    distinct, keys, wins = _workload(size)
    tag = f"{label(distinct)}_keys"
    full = _batches(keys, wins, len(keys))
    slow = full if not size.quick else _batches(keys, wins, 50_000)
    n_full, n_slow = len(keys), sum(len(k) for k, _ in slow)
    runs = []
    if has_native():
        runs.append(("native", n_full, lambda: _backend_run("native", full)))
    runs.append(("python", n_slow, lambda: _backend_run("python", slow)))
    runs.append(("dict", n_full, lambda: _dict_run(full)))
    out: list = []
    rates, measured = measure(c, tag, runs, None)
    out += measured
    out.append(record(c, "workload", f"distinct_keys_{tag}", distinct, "keys"))
    out += ratio_records(c, tag, rates, None, None)
    return out

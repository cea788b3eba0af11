"""The tiered mode of the native backend (docs/tiered.md): a running count over a state much
larger than the memory budget, served from the checkpoint's runs, against the in-memory native
backend restored from the same checkpoint, in the same run.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench.common import has_native
from bench.harness import Size, case, record
from statecore import CheckpointStore, ReducingStateDescriptor, create_backend

_LOAD_BATCH = 1 << 20
_BATCH = 1 << 16
#: Key and value bytes of an int64 -> int64 entry (docs/formats.md "Encoded key").
_ENTRY = 18


def _zipf_keys(rng, n: int, m: int) -> np.ndarray:
    """``m`` keys of 0..n-1 drawn Zipf(1.0) by rank, ranks mapped to keys by a random
    permutation (the hot keys spread over the key groups)."""
    cdf = np.cumsum(1.0 / np.arange(1, n + 1))
    ranks = np.searchsorted(cdf, rng.random(m) * cdf[-1])
    return rng.permutation(n)[np.minimum(ranks, n - 1)].astype(np.int64)


def _run(backend, batches) -> tuple[float, list]:
    """Seconds of ``add_batch`` (count) over ``batches`` on a fresh state object, and the
    last batch's output."""
    st = backend.get_state(ReducingStateDescriptor("c", "sum", "int64"))
    ones = pa.array(np.ones(len(batches[0]), dtype=np.int64))
    out = None
    t = time.perf_counter()
    for keys in batches:
        out = st.add_batch(pa.array(keys), ones)
    return time.perf_counter() - t, out


@case("tiered_running_count",
      "running count (ReducingState sum, 64k-row batches) over 10M / 1M int64 keys with a "
      "memory budget of 1/8 of the state (tiered mode), Zipf(1.0) and uniform keys, vs the "
      "in-memory native backend restored from the same checkpoint")
def tiered_running_count(size: Size):
    """Records per distribution ``zipf`` / ``uniform``: impl ``tiered``: ``rows_per_s_<dist>``,
    ``loaded_per_row_<dist>`` (entries fetched from the runs per row), ``checkpoint_s_<dist>``
    (the incremental checkpoint after the rows), ``attach_s`` (restore = attach); impl
    ``in-memory``: ``rows_per_s_<dist>``, ``restore_s``. Also ``entries`` and
    ``budget_bytes``. Both backends' outputs are checked equal."""
    if not has_native():
        return []
    n = size.n(10_000_000, 1_000_000)
    rows = size.n(1 << 20, 1 << 18)
    batch = min(_BATCH, rows)
    budget = max(4096, n * _ENTRY // 8)
    rng = np.random.default_rng(11)
    out = [record("tiered_running_count", "tiered", "entries", n, "entries"),
           record("tiered_running_count", "tiered", "budget_bytes", budget, "bytes")]
    dists = {"zipf": _zipf_keys(rng, n, rows), "uniform": rng.integers(0, n, rows,
                                                                       dtype=np.int64)}
    with tempfile.TemporaryDirectory(prefix="statecore-bench-") as d:
        base_store = CheckpointStore(Path(d) / "base")
        b = create_backend("native", key_type="int64")
        st = b.get_state(ReducingStateDescriptor("c", "sum", "int64"))
        for s in range(0, n, _LOAD_BATCH):
            k = pa.array(np.arange(s, min(n, s + _LOAD_BATCH), dtype=np.int64))
            st.add_batch(k, pa.array(np.ones(len(k), dtype=np.int64)))
        base_store.checkpoint(b, 1, incremental=False)
        base_store.close()
        b.close()
        for dist, keys in dists.items():
            # A copy of the checkpoint per distribution: each tiered run commits version 2 on
            # top of version 1.
            shutil.copytree(Path(d) / "base", Path(d) / dist)
            store = CheckpointStore(Path(d) / dist)
            batches = [keys[i:i + batch] for i in range(0, rows - batch + 1, batch)]
            mem = create_backend("native", key_type="int64")
            t = time.perf_counter()
            store.restore(mem, 1)
            restore_s = time.perf_counter() - t
            secs_mem, out_mem = _run(mem, batches)
            mem.close()
            tb = create_backend("native", key_type="int64", memory_budget=budget,
                                checkpoint=store)
            t = time.perf_counter()
            store.restore(tb, 1)
            attach_s = time.perf_counter() - t
            secs, out_tiered = _run(tb, batches)
            assert out_tiered.equals(out_mem)
            stats = tb.tiered_statistics()
            t = time.perf_counter()
            store.checkpoint(tb, 2)
            ckpt_s = time.perf_counter() - t
            tb.close()
            used = len(batches) * batch
            out += [
                record("tiered_running_count", "in-memory", "restore_s", restore_s, "s"),
                record("tiered_running_count", "in-memory", f"rows_per_s_{dist}",
                       used / secs_mem, "rows/s"),
                record("tiered_running_count", "tiered", "attach_s", attach_s, "s"),
                record("tiered_running_count", "tiered", f"rows_per_s_{dist}", used / secs,
                       "rows/s"),
                record("tiered_running_count", "tiered", f"loaded_per_row_{dist}",
                       stats["loaded"] / used, "entries"),
                record("tiered_running_count", "tiered", f"over_budget_batches_{dist}",
                       stats["over_budget_batches"], "batches"),
                record("tiered_running_count", "tiered", f"checkpoint_s_{dist}", ckpt_s, "s"),
            ]
            store.close()
    return out

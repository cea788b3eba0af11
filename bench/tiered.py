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
from bench.compare import rocksdict_module
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


def _bytes8(a: np.ndarray) -> list:
    """The 8-byte items of an 8-byte numpy array as bytes objects."""
    raw = a.tobytes()
    return [raw[i:i + 8] for i in range(0, len(raw), 8)]


def _rocksdb(rocksdict, root: Path, n: int, cache_bytes: int):
    """A RocksDB (rocksdict, raw bytes, write-ahead log off) holding count 1 for keys
    0..n-1 (8-byte big-endian -> 8-byte little-endian), ingested from one SST file, with a
    block cache of ``cache_bytes``."""
    opt = rocksdict.Options(raw_mode=True)
    table = rocksdict.BlockBasedOptions()
    table.set_block_cache(rocksdict.Cache(cache_bytes))
    opt.set_block_based_table_factory(table)
    sst = str(root / "base.sst")
    w = rocksdict.SstFileWriter(options=opt)
    w.open(sst)
    one = (1).to_bytes(8, "little")
    for s in range(0, n, _LOAD_BATCH):
        for k in _bytes8(np.arange(s, min(n, s + _LOAD_BATCH), dtype=">i8")):
            w[k] = one
    w.finish()
    db = rocksdict.Rdict(str(root / "db"), options=opt)
    wo = rocksdict.WriteOptions()
    wo.disable_wal = True
    db.set_write_options(wo)
    db.ingest_external_file([sst])
    return db


def _rocksdb_run(rocksdict, db, batches) -> tuple[float, pa.Array]:
    """Seconds of the running count over ``batches`` in RocksDB, batched as a Python user would:
    per batch one multi-get of the distinct keys, the running counts computed with numpy and
    one WriteBatch of the new counts; and the last batch's output (the count after each row)."""
    out = None
    t = time.perf_counter()
    for keys in batches:
        uniq, inv = np.unique(keys, return_inverse=True)
        names = _bytes8(uniq.astype(">i8"))
        got = db[names]
        base = np.array([0 if v is None else int.from_bytes(v, "little") for v in got],
                        np.int64)
        # Row i's count: its key's stored count plus its occurrences up to and including i.
        order = np.argsort(inv, kind="stable")
        first = np.searchsorted(inv[order], inv[order])
        rank = np.empty(len(keys), np.int64)
        rank[order] = np.arange(len(keys)) - first
        out_np = base[inv] + rank + 1
        final = base + np.bincount(inv, minlength=len(uniq))
        wb = rocksdict.WriteBatch(raw_mode=True)
        for k, v in zip(names, _bytes8(final.astype("<i8"))):
            wb.put(k, v)
        db.write(wb)
        out = out_np
    return time.perf_counter() - t, pa.array(out)


@case("tiered_running_count",
      "running count (ReducingState sum, 64k-row batches) over 10M / 1M int64 keys with a "
      "memory budget of 1/8 of the state (tiered mode), Zipf(1.0) and uniform keys, vs the "
      "in-memory native backend restored from the same checkpoint and RocksDB (rocksdict, "
      "multi-get + WriteBatch per batch, block cache = the budget)")
def tiered_running_count(size: Size):
    """Records per distribution ``zipf`` / ``uniform``: impl ``tiered``: ``rows_per_s_<dist>``,
    ``loaded_per_row_<dist>`` (entries fetched from the runs per row), ``checkpoint_s_<dist>``
    (the incremental checkpoint after the rows), ``attach_s`` (restore = attach); impl
    ``in-memory``: ``rows_per_s_<dist>``, ``restore_s``; impl ``rocksdict`` (when importable):
    ``rows_per_s_<dist>`` of the same count in RocksDB holding the same entries (ingested from an
    SST file, not timed), batched as a Python user would (_rocksdb_run). Also ``entries`` and
    ``budget_bytes``. Every implementation's outputs are checked equal."""
    if not has_native():
        return []
    n = size.n(10_000_000, 1_000_000)
    rows = size.n(1 << 20, 1 << 18)
    batch = min(_BATCH, rows)
    budget = max(4096, n * _ENTRY // 8)
    rng = np.random.default_rng(11)
    rdb = rocksdict_module()
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
            if rdb is not None:
                (Path(d) / f"rocksdb-{dist}").mkdir()
                db = _rocksdb(rdb, Path(d) / f"rocksdb-{dist}", n, budget)
                secs_rdb, out_rdb = _rocksdb_run(rdb, db, batches)
                db.close()
                assert out_rdb.equals(out_mem.cast(pa.int64()))
                out.append(record("tiered_running_count", "rocksdict", f"rows_per_s_{dist}",
                                  len(batches) * batch / secs_rdb, "rows/s"))
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

"""The tiered mode of the native backend (docs/tiered.md), against the in-memory native backend
restored from the same checkpoint, in the same run: a running count over a state much larger
than the memory budget, served from the checkpoint's runs (``tiered_running_count``), and over
a hot set the budget holds (``tiered_hot_set``); the time from a restore or rescale to the first
record and to a warm working set (``tiered_restore``); the bytes and seconds of a checkpoint
against the state's size (``tiered_checkpoint``); the cost of lookups against the attached
chain's length, before and after its compaction (``tiered_compaction``).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench import tiered_rss
from bench.common import has_native, label
from bench.compare import rocksdict_module
from bench.harness import Size, case, record
from bench.workloads import zipf_keys
from statecore import (
    CheckpointStore,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    create_backend,
)
from statecore.backends.tiered import TIERED_BLOCK_TARGET_BYTES
from statecore.checkpoint.format import CODECS, COMPRESSION
from statecore.key_groups import assign_key_group, key_group_range_for_operator

_LOAD_BATCH = 1 << 20
_BATCH = 1 << 16
#: Key and value bytes of an int64 -> int64 entry (docs/formats.md "Encoded key").
_ENTRY = 18
#: The run lookup's block cache in the resident-memory runs (bench.tiered_rss): it is part of
#: the memory above the budget, so it is set, and reported, apart.
_RSS_CACHE_BYTES = 16 << 20


def _block_bytes(size: Size) -> int:
    """The block size of the checkpoints the tiered cases write: ``python -m bench
    --block-bytes`` (``size.block_target_bytes``), by default the tiered mode's own
    (``TIERED_BLOCK_TARGET_BYTES``, as a tiered operator writes its runs)."""
    return size.block_target_bytes or TIERED_BLOCK_TARGET_BYTES


def _compression(size: Size) -> str:
    """The block codec of the checkpoints the tiered cases write: ``python -m bench
    --compression`` (``size.compression``), by default the stores' (``COMPRESSION``)."""
    return size.compression or COMPRESSION


def _store(root: Path, size: Size, **options) -> CheckpointStore:
    """A checkpoint store at ``root`` that cuts the runs it writes into blocks of
    :func:`_block_bytes` stored with :func:`_compression`."""
    return CheckpointStore(root, block_target_bytes=_block_bytes(size),
                           compression=_compression(size), **options)


def _base_checkpoint(root: Path, n: int, size: Size) -> int:
    """Version 1 of a new checkpoint store at ``root``: one full run of the running count's
    state (ReducingState "c", sum of int64) holding count 1 for keys 0..n-1, written by the
    native backend over the whole key-group range (blocks: :func:`_store`). Returns the run's
    number of blocks."""
    store = _store(root, size)
    b = create_backend("native", key_type="int64")
    st = b.get_state(ReducingStateDescriptor("c", "sum", "int64"))
    for s in range(0, n, _LOAD_BATCH):
        k = pa.array(np.arange(s, min(n, s + _LOAD_BATCH), dtype=np.int64))
        st.add_batch(k, pa.array(np.ones(len(k), dtype=np.int64)))
    store.checkpoint(b, 1, incremental=False)
    blocks = sum(f["blocks"] for f in store.manifest(1)["files"])
    store.close()
    b.close()
    return blocks



def _backend_on_copy(d: Path, name: str, impl: str, budget: int, size: Size):
    """``(root, store, backend)``: a copy at ``d / name`` of the checkpoint at ``d / "base"``
    (one per backend: each commits versions 2, 3, ... on top of version 1 in its own) and a
    native int64-keyed backend for it, not restored yet: ``impl`` ``"tiered"`` (``budget``
    bytes, attached to the copy's store) or ``"in-memory"``."""
    root = d / name
    shutil.copytree(d / "base", root)
    store = _store(root, size)
    opts = {"memory_budget": budget, "checkpoint": store} if impl == "tiered" else {}
    return root, store, create_backend("native", key_type="int64", **opts)


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


def _rocksdb_batch(rocksdict, db, keys: np.ndarray) -> np.ndarray:
    """The running count of one batch of ``keys`` in RocksDB, batched as a Python user would:
    one multi-get of the distinct keys, the running counts computed with numpy and one
    WriteBatch of the new counts. Returns the count after each row."""
    uniq, inv = np.unique(keys, return_inverse=True)
    names = _bytes8(uniq.astype(">i8"))
    got = db[names]
    base = np.array([0 if v is None else int.from_bytes(v, "little") for v in got], np.int64)
    # Row i's count: its key's stored count plus its occurrences up to and including i.
    order = np.argsort(inv, kind="stable")
    first = np.searchsorted(inv[order], inv[order])
    rank = np.empty(len(keys), np.int64)
    rank[order] = np.arange(len(keys)) - first
    final = base + np.bincount(inv, minlength=len(uniq))
    wb = rocksdict.WriteBatch(raw_mode=True)
    for k, v in zip(names, _bytes8(final.astype("<i8"))):
        wb.put(k, v)
    db.write(wb)
    return base[inv] + rank + 1


def _rocksdb_records(rocksdict, db, keys: np.ndarray) -> np.ndarray:
    """The running count of ``keys`` in RocksDB one record at a time (a get and a put per
    row). Returns the count after each row."""
    out = np.empty(len(keys), np.int64)
    for i, k in enumerate(_bytes8(keys.astype(">i8"))):
        v = db.get(k)
        c = (0 if v is None else int.from_bytes(v, "little")) + 1
        db[k] = c.to_bytes(8, "little")
        out[i] = c
    return out


def _native_records(backend, keys: np.ndarray) -> np.ndarray:
    """The running count of ``keys`` through the per-record API (``set_current_key``,
    ``add``, ``get`` per row). Returns the count after each row."""
    st = backend.get_state(ReducingStateDescriptor("c", "sum", "int64"))
    out = np.empty(len(keys), np.int64)
    for i, k in enumerate(keys.tolist()):
        backend.set_current_key(k)
        st.add(1)
        out[i] = st.get()
    return out


def _stream(backend, store, intervals, checkpoint_from: int) -> dict:
    """The running count (``add_batch``) over ``intervals`` (lists of key batches) on
    ``backend``, each interval followed by ``store.checkpoint(backend, checkpoint_from + i)``
    (as a streaming job checkpoints per micro-batch) unless ``store`` is None. Returns
    ``{"run_s", "ckpt_s": [seconds per interval], "outputs": [each batch's output],
    "stats": [tiered_statistics() after each interval, when the backend has them]}``."""
    st = backend.get_state(ReducingStateDescriptor("c", "sum", "int64"))
    ones = pa.array(np.ones(len(intervals[0][0]), dtype=np.int64))
    got = {"run_s": [], "ckpt_s": [], "outputs": [], "stats": []}
    for i, batches in enumerate(intervals):
        t = time.perf_counter()
        for keys in batches:
            got["outputs"].append(st.add_batch(pa.array(keys), ones))
        got["run_s"].append(time.perf_counter() - t)
        t = time.perf_counter()
        if store is not None:
            store.checkpoint(backend, checkpoint_from + i)
        got["ckpt_s"].append(time.perf_counter() - t)
        if hasattr(backend, "tiered_statistics"):
            got["stats"].append(backend.tiered_statistics())
    return got


def _rocksdb_stream(rocksdict, db, intervals) -> dict:
    """:func:`_stream`'s ``run_s`` and ``outputs`` for RocksDB (:func:`_rocksdb_batch`); no
    checkpoints (``ckpt_s`` zeros): RocksDB persists by itself."""
    got = {"run_s": [], "ckpt_s": [], "outputs": []}
    for batches in intervals:
        t = time.perf_counter()
        for keys in batches:
            got["outputs"].append(_rocksdb_batch(rocksdict, db, keys))
        got["run_s"].append(time.perf_counter() - t)
        got["ckpt_s"].append(0.0)
    return got


def _intervals(keys: np.ndarray, rows: int, batch: int, per_interval: int) -> list:
    """The first ``rows`` of ``keys`` cut into batches of ``batch`` and those into intervals of
    ``per_interval`` batches: :func:`_stream`'s input (zero-copy numpy slices)."""
    flat = [keys[i:i + batch] for i in range(0, rows, batch)]
    return [flat[i:i + per_interval] for i in range(0, len(flat), per_interval)]


def _steady_loaded_per_row(got: dict, warm: int, steady_rows: int) -> float:
    """Entries a tiered :func:`_stream` loaded from the runs per row of its intervals after the
    first ``warm`` (``steady_rows`` rows), from its ``tiered_statistics()`` snapshots."""
    first, last = got["stats"][warm - 1], got["stats"][-1]
    return (last["loaded"] - first["loaded"]) / steady_rows


def _rates(got: dict, rows_per_interval: int, warm: int) -> tuple[float, float, float]:
    """(steady, steady with checkpoints, cold) rows/s of a :func:`_stream`: the intervals
    after the first ``warm`` over their rows' seconds, then over their rows' and checkpoints'
    seconds; the first interval over its rows' seconds."""
    run, ckpt = got["run_s"], got["ckpt_s"]
    steady_rows = rows_per_interval * (len(run) - warm)
    return (steady_rows / sum(run[warm:]), steady_rows / (sum(run[warm:]) + sum(ckpt[warm:])),
            rows_per_interval / run[0])


def _running_panel(r) -> object:
    """tiered_running_count's plot: per distribution the steady, cold and per-record rows/s
    of each implementation."""
    for dist in ("zipf", "uniform"):
        for kind, metric in (("steady", f"rows_per_s_{dist}"),
                             ("cold", f"cold_rows_per_s_{dist}"),
                             ("per record", f"rows_per_s_record_{dist}")):
            if r["metric"] == metric:
                return f"{dist} rows/s", f"{r['impl']}: {kind}"
    return None


@case("tiered_running_count",
      "running count (ReducingState sum) over 10M / 1M int64 keys with a memory budget of 1/8 "
      "of the state (tiered mode), Zipf(1.0) and uniform keys, a stream of 64k-row batches "
      "checkpointed every 8 / 4 batches (steady rate after a warm-up, and cold), and per record; "
      "vs the in-memory native backend restored from the same checkpoint (same checkpoints) "
      "and RocksDB (rocksdict, multi-get + WriteBatch per batch, block cache = the budget)",
      panel=_running_panel)
def tiered_running_count(size: Size):
    """A stream of 16 / 2 intervals of 8 / 4 batches of 64k keys (8M / 512k rows), drawn per
    distribution ``zipf`` (Zipf(1.0), :func:`zipf_keys`) / ``uniform``, each interval followed
    by a checkpoint (``CheckpointStore.checkpoint``, incremental, the store's default
    compaction: what a streaming operator does per micro-batch), on a backend restored from
    version 1 of a checkpoint of ``entries`` keys (count 1 each); then ``record_rows`` (32k /
    4k) more rows per record (``set_current_key``, ``add``, ``get``). The first half of the
    intervals (``warm_up_rows``) warms the backend: at 10M keys the budget fills in about 4M
    Zipf rows, and only then does eviction choose what stays.

    Records per distribution, per impl ``tiered`` (``memory_budget`` = 1/8 of the state's key
    and value bytes, or ``python -m bench --memory-budget``; attached), ``in-memory``
    (``create_backend("native")``, restored: its first checkpoint is a full one, the later ones
    incremental) and ``rocksdict`` (when
    importable: RocksDB holding the same entries, ingested from an SST file, not timed; the
    batches as a Python user would write them, :func:`_rocksdb_batch`; no checkpoints):
    ``rows_per_s_<dist>`` (steady: the rows of the intervals after the warm-up over their
    ``add_batch`` seconds), ``cold_rows_per_s_<dist>`` (the first interval, just after the
    restore), ``rows_per_s_record_<dist>`` (per record); tiered and in-memory also
    ``rows_per_s_ckpt_<dist>`` (steady, over the rows' and the checkpoints' seconds) and
    ``checkpoint_s_<dist>`` (median seconds of a steady interval's checkpoint); tiered also
    ``record_attached_runs_<dist>`` (the chain's runs when the per-record rows start),
    ``loaded_per_row_<dist>`` (entries fetched from the runs per steady row), ``hit_rate_<dist>``
    (share of the steady batches' distinct keys found in memory), ``first_seen_per_row_<dist>``
    (steady rows whose key no earlier row carried: a load no cache or eviction policy avoids,
    since version 1 holds every key), ``over_budget_batches_<dist>`` and ``attach_s``;
    in-memory ``restore_s``. Also ``entries``, ``budget_bytes``, ``rows``,
    ``warm_up_rows``. Every implementation's outputs are checked equal.

    The resident memory of a tiered run over the stream's first 16 / 2 batches without
    checkpoints, measured in a fresh interpreter (:mod:`bench.tiered_rss`, Linux), per
    distribution and for uniform keys with an eighth of the key and value bytes that run held
    at most (``uniform_spill``: the changed entries exceed it and spill):
    ``rss_delta_bytes_<label>``,
    ``rss_over_budget_bytes_<label>`` (the delta minus that run's budget),
    ``rss_over_budget_and_cache_bytes_<label>`` (minus the block cache's bound, 16 MiB, too),
    ``state_bytes_max_<label>``, ``budget_bytes_<label>``, ``spills_<label>``."""
    if not has_native():
        return []
    c = "tiered_running_count"
    n = size.n(10_000_000, 1_000_000)
    batch = min(_BATCH, size.n(_BATCH, _BATCH))
    per_interval = 4 if size.quick else 8
    n_intervals = 2 if size.quick else 16
    warm = n_intervals // 2
    record_rows = min(batch, size.n(1 << 15, 1 << 12))
    budget = size.memory_budget or max(4096, n * _ENTRY // 8)
    rng = np.random.default_rng(11)
    rdb = rocksdict_module()
    rows = n_intervals * per_interval * batch
    out = [record(c, "tiered", "entries", n, "entries"),
           record(c, "tiered", "budget_bytes", budget, "bytes"),
           record(c, "tiered", "rows", rows, "rows"),
           record(c, "tiered", "warm_up_rows", warm * per_interval * batch, "rows")]
    draw = {"zipf": lambda m: zipf_keys(rng, n, m),
            "uniform": lambda m: rng.integers(0, n, m, dtype=np.int64)}
    with tempfile.TemporaryDirectory(prefix="statecore-bench-") as d:
        out += [record(c, "tiered", "base_blocks", _base_checkpoint(Path(d) / "base", n, size),
                       "blocks"),
                record(c, "tiered", "block_target_bytes", _block_bytes(size), "bytes"),
                record(c, "tiered", "block_codec", CODECS[_compression(size)], "codec")]
        for dist, gen in draw.items():
            keys = gen(rows + record_rows)
            intervals = _intervals(keys, rows, batch, per_interval)
            per_record = keys[rows:]
            distinct = [len(np.unique(b)) for batches in intervals for b in batches]
            results = {}
            for impl in ("in-memory", "tiered"):
                root, store, b = _backend_on_copy(Path(d), f"{dist}-{impl}", impl, budget, size)
                t = time.perf_counter()
                store.restore(b, 1)
                out.append(record(c, impl, "attach_s" if impl == "tiered" else "restore_s",
                                  time.perf_counter() - t, "s"))
                got = _stream(b, store, intervals, 2)
                if impl == "tiered":
                    # A per-record miss consults the chain run by run: its length (the last
                    # background compaction's outcome) moves the per-record rate.
                    out.append(record(c, impl, f"record_attached_runs_{dist}",
                                      b.tiered_statistics()["attached_runs"], "runs"))
                t = time.perf_counter()
                got["records"] = _native_records(b, per_record)
                rec_s = time.perf_counter() - t
                results[impl] = got
                steady, with_ckpt, cold = _rates(got, per_interval * batch, warm)
                out += [record(c, impl, f"rows_per_s_{dist}", steady, "rows/s"),
                        record(c, impl, f"rows_per_s_ckpt_{dist}", with_ckpt, "rows/s"),
                        record(c, impl, f"cold_rows_per_s_{dist}", cold, "rows/s"),
                        record(c, impl, f"rows_per_s_record_{dist}", record_rows / rec_s,
                               "rows/s"),
                        record(c, impl, f"checkpoint_s_{dist}",
                               np.median(got["ckpt_s"][warm:]), "s")]
                if impl == "tiered":
                    first, last = got["stats"][warm - 1], got["stats"][-1]
                    steady_rows = rows - warm * per_interval * batch
                    fetched = last["fetched_keys"] - first["fetched_keys"]
                    asked = sum(distinct[warm * per_interval:])
                    _, first_row = np.unique(keys[:rows], return_index=True)
                    seen = int((first_row >= rows - steady_rows).sum())
                    out += [record(c, impl, f"loaded_per_row_{dist}",
                                   _steady_loaded_per_row(got, warm, steady_rows), "entries"),
                            record(c, impl, f"first_seen_per_row_{dist}", seen / steady_rows,
                                   "keys"),
                            record(c, impl, f"hit_rate_{dist}", 1 - fetched / asked, "share"),
                            record(c, impl, f"over_budget_batches_{dist}",
                                   last["over_budget_batches"], "batches")]
                b.close()
                store.close()
                shutil.rmtree(root)
            mem = results["in-memory"]
            for a, m in zip(results["tiered"]["outputs"], mem["outputs"]):
                assert a.equals(m)
            assert np.array_equal(results["tiered"]["records"], mem["records"])
            if rdb is not None:
                (Path(d) / f"rocksdb-{dist}").mkdir()
                db = _rocksdb(rdb, Path(d) / f"rocksdb-{dist}", n, budget)
                got = _rocksdb_stream(rdb, db, intervals)
                t = time.perf_counter()
                recs = _rocksdb_records(rdb, db, per_record)
                rec_s = time.perf_counter() - t
                db.close()
                for a, m in zip(got["outputs"], mem["outputs"]):
                    assert np.array_equal(a, m.to_numpy())
                assert np.array_equal(recs, mem["records"])
                steady, _, cold = _rates(got, per_interval * batch, warm)
                out += [record(c, "rocksdict", f"rows_per_s_{dist}", steady, "rows/s"),
                        record(c, "rocksdict", f"cold_rows_per_s_{dist}", cold, "rows/s"),
                        record(c, "rocksdict", f"rows_per_s_record_{dist}",
                               record_rows / rec_s, "rows/s")]
            np.save(Path(d) / f"{dist}.npy", keys[:min(rows, 16 * batch)])
            # Resident memory in a fresh interpreter (attached to the base checkpoint, which
            # it does not write); with uniform keys also a budget of an eighth of the key and
            # value bytes that run held at most (not of its budget, which a large budget
            # leaves unfilled), which the changed entries exceed: the run spills.
            got = tiered_rss.measure(Path(d) / "base", Path(d) / f"{dist}.npy", budget,
                                     _RSS_CACHE_BYTES, batch, Path(d) / f"spill-{dist}")
            out += _rss_records(dist, got, budget)
            if dist == "uniform" and got is not None:
                tight = max(1024, min(budget, got["state_bytes_max"]) // 8)
                out += _rss_records(f"{dist}_spill", tiered_rss.measure(
                    Path(d) / "base", Path(d) / f"{dist}.npy", tight, _RSS_CACHE_BYTES, batch,
                    Path(d) / f"spill-{dist}_spill"), tight)
    return out


def _hot_panel(r) -> object:
    """tiered_hot_set's plot: the steady rates, without and with checkpoints, of both backends."""
    names = {"rows_per_s": "steady", "rows_per_s_ckpt": "steady, checkpoints counted"}
    return ("rows/s", f"{r['impl']}: {names[r['metric']]}") if r["metric"] in names else None


@case("tiered_hot_set",
      "running count over a 10M / 1M int64-key checkpoint whose rows draw from a hot set of a "
      "tenth of the keys, which the tiered mode's budget (1/8 of the state) holds: the tiered "
      "mode's cost once its working set is warm, against the in-memory native backend",
      panel=_hot_panel)
def tiered_hot_set(size: Size):
    """The running count of :func:`tiered_running_count` (16 / 2 intervals of 8 / 4 batches of
    64k rows, a checkpoint after each interval, the first half a warm-up) over a checkpoint of
    ``entries`` keys, the rows drawn uniformly from ``hot_keys`` of them (a tenth, picked at
    random: spread over the key groups), whose key and value bytes fit the tiered backend's
    budget (1/8 of the state's): after the warm-up nearly every row finds its key in memory,
    so the rate measures the tiered mode's own work per batch (finding the keys memory lacks,
    the eviction check) beside the kernel the in-memory backend runs alone.

    Records per impl ``tiered`` (attached, ``memory_budget`` 1/8 of the state) and
    ``in-memory`` (restored): ``rows_per_s`` (steady), ``rows_per_s_ckpt`` (steady, checkpoints
    counted); tiered also ``loaded_per_row`` (entries loaded per steady row) and
    ``tiered_over_in_memory`` (the steady rates' ratio). Also ``entries``, ``hot_keys``,
    ``budget_bytes``. Both backends' outputs are checked equal."""
    if not has_native():
        return []
    c = "tiered_hot_set"
    n = size.n(10_000_000, 1_000_000)
    hot = max(1, n // 10)
    batch = min(_BATCH, size.n(_BATCH, _BATCH))
    per_interval = 4 if size.quick else 8
    n_intervals = 2 if size.quick else 16
    warm = n_intervals // 2
    budget = max(4096, n * _ENTRY // 8)
    rng = np.random.default_rng(17)
    rows = n_intervals * per_interval * batch
    intervals = _intervals(rng.permutation(n)[:hot][rng.integers(0, hot, rows)], rows, batch,
                           per_interval)
    out = [record(c, "tiered", "entries", n, "entries"),
           record(c, "tiered", "hot_keys", hot, "keys"),
           record(c, "tiered", "budget_bytes", budget, "bytes")]
    rates, outputs = {}, {}
    with tempfile.TemporaryDirectory(prefix="statecore-bench-") as d:
        _base_checkpoint(Path(d) / "base", n, size)
        for impl in ("in-memory", "tiered"):
            root, store, b = _backend_on_copy(Path(d), impl, impl, budget, size)
            store.restore(b, 1)
            got = _stream(b, store, intervals, 2)
            steady, with_ckpt, _ = _rates(got, per_interval * batch, warm)
            rates[impl] = steady
            outputs[impl] = got["outputs"]
            out += [record(c, impl, "rows_per_s", steady, "rows/s"),
                    record(c, impl, "rows_per_s_ckpt", with_ckpt, "rows/s")]
            if impl == "tiered":
                steady_rows = (n_intervals - warm) * per_interval * batch
                out.append(record(c, impl, "loaded_per_row",
                                  _steady_loaded_per_row(got, warm, steady_rows), "entries"))
            b.close()
            store.close()
            shutil.rmtree(root)
    for a, m in zip(outputs["tiered"], outputs["in-memory"]):
        assert a.equals(m)
    out.append(record(c, "tiered", "tiered_over_in_memory",
                      rates["tiered"] / rates["in-memory"], "ratio"))
    return out


def _rss_records(tag: str, got: dict | None, budget: int) -> list:
    """Records of one :func:`bench.tiered_rss.measure` result (none off Linux): the resident
    memory the run added (``rss_delta_bytes_<tag>``), what it added above the budget
    (``rss_over_budget_bytes_<tag>``) and above the budget and the block cache's bound
    (``rss_over_budget_and_cache_bytes_<tag>``; both 0 when the run stayed within), the most
    key and value bytes held after a batch, the budget, and the spill runs written."""
    if got is None:
        return []
    c = "tiered_running_count"
    return [record(c, "tiered", f"rss_delta_bytes_{tag}", got["rss_delta_bytes"], "bytes"),
            record(c, "tiered", f"rss_over_budget_bytes_{tag}",
                   max(0, got["rss_delta_bytes"] - budget), "bytes"),
            record(c, "tiered", f"rss_over_budget_and_cache_bytes_{tag}",
                   max(0, got["rss_delta_bytes"] - budget - _RSS_CACHE_BYTES), "bytes"),
            record(c, "tiered", f"state_bytes_max_{tag}", got["state_bytes_max"], "bytes"),
            record(c, "tiered", f"budget_bytes_{tag}", budget, "bytes"),
            record(c, "tiered", f"spills_{tag}", got["stats"]["spills"], "runs")]


def _key_groups_of(keys: np.ndarray, mp: int) -> np.ndarray:
    """The key group of every int64 of ``keys`` (each distinct key hashed once)."""
    uniq, inv = np.unique(keys, return_inverse=True)
    kgs = np.fromiter((assign_key_group(int(k), "int64", mp) for k in uniq), np.int32,
                      len(uniq))
    return kgs[inv]


def _warm_up(backend, first_key: int, batches) -> dict:
    """Process, on a just restored/attached ``backend``, one record (``first_key`` + 1) then
    ``batches`` (running count, ``add_batch``), timing each. Returns ``{"first_record_s",
    "first_batch_s", "batch_s": [seconds of each batch], "outputs": [each batch's output]}``,
    the first two from the moment this is called."""
    t0 = time.perf_counter()
    st = backend.get_state(ReducingStateDescriptor("c", "sum", "int64"))
    st.add_batch(pa.array([first_key], pa.int64()), pa.array([1], pa.int64()))
    first = time.perf_counter() - t0
    ones = pa.array(np.ones(len(batches[0]), dtype=np.int64))
    secs, outs = [], []
    for keys in batches:
        t = time.perf_counter()
        outs.append(st.add_batch(pa.array(keys), ones))
        secs.append(time.perf_counter() - t)
    return {"first_record_s": first, "first_batch_s": first + secs[0], "batch_s": secs,
            "outputs": outs}


def _warm_records(c: str, impl: str, restore_s: float, got: dict, batch: int) -> list:
    """Records of one :func:`_warm_up` after a restore of ``restore_s`` seconds: the times from
    the restore's start, the steady rate (median rows/s of the last quarter of the batches)
    and the time until the first batch that reached 90% of it (``warm_s``, with
    ``warm_batches``, the batches processed by then)."""
    secs = got["batch_s"]
    rates = [batch / s for s in secs]
    steady = float(np.median(rates[-max(1, len(rates) // 4):]))
    warm_i = next(i for i, r in enumerate(rates) if r >= 0.9 * steady)
    return [record(c, impl, "restore_s", restore_s, "s"),
            record(c, impl, "first_record_s", restore_s + got["first_record_s"], "s"),
            record(c, impl, "first_batch_s", restore_s + got["first_batch_s"], "s"),
            record(c, impl, "warm_s",
                   restore_s + got["first_record_s"] + sum(secs[:warm_i + 1]), "s"),
            record(c, impl, "warm_batches", warm_i + 1, "batches"),
            record(c, impl, "steady_rows_per_s", steady, "rows/s"),
            record(c, impl, "first_batch_rows_per_s", rates[0], "rows/s")]


def _restore_panel(r) -> object:
    """tiered_restore's plot: per restore kind the seconds to the first record, the first
    batch and the warm working set, tiered beside in-memory; the steady rates."""
    kind, impl = r["impl"].split(" ", 1) if " " in r["impl"] else ("", r["impl"])
    if r["unit"] == "s" and r["metric"] in ("first_record_s", "first_batch_s", "warm_s"):
        return f"{kind} (s)", f"{impl}: {r['metric'][:-2]}"
    if r["metric"] == "steady_rows_per_s":
        return "steady rows/s", r["impl"]
    if r["metric"] == "goal_max_first_record_s":
        return f"{kind} (s)", None
    return None


@case("tiered_restore",
      "restore and rescale (half the key groups) of a checkpoint of 10M / 1M int64 keys: "
      "tiered attach (budget 1/8 of the state) vs in-memory native restore, the time to the "
      "first record, to the first 64k-row Zipf(1.0) batch and until the batches run at 90% "
      "of their steady rate", panel=_restore_panel)
def tiered_restore(size: Size):
    """Per restore kind ``restore`` (one task, all key groups) and ``rescale`` (task 0 of
    parallelism 2: half the key groups, the checkpoint written by one task) and impl
    (``<kind> tiered``: ``create_backend("native", memory_budget=1/8 of the state,
    checkpoint=store)`` + ``CheckpointStore.restore``, which attaches; ``<kind> in-memory``:
    ``create_backend("native")`` + ``CheckpointStore.restore``, which loads the key groups),
    each in a fresh backend, seconds from the restore's start: ``restore_s`` (the restore call),
    ``first_record_s`` (one record processed: a running count of one key), ``first_batch_s``
    (then a 64k-row batch of Zipf(1.0) keys over the task's keys), ``warm_s`` (then batches of
    the same stream until one ran at >= 90% of the steady rate, ``warm_batches`` batches),
    ``steady_rows_per_s`` (median rate of the last quarter of the 32 / 8 batches),
    ``first_batch_rows_per_s``; ``goal_max_first_record_s`` (1 s, tiered). Also ``entries``
    (the checkpoint's) and ``entries_in_range`` (per kind). The tiered and in-memory outputs
    are checked equal."""
    if not has_native():
        return []
    n = size.n(10_000_000, 1_000_000)
    nb = 32 if not size.quick else 8
    batch = min(_BATCH, size.n(_BATCH, _BATCH))
    budget = max(4096, n * _ENTRY // 8)
    c = "tiered_restore"
    rng = np.random.default_rng(12)
    out = [record(c, "tiered", "entries", n, "entries"),
           record(c, "tiered", "budget_bytes", budget, "bytes")]
    with tempfile.TemporaryDirectory(prefix="statecore-bench-") as d:
        root = Path(d) / "base"
        _base_checkpoint(root, n, size)
        mp = CheckpointStore(root).open(1).max_parallelism
        for kind, kgr in (("restore", key_group_range_for_operator(mp, 1, 0)),
                          ("rescale", key_group_range_for_operator(mp, 2, 0))):
            # The task's Zipf stream: a stream over all keys, the rows of its key groups kept.
            want = nb * batch + 1
            keys = np.empty(0, np.int64)
            while len(keys) < want:
                drawn = zipf_keys(rng, n, 2 * want)
                kgs = _key_groups_of(drawn, mp)
                keys = np.concatenate([keys, drawn[(kgs >= kgr.start) & (kgs <= kgr.end)]])
            first_key, keys = int(keys[0]), keys[1:want]
            batches = [keys[i:i + batch] for i in range(0, nb * batch, batch)]
            outputs = {}
            for impl in ("tiered", "in-memory"):
                # A copy of the checkpoint per backend, each restore reading files the other
                # did not just read (both from the page cache alike: the copy is fresh).
                copy = Path(d) / f"{kind}-{impl}"
                shutil.copytree(root, copy)
                store = _store(copy, size)
                opts = {"memory_budget": budget, "checkpoint": store} if impl == "tiered" \
                    else {}
                b = create_backend("native", key_type="int64", max_parallelism=mp,
                                   key_group_range=kgr, **opts)
                t = time.perf_counter()
                store.restore(b, 1)
                restore_s = time.perf_counter() - t
                got = _warm_up(b, first_key, batches)
                outputs[impl] = got["outputs"]
                label = f"{kind} {impl}"
                out += _warm_records(c, label, restore_s, got, batch)
                if impl == "tiered":
                    out.append(record(c, label, "goal_max_first_record_s", 1.0, "s"))
                    out.append(record(c, label, "loaded", b.tiered_statistics()["loaded"],
                                      "entries"))
                else:
                    out.append(record(c, label, "entries_in_range", b.num_entries(),
                                      "entries"))
                b.close()
                store.close()
                shutil.rmtree(copy)
            for a, m in zip(outputs["tiered"], outputs["in-memory"]):
                assert a.equals(m)
    return out


def _written_bytes(manifest: dict) -> int:
    """Bytes of the data files a checkpoint's commit added (those of the manifest's version)."""
    return sum(f["size"] for f in manifest["files"] if f["version"] == manifest["version"])


def _checkpoint_panel(r) -> object:
    """tiered_checkpoint's plot: bytes and seconds per checkpoint over the state sizes."""
    if r["metric"].startswith(("bytes_", "seconds_")):
        what, n = r["metric"].split("_", 1)
        return f"{what} per checkpoint", f"{r['impl']} {n}"
    return None


@case("tiered_checkpoint",
      "checkpoint bytes and seconds vs state size (1M, 4M, 10M int64 keys / 100k, 400k, 1M) "
      "after a fixed change rate (64k / 16k rows of uniform keys per interval): tiered "
      "(budget 1/8) vs in-memory incremental, and the in-memory full checkpoint",
      panel=_checkpoint_panel)
def tiered_checkpoint(size: Size):
    """Per state size ``N`` (label of the metric: 1M, 4M, 10M) each backend, restored from
    version 1 (a full run of N keys, count 1 each), runs intervals of ``rows`` uniform keys
    over 0..N-1 (running count, ``add_batch`` of 64k-row batches) each followed by
    ``CheckpointStore.checkpoint``: impl ``tiered`` (attached; every checkpoint incremental),
    ``in-memory incremental`` (``create_backend("native")`` restored; after a first, full
    checkpoint, which a restored backend's first one is) and ``in-memory full`` (that first
    checkpoint, a full one). Records ``bytes_<N>`` (the data files a checkpoint wrote, median
    over 4 / 2 intervals), ``seconds_<N>`` (median seconds of ``CheckpointStore.checkpoint``:
    snapshot, write, commit, notify), ``rows_per_s_<N>`` (the intervals' rows over their
    ``add_batch`` seconds); ``rows_per_interval`` and ``changed_<N>`` (distinct keys per
    interval, mean). The tiered and in-memory outputs are checked equal."""
    if not has_native():
        return []
    sizes = [size.n(full, quick) for full, quick in
             ((1_000_000, 100_000), (4_000_000, 400_000), (10_000_000, 1_000_000))]
    rows = size.n(1 << 16, 1 << 14)
    intervals = 2 if size.quick else 4
    c = "tiered_checkpoint"
    rng = np.random.default_rng(13)
    out = [record(c, "tiered", "rows_per_interval", rows, "rows"),
           record(c, "tiered", "intervals", intervals, "intervals")]
    for n in sizes:
        lab = label(n)
        streams = [rng.integers(0, n, rows, dtype=np.int64) for _ in range(intervals + 1)]
        with tempfile.TemporaryDirectory(prefix="statecore-bench-") as d:
            root = Path(d) / "base"
            _base_checkpoint(root, n, size)
            outputs = {}
            for impl in ("tiered", "in-memory"):
                copy = Path(d) / impl
                shutil.copytree(root, copy)
                store = _store(copy, size)
                # No background compaction: it would run during the measured intervals.
                opts = {"memory_budget": max(4096, n * _ENTRY // 8), "checkpoint": store,
                        "compact_max_runs": None} if impl == "tiered" else {}
                b = create_backend("native", key_type="int64", **opts)
                store.restore(b, 1)
                st = b.get_state(ReducingStateDescriptor("c", "sum", "int64"))
                secs, nbytes, run_s, outs = [], [], 0.0, []
                for i, keys in enumerate(streams):
                    t = time.perf_counter()
                    for s in range(0, rows, _BATCH):
                        k = keys[s:s + _BATCH]
                        outs.append(st.add_batch(pa.array(k),
                                                 pa.array(np.ones(len(k), np.int64))))
                    run_s += time.perf_counter() - t
                    t = time.perf_counter()
                    manifest = store.checkpoint(b, 2 + i)
                    secs.append(time.perf_counter() - t)
                    nbytes.append(_written_bytes(manifest))
                outputs[impl] = outs
                if impl == "tiered":
                    # Interval 0 warms the attached backend like the in-memory one's full
                    # checkpoint: both report the intervals after it.
                    out += [record(c, impl, f"bytes_{lab}", np.median(nbytes[1:]), "bytes"),
                            record(c, impl, f"seconds_{lab}", np.median(secs[1:]), "s")]
                else:
                    out += [record(c, "in-memory full", f"bytes_{lab}", nbytes[0], "bytes"),
                            record(c, "in-memory full", f"seconds_{lab}", secs[0], "s"),
                            record(c, "in-memory incremental", f"bytes_{lab}",
                                   np.median(nbytes[1:]), "bytes"),
                            record(c, "in-memory incremental", f"seconds_{lab}",
                                   np.median(secs[1:]), "s")]
                out.append(record(c, impl, f"rows_per_s_{lab}",
                                  rows * len(streams) / run_s, "rows/s"))
                b.close()
                store.close()
            for a, m in zip(outputs["tiered"], outputs["in-memory"]):
                assert a.equals(m)
        out.append(record(c, "tiered", f"changed_{lab}",
                          np.mean([len(np.unique(k)) for k in streams[1:]]), "entries"))
    return out


def _compaction_panel(r) -> object:
    """tiered_compaction's plot: seconds per lookup batch over the chain lengths, the chain
    beside its compaction; the compactions' seconds."""
    if r["metric"].startswith("lookup_s_"):
        return "seconds per 64k-key lookup batch", f"{r['impl']} {r['metric'][9:]}"
    if r["metric"].startswith("compaction_s_"):
        return "compaction (s)", r["metric"][13:]
    return None


@case("tiered_compaction",
      "tiered lookups (get_batch of 64k uniform keys, budget and block cache 1/8 of the state) "
      "over an attached "
      "chain of 1, 2, 4, 8, 16 runs of 1M / 100k int64 keys, against the same version "
      "compacted to one run; and the compaction's seconds", panel=_compaction_panel)
def tiered_compaction(size: Size):
    """A full run of ``N`` keys (count 1 each, version 1) and incremental runs on top, each of
    ``N / 100`` uniform keys' counts incremented (one checkpoint of a tiered backend each).
    At chain lengths ``d`` = 1, 2, 4, 8, 16: impl ``chain`` is a tiered backend attached to
    the version (budget and block cache each 1/8 of the state's bytes), impl ``compacted`` one
    attached to a copy of it compacted to one run (``CheckpointStore.compact(max_runs=1)``,
    its seconds recorded as ``compaction_s_<d>runs``); each reads a warm-up batch then
    ``get_batch`` of 4 (quick: 2) batches of 64k uniform keys, fresh each. Records
    ``lookup_s_<d>runs`` (median seconds per batch) and ``blocks_per_batch_<d>runs`` (blocks
    read from the files, from the lookup statistics). The two impls' outputs are checked
    equal."""
    if not has_native():
        return []
    n = size.n(1_000_000, 100_000)
    reps = 2 if size.quick else 4
    c = "tiered_compaction"
    rng = np.random.default_rng(17)
    desc = ReducingStateDescriptor("c", "sum", "int64")
    out = [record(c, "chain", "keys", n, "entries")]
    with tempfile.TemporaryDirectory(prefix="statecore-bench-") as d:
        root = Path(d) / "base"
        _base_checkpoint(root, n, size)
        store = _store(root, size, max_runs=None)
        writer = create_backend("native", key_type="int64", memory_budget=n * _ENTRY // 8,
                                checkpoint=store, compact_max_runs=None)
        store.restore(writer, 1)
        st = writer.get_state(desc)
        version = 1
        for depth in (1, 2, 4, 8, 16):
            while version < depth:  # version v holds a chain of v runs
                keys = pa.array(rng.integers(0, n, max(1, n // 100), dtype=np.int64))
                st.add_batch(keys, pa.array(np.ones(len(keys), np.int64)))
                version += 1
                store.checkpoint(writer, version)
            copy = Path(d) / f"compacted-{depth}"
            shutil.copytree(root, copy)
            compacted = _store(copy, size, max_runs=None)
            t = time.perf_counter()
            compacted.compact(version, max_runs=1)
            out.append(record(c, "compaction", f"compaction_s_{depth}runs",
                              time.perf_counter() - t, "s"))
            batches = [pa.array(rng.integers(0, n, _BATCH, dtype=np.int64))
                       for _ in range(reps + 1)]
            got = {}
            for impl, s in (("chain", store), ("compacted", compacted)):
                b = create_backend("native", key_type="int64", memory_budget=n * _ENTRY // 8,
                                   cache_bytes=max(1 << 20, n * _ENTRY // 8), checkpoint=s,
                                   compact_max_runs=None)
                s.restore(b, version)
                assert b.attached_runs() == (depth if impl == "chain" else 1)
                reader = b.get_state(desc)
                reader.get_batch(batches[0])
                blocks0 = b.tiered_statistics()["lookup"]["blocks_read"]
                secs, outs = [], []
                for keys in batches[1:]:
                    t = time.perf_counter()
                    outs.append(reader.get_batch(keys))
                    secs.append(time.perf_counter() - t)
                blocks = b.tiered_statistics()["lookup"]["blocks_read"] - blocks0
                got[impl] = outs
                out += [record(c, impl, f"lookup_s_{depth}runs", np.median(secs), "s"),
                        record(c, impl, f"blocks_per_batch_{depth}runs", blocks / reps,
                               "blocks")]
                b.close()
            compacted.close()
            shutil.rmtree(copy)
            for a, m in zip(got["chain"], got["compacted"]):
                assert a.equals(m)
        writer.close()
        store.close()
    return out


#: Elements per list of tiered_collections' checkpoint (three chunks: 32 + 32 + 2) and user
#: keys per map.
_LIST_ELEMENTS = 66
_MAP_USER_KEYS = 4
_COLL_BATCH = 1 << 14


def _collections_checkpoint(root: Path, n: int, size: Size) -> int:
    """Version 1 of a new checkpoint store at ``root``: one full run of a list state ("l",
    int64 elements; keys 0..n-1 each a list of :data:`_LIST_ELEMENTS` elements, three chunks)
    and a map state ("m", int64 -> int64; keys 0..n-1 each :data:`_MAP_USER_KEYS` user keys),
    written by the native backend. Returns the state's key and value bytes."""
    store = _store(root, size)
    b = create_backend("native", key_type="int64")
    ls = b.get_state(ListStateDescriptor("l", "int64"))
    ms = b.get_state(MapStateDescriptor("m", "int64", "int64"))
    step = max(1, _LOAD_BATCH // _LIST_ELEMENTS)
    for s in range(0, n, step):
        k = np.arange(s, min(n, s + step), dtype=np.int64)
        flat = np.arange(len(k) * _LIST_ELEMENTS, dtype=np.int64)
        ls.append_batch(pa.array(k), pa.ListArray.from_arrays(
            pa.array(np.arange(0, len(flat) + 1, _LIST_ELEMENTS, dtype=np.int32)), flat))
        mk = np.repeat(k, _MAP_USER_KEYS)
        uk = np.tile(np.arange(_MAP_USER_KEYS, dtype=np.int64), len(k))
        ms.put_batch(pa.array(mk), pa.array(uk), pa.array(mk * 10 + uk))
    nbytes = b.state_bytes()
    store.checkpoint(b, 1, incremental=False)
    store.close()
    b.close()
    return nbytes


def _collections_stream(backend, store, intervals, rng_seed: int) -> dict:
    """Per batch of ``intervals`` (lists of key batches) on ``backend``: ``append_batch`` of
    one element per row and ``get_batch`` of the same keys (list "l"), ``put_batch`` of one user
    key per row (drawn from 0..2 * :data:`_MAP_USER_KEYS`: half new, half overwritten) and
    ``get_batch`` of another drawn user key (map "m"); each interval followed by
    ``store.checkpoint(backend, 2 + i)``. Returns ``{"list_s", "map_s", "ckpt_s": [seconds per
    interval], "outputs": [each batch's two read outputs], "stats": [tiered_statistics() after
    each interval, when the backend has them]}``."""
    ls = backend.get_state(ListStateDescriptor("l", "int64"))
    ms = backend.get_state(MapStateDescriptor("m", "int64", "int64"))
    rng = np.random.default_rng(rng_seed)
    got = {"list_s": [], "map_s": [], "ckpt_s": [], "outputs": [], "stats": []}
    for i, batches in enumerate(intervals):
        list_s = map_s = 0.0
        for keys in batches:
            k = pa.array(keys)
            put_uk = pa.array(rng.integers(0, 2 * _MAP_USER_KEYS, len(keys), dtype=np.int64))
            get_uk = pa.array(rng.integers(0, 2 * _MAP_USER_KEYS, len(keys), dtype=np.int64))
            t = time.perf_counter()
            ls.append_batch(k, k)
            lists = ls.get_batch(k)
            t2 = time.perf_counter()
            ms.put_batch(k, put_uk, k)
            maps = ms.get_batch(k, get_uk)
            t3 = time.perf_counter()
            list_s += t2 - t
            map_s += t3 - t2
            got["outputs"].append((lists, maps))
        got["list_s"].append(list_s)
        got["map_s"].append(map_s)
        t = time.perf_counter()
        store.checkpoint(backend, 2 + i)
        got["ckpt_s"].append(time.perf_counter() - t)
        if hasattr(backend, "tiered_statistics"):
            got["stats"].append(backend.tiered_statistics())
    return got


def _collections_records(backend, keys: np.ndarray) -> list:
    """Per record (``set_current_key`` per row): the list's ``get()`` and the map's ``get`` of
    user key ``key % 2 *`` :data:`_MAP_USER_KEYS` of each key of ``keys``; returns them."""
    ls = backend.get_state(ListStateDescriptor("l", "int64"))
    ms = backend.get_state(MapStateDescriptor("m", "int64", "int64"))
    out = []
    for k in keys.tolist():
        backend.set_current_key(k)
        out.append((list(ls.get()), ms.get(k % (2 * _MAP_USER_KEYS))))
    return out


def _collections_panel(r) -> object:
    """tiered_collections' plot: the list and map rows/s of each impl."""
    for kind in ("list", "map"):
        if r["metric"] == f"rows_per_s_{kind}_uniform":
            return "uniform keys: rows/s", f"{r['impl']}: {kind}"
    if r["metric"] == "rows_per_s_record_uniform":
        return "uniform keys: rows/s per record", r["impl"]
    return None


@case("tiered_collections",
      "list and map states (ListState append_batch + get_batch, MapState put_batch + "
      "get_batch) over a checkpoint of 250k / 25k int64 keys (a 3-chunk list and 4 user keys "
      "each) with a memory budget of 1/8 of the state (tiered mode: whole lists and maps "
      "loaded on first touch), uniform keys, 16k-row batches checkpointed every "
      "4 / 2 batches, then per record; vs the in-memory native backend restored from the "
      "same checkpoint",
      panel=_collections_panel)
def tiered_collections(size: Size):
    """A stream of 4 / 2 intervals of 4 / 2 batches of 16k keys, drawn uniformly (``<dist>`` =
    ``uniform`` in the metric names) over the ``entries`` keys of version 1
    (:func:`_collections_checkpoint`), each batch ``append_batch`` + ``get_batch`` on the list
    state and ``put_batch`` + ``get_batch`` on the map state (:func:`_collections_stream`),
    each interval followed by an incremental checkpoint; then ``record_rows`` (4k / 1k) more
    uniform keys per record (:func:`_collections_records`: a list ``get()`` and a map ``get``
    per row, a collection load each where memory lacks it). Impl ``tiered``: ``memory_budget`` =
    1/8 of the state's key and value bytes (or ``python -m bench --memory-budget``), attached;
    ``in-memory``: ``create_backend("native")`` restored from the same version.

    Records per impl: ``rows_per_s_list_<dist>`` / ``rows_per_s_map_<dist>``
    (the stream's rows over the seconds of its two list / map calls per batch), ``rows_per_s_
    <dist>`` (rows over both), ``checkpoint_s_<dist>`` (median seconds of a checkpoint),
    ``rows_per_s_record_<dist>`` (per record); tiered
    also ``loaded_collections_per_row_<dist>`` (lists and maps fetched from the runs per row,
    ``fetched_keys`` of the value states excluded: there are none) and ``loaded_per_row_<dist>``
    (entries loaded per row). Also ``entries`` and ``budget_bytes``. Both impls' outputs are
    checked equal."""
    if not has_native():
        return []
    c = "tiered_collections"
    n = size.n(250_000, 25_000)
    batch = min(_COLL_BATCH, n)
    per_interval = 4 if not size.quick else 2
    n_intervals = 4 if not size.quick else 2
    rows = n_intervals * per_interval * batch
    record_rows = size.n(4096, 1024)
    rng = np.random.default_rng(13)
    # Uniform keys only: under Zipf the hot keys' lists grow by thousands of elements and
    # every read of one returns all of them, which would measure the output, not the loads.
    draw = {"uniform": lambda m: rng.integers(0, n, m, dtype=np.int64)}
    out = [record(c, "tiered", "entries", n, "entries"),
           record(c, "tiered", "rows", rows, "rows")]
    with tempfile.TemporaryDirectory(prefix="statecore-bench-") as d:
        nbytes = _collections_checkpoint(Path(d) / "base", n, size)
        budget = size.memory_budget or max(4096, nbytes // 8)
        out.append(record(c, "tiered", "budget_bytes", budget, "bytes"))
        for dist, gen in draw.items():
            keys = gen(rows + record_rows)
            per_record = keys[rows:]
            intervals = _intervals(keys, rows, batch, per_interval)
            results = {}
            for impl in ("in-memory", "tiered"):
                root, store, b = _backend_on_copy(Path(d), f"{dist}-{impl}", impl, budget, size)
                store.restore(b, 1)
                got = _collections_stream(b, store, intervals, 7)
                t = time.perf_counter()
                got["records"] = _collections_records(b, per_record)
                rec_s = time.perf_counter() - t
                results[impl] = got
                list_s, map_s = sum(got["list_s"]), sum(got["map_s"])
                out += [record(c, impl, f"rows_per_s_list_{dist}", rows / list_s, "rows/s"),
                        record(c, impl, f"rows_per_s_map_{dist}", rows / map_s, "rows/s"),
                        record(c, impl, f"rows_per_s_{dist}", rows / (list_s + map_s),
                               "rows/s"),
                        record(c, impl, f"checkpoint_s_{dist}", np.median(got["ckpt_s"]), "s"),
                        record(c, impl, f"rows_per_s_record_{dist}", record_rows / rec_s,
                               "rows/s")]
                if impl == "tiered":
                    last = got["stats"][-1]
                    out += [record(c, impl, f"loaded_collections_per_row_{dist}",
                                   last["fetched_keys"] / rows, "collections"),
                            record(c, impl, f"loaded_per_row_{dist}", last["loaded"] / rows,
                                   "entries")]
                b.close()
                store.close()
                shutil.rmtree(root)
            for (tl, tm), (ml, mm) in zip(results["tiered"]["outputs"],
                                          results["in-memory"]["outputs"]):
                assert tl.equals(ml) and tm.equals(mm)
            assert results["tiered"]["records"] == results["in-memory"]["records"]
    return out

"""Point lookups into checkpoint runs (``statecore.checkpoint.lookup.RunLookup``, docs/tiered.md):
the read path of a state served from its checkpoint instead of from memory, against restoring
the whole checkpoint into the native backend and reading it with ``get_batch``, in the same run.
"""

from __future__ import annotations

import gc
import os
import tempfile
import time

import numpy as np
import pyarrow as pa

from bench.common import has_native
from bench.harness import Size, case, record
from bench.workloads import zipf_keys
from statecore import CheckpointStore, ValueStateDescriptor, create_backend
from statecore import serializers as S
from statecore.checkpoint.lookup import RunLookup
from statecore.key_groups import assign_key_groups

_LOAD_BATCH = 1 << 20
_BATCH = 1 << 16
_CACHE_BYTES = 512 << 20


def _encoded(keys: np.ndarray, max_parallelism: int) -> pa.Array:
    """Encoded keys (docs/formats.md "Encoded key") of int64 ``keys`` in the void namespace."""
    kgs = assign_key_groups(pa.array(keys), "int64", max_parallelism)
    return pa.array([S.encode_key(int(g), max_parallelism, int(k), "int64", None, "void")
                     for g, k in zip(kgs, keys)], pa.binary())



def _lookup_records(store, impl: str, encoded: dict, batch: int, n: int) -> list:
    """The records of impl ``impl`` over version 1 of ``store`` (:func:`run_lookup`)."""
    out = []
    with store.open(1) as reader:
        run = reader.manifest["files"][0]
        data = reader.data_file(run)
        out.append(record("run_lookup", impl, "footer_bytes_per_entry",
                          data.footer_length / n, "bytes"))
        out.append(record("run_lookup", impl, "filter_bytes_per_entry",
                          data.filter_bytes / n, "bytes"))
        out.append(record("run_lookup", impl, "stored_bytes_per_entry",
                          run["stored_bytes"] / n, "bytes"))
        lk = RunLookup(reader, cache_bytes=_CACHE_BYTES)
        t = time.perf_counter()
        lk.lookup_batch("v", encoded["uniform"].slice(0, 1))
        out.append(record("run_lookup", impl, "open_ms", (time.perf_counter() - t) * 1e3, "ms"))
        for kind in ("uniform", "zipf", "absent"):
            lk.cache = type(lk.cache)(_CACHE_BYTES)
            before = dict(lk.statistics())
            t = time.perf_counter()
            got = lk.lookup_batch("v", encoded[kind])
            cold = time.perf_counter() - t
            after = lk.statistics()
            t = time.perf_counter()
            again = lk.lookup_batch("v", encoded[kind])
            warm = time.perf_counter() - t
            if kind == "absent":
                assert got.null_count == batch
                passed = (after["filter_false_positives"] - before["filter_false_positives"]
                          + after["range_negatives"] - before["range_negatives"])
                out.append(record("run_lookup", impl, "filter_fp_rate", passed / batch,
                                  "ratio"))
            else:
                assert got.null_count == 0 and again.equals(got)
            out.append(record("run_lookup", impl, f"rows_per_s_{kind}_cold",
                              batch / cold, "rows/s"))
            out.append(record("run_lookup", impl, f"rows_per_s_{kind}_warm",
                              batch / warm, "rows/s"))
            out.append(record("run_lookup", impl, f"blocks_per_lookup_{kind}",
                              (after["blocks_read"] - before["blocks_read"]) / batch,
                              "blocks"))
            out.append(record("run_lookup", impl, f"bytes_per_lookup_{kind}",
                              (after["bytes_read"] - before["bytes_read"]) / batch, "bytes"))
        lk.close()
    return out


@case("run_lookup", "point lookups into a checkpoint's runs (RunLookup: Bloom filter, block "
                    "keys, block cache) for 64k-key batches, cold and warm, LZ4 and uncompressed "
                    "blocks, vs a full restore + get_batch of the native backend; 10M / 1M "
                    "int64 entries")
def run_lookup(size: Size):
    """Records of impl ``lookup`` (a run of LZ4 blocks, the stores' default) and ``lookup
    none`` (the same entries in a run of uncompressed blocks, ``compression="none"``):
    ``entries``; per batch kind ``uniform`` / ``zipf`` (present keys) and ``absent``:
    ``rows_per_s_<kind>_cold`` (empty block cache; filters already read) and ``_warm`` (the
    same batch again), ``blocks_per_lookup_<kind>`` and ``bytes_per_lookup_<kind>`` (stored
    bytes read per key, cold); ``filter_fp_rate`` (absent keys the filter passed); ``open_ms``
    (footer and Bloom filters of the file read: the first lookup); ``footer_bytes_per_entry``,
    ``filter_bytes_per_entry``, ``stored_bytes_per_entry`` (the run's blocks). Impl
    ``restore+get_batch``: ``restore_s`` and ``rows_per_s_<kind>`` of ``get_batch`` on the
    native backend restored from the LZ4 run. Both runs cut blocks at the stores' default
    64 KiB."""
    if not has_native():
        return []
    n = size.n(10_000_000, 1_000_000)
    batch = min(_BATCH, n)
    rng = np.random.default_rng(7)
    out = [record("run_lookup", "lookup", "entries", n, "entries")]
    b = create_backend("native", key_type="int64")
    mp = b.max_parallelism
    st = b.get_state(ValueStateDescriptor("v", "int64"))
    for s in range(0, n, _LOAD_BATCH):
        k = pa.array(np.arange(s, min(n, s + _LOAD_BATCH), dtype=np.int64))
        st.put_batch(k, k)
    batches = {"uniform": rng.integers(0, n, batch, dtype=np.int64),
               "zipf": zipf_keys(rng, n, batch),
               "absent": rng.integers(n, 2 * n, batch, dtype=np.int64)}
    encoded = {kind: _encoded(keys, mp) for kind, keys in batches.items()}
    with tempfile.TemporaryDirectory(prefix="statecore-bench-") as d:
        store = CheckpointStore(os.path.join(d, "lz4"))
        plain = CheckpointStore(os.path.join(d, "none"), compression="none")
        store.checkpoint(b, 1, incremental=False)
        plain.checkpoint(b, 1, incremental=False)
        b.close()
        del b, st
        gc.collect()
        out += _lookup_records(store, "lookup", encoded, batch, n)
        out += _lookup_records(plain, "lookup none", encoded, batch, n)
        fresh = create_backend("native", key_type="int64")
        t = time.perf_counter()
        store.restore(fresh, 1)
        out.append(record("run_lookup", "restore+get_batch", "restore_s",
                          time.perf_counter() - t, "s"))
        fst = fresh.get_state(ValueStateDescriptor("v", "int64"))
        for kind, keys in batches.items():
            arr = pa.array(keys)
            t = time.perf_counter()
            fst.get_batch(arr)
            out.append(record("run_lookup", "restore+get_batch", f"rows_per_s_{kind}",
                              batch / (time.perf_counter() - t), "rows/s"))
        fresh.close()
    return out

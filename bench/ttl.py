"""TTL cases: what state TTL costs the batch paths (native kernels with the timestamp suffix vs
without; the pure-Python TTL states at a reduced size) and the memory per entry it adds.

Workload: ReducingState ``sum`` int64 -> int64 over keys 0..n-1 (loaded first with one add_batch
per key), then random existing keys in 64k-row Arrow batches: ``add_batch`` (running sum, one
write per row) and ``get_batch``. TTL is one day with the default wall clock (processing time,
OnCreateAndWrite, NeverReturnExpired), so nothing expires during a run: the figures are the
steady-state cost of reading and writing timestamps (best of three interleaved runs per
configuration). Impl names: ``native`` / ``python`` (no
TTL) and ``native+ttl`` / ``python+ttl``.
"""

from __future__ import annotations

import gc

import numpy as np
import pyarrow as pa

from bench.common import has_native, label, probe_in_child, rss_bytes
from bench.harness import Size, case, record, timed
from statecore import ReducingStateDescriptor, create_backend
from statecore.ttl import StateTtlConfig

_BATCH = 65_536
# The batch size of every other case. Larger load batches would measure the loader's transient
# buffers too (outputs, key groups, the int64 overflow undo log), which glibc keeps resident
# after freeing, as if they were the state's.
_LOAD_BATCH = 65_536
_DAY_MS = 86_400_000


def _descriptor(ttl: bool) -> ReducingStateDescriptor:
    d = ReducingStateDescriptor("sum", "sum", "int64")
    return d.enable_time_to_live(StateTtlConfig(_DAY_MS)) if ttl else d


def _loaded(impl: str, n: int, ttl: bool):
    """A backend of ``impl`` holding keys 0..n-1 (value = key), TTL on or off, and its state."""
    b = create_backend(impl, key_type="int64")
    st = b.get_state(_descriptor(ttl))
    for s in range(0, n, _LOAD_BATCH):
        k = pa.array(np.arange(s, min(n, s + _LOAD_BATCH), dtype=np.int64))
        st.add_batch(k, k)
    return b, st


def _random_batches(keys: int, rows: int, seed: int = 7):
    rng = np.random.default_rng(seed)
    ones = pa.array(np.ones(_BATCH, np.int64))
    return [(pa.array(rng.integers(0, keys, min(_BATCH, rows - s), dtype=np.int64)),
             ones[:min(_BATCH, rows - s)]) for s in range(0, rows, _BATCH)]


def _throughput(impl: str, keys: int, rows: int, ttl: bool) -> dict:
    """rows/s of add_batch and get_batch over ``rows`` random existing keys. The backend is
    released when this returns; the caller collects it before loading the next."""
    b, st = _loaded(impl, keys, ttl)
    batches = _random_batches(keys, rows)
    n = sum(len(k) for k, _ in batches)
    add = n / timed(lambda: [st.add_batch(k, v) for k, v in batches])
    get = n / timed(lambda: [st.get_batch(k) for k, _ in batches])
    b.close()
    return {"add_batch": add, "get_batch": get}


def _impls(size: Size) -> list:
    """(impl, [(keys, rows)]) to measure: native at 1M keys (and 10M unless quick), python at a
    reduced size. Python is left out when the extension is missing (and native then too)."""
    out = []
    if has_native():
        sizes = [(size.n(1_000_000, 200_000), size.n(4_000_000, 500_000))]
        if not size.quick:
            sizes.append((size.n(10_000_000, 10_000_000), size.n(4_000_000, 500_000)))
        out.append(("native", sizes))
    out.append(("python", [(size.n(200_000, 50_000), size.n(400_000, 100_000))]))
    return out


@case("ttl_throughput", "add_batch (running sum) and get_batch rows/s, int64 -> int64, "
                        "TTL on vs off, native at 1M (and 10M) keys, python at a reduced size")
def ttl_throughput(size: Size):
    out = []
    for impl, sizes in _impls(size):
        for keys, rows in sizes:
            # Best of three interleaved runs: the first run in a process is measurably slower
            # (warm-up, allocator state), which would otherwise favour whichever runs second.
            got = {False: {}, True: {}}
            for _ in range(3):
                for ttl in (False, True):
                    rates = _throughput(impl, keys, rows, ttl)
                    gc.collect()
                    for op, v in rates.items():
                        got[ttl][op] = max(v, got[ttl].get(op, 0.0))
            tag = f"{label(keys)}_keys"
            for op in ("add_batch", "get_batch"):
                for ttl in (False, True):
                    out.append(record("ttl_throughput", impl + ("+ttl" if ttl else ""),
                                      f"{op}_rows_per_s_{tag}", got[ttl][op], "rows/s"))
                out.append(record("ttl_throughput", impl, f"{op}_ttl_over_plain_{tag}",
                                  got[True][op] / got[False][op], "ratio"))
    return out


# --------------------------------------------------------------------------- memory

def rss_probe(impl: str, n: int, ttl: bool) -> dict:
    """Load ``n`` entries (TTL on or off) into a fresh ``impl`` backend: ``{"rss_delta": bytes,
    "state_bytes": bytes, "entries": int}``, the RSS growth counted after a load of 1,000
    entries into another backend (imports, lazy initialization). Meant for a fresh interpreter
    (see :func:`_probe_in_child`)."""
    # One-time costs of a process's first use (importing the native backend, its lazy
    # initialization) are not the state's: a small load of the same kind comes first.
    warm, _ = _loaded(impl, 1000, ttl)
    warm.close()
    del warm
    gc.collect()
    r0 = rss_bytes()
    b, _ = _loaded(impl, n, ttl)
    return {"rss_delta": rss_bytes() - r0, "state_bytes": b.state_bytes(),
            "entries": b.num_entries()}


def _probe_in_child(impl: str, n: int, ttl: bool) -> dict:
    """:func:`rss_probe` in a child interpreter (see :func:`bench.common.probe_in_child`). Raises
    RuntimeError if the child fails."""
    return probe_in_child("bench.ttl", "rss_probe", impl, n, ttl)


@case("ttl_memory", "bytes per entry (RSS growth / entries, child interpreter; and key+value "
                    "bytes) of the native backend, TTL on vs off, at 1M and 10M entries")
def ttl_memory(size: Size):
    if not has_native():
        return []
    out = []
    ns = [size.n(1_000_000, 200_000)] + ([] if size.quick else [size.n(10_000_000, 10_000_000)])
    for n in ns:
        got = {ttl: _probe_in_child("native", n, ttl) for ttl in (False, True)}
        tag = f"{label(n)}_entries"
        for ttl in (False, True):
            impl = "native+ttl" if ttl else "native"
            e = max(1, got[ttl]["entries"])
            out.append(record("ttl_memory", impl, f"rss_bytes_per_entry_{tag}",
                              got[ttl]["rss_delta"] / e, "bytes"))
            out.append(record("ttl_memory", impl, f"state_bytes_per_entry_{tag}",
                              got[ttl]["state_bytes"] / e, "bytes"))
        out.append(record("ttl_memory", "native", f"rss_ttl_over_plain_{tag}",
                          got[True]["rss_delta"] / max(1, got[False]["rss_delta"]), "ratio"))
    return out

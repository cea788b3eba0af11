"""TTL cleanup case: what each of Flink's TTL cleanup strategies costs, per 1M state accesses
(the strategies that run on access) or per 1M entries of state (the ones that pass over the
whole state), native backend vs the pure-Python one, measured in one run.

Workload: ValueState int64 -> int64 with a TTL of ``_TTL_MS`` over keys 0..n-1 and a manual
processing-time clock (``create_backend(..., ttl_clock=ManualClock)``): even keys are written at
0, odd keys at ttl/2, then the clock is set to ttl and stays there, so exactly the even half of
the state is expired (``ceil(n/2)`` entries) and nothing else expires while measuring. n = 1M
native, 200k python (200k / 50k with ``--quick``).

Strategies on access: n accesses of uniformly random existing keys -- as many accesses as keys,
so at every size about 63% of the keys are touched and 5 entries of incremental cleanup per
access make 5 passes over the state -- each run on a freshly loaded backend (a run removes what
it expires, so it cannot be repeated on the same state). ``per_record``: ``set_current_key(k)``
then ``value()``; ``get_batch``: 64k-row Arrow batches. Configurations (impl suffix):

* none -- TTL off, the reference of ``+read``;
* ``+read`` -- TTL with only cleanup on read (the expiry check of every access, always on): the
  baseline of the strategies below;
* ``+incremental5`` -- ``cleanup_incrementally=5`` (Flink's default), 5 entries per access (a
  step before each access; on ``get_batch`` before each row);
* ``+every_record5`` -- the same plus ``run_cleanup_for_every_record`` (per record only; on
  ``get_batch`` it would be two steps a row, twice ``+incremental5``'s).

Strategies over the whole state (n entries, half expired):

* ``background`` (``+background``): ``run_background_ttl_cleanup`` over all key groups; the
  first pass removes the expired half, the idle pass over what is left removes nothing;
* ``full_snapshot``: ``snapshot()`` then ``CheckpointStore.write_snapshot`` to a temporary
  directory, ``+full_snapshot`` (``cleanup_full_snapshot``: the expired half is left out of the
  file, not removed from the state) vs ``+read``;
* ``compaction``: ``CheckpointStore.compact(max_runs=1)`` of a full run plus an incremental run
  (1% of the keys re-written at the current time), ``+compaction`` (``cleanup_in_compaction
  =1000``) vs ``+read``. The store compacts files with the same code
  (``statecore.ttl.compaction_filter``, its filter in C++ when the extension is built)
  whichever backend wrote them: native and python differ only in size here.

Times are best of three interleaved runs (per-record loops: one with --quick),
normalised to seconds per 1M accesses or per 1M entries of the state. Metrics (impl = backend +
suffix): ``{per_record,get_batch}_s_per_1M_accesses``, ``{...}_removed_read`` and
``{...}_removed_incremental`` (entries the run removed, ``backend.ttl_statistics()``),
``{...}_ratio_over_ttl_off`` (``+read``) and ``{...}_ratio_over_read_only`` (the others);
``background_pass_s_per_1M_entries``, ``background_idle_pass_s_per_1M_entries``,
``background_removed``; ``{full_snapshot,compaction}_s_per_1M_entries``,
``{...}_removed`` (entries left out of the snapshot / dropped by the compaction),
``{...}_ratio_over_read_only``; per backend ``state_entries``, ``expired_entries``,
``accesses``.
"""

from __future__ import annotations

import gc
import shutil
import tempfile

import numpy as np
import pyarrow as pa

from bench.common import has_native
from bench.harness import Size, case, record, timed
from statecore import CheckpointStore, ValueStateDescriptor, create_backend
from statecore.ttl import ManualClock, StateTtlConfig

_CASE = "ttl_cleanup"
_TTL_MS = 60_000
_BATCH = 65_536
_LOAD_BATCH = 500_000
_PER_1M = 1_000_000

# Suffix -> TTL config (None: TTL off). "+read" is what every other config adds a strategy to.
_CONFIGS = {
    "": None,
    "+read": StateTtlConfig(_TTL_MS),
    "+incremental5": StateTtlConfig(_TTL_MS, cleanup_incrementally=5),
    "+every_record5": StateTtlConfig(_TTL_MS, cleanup_incrementally=5,
                                     run_cleanup_for_every_record=True),
    "+background": StateTtlConfig(_TTL_MS, cleanup_in_background=True),
    "+full_snapshot": StateTtlConfig(_TTL_MS, cleanup_full_snapshot=True),
    "+compaction": StateTtlConfig(_TTL_MS, cleanup_in_compaction=1000),
}
_ACCESS_OPS = {"per_record": ("", "+read", "+incremental5", "+every_record5"),
               "get_batch": ("", "+read", "+incremental5")}


def _loaded(impl: str, suffix: str, n: int):
    """``(backend, state, clock)``: a fresh ``impl`` backend holding keys 0..n-1 (value = key)
    under configuration ``suffix``, even keys written at 0 and odd ones at ttl/2, the clock at
    ttl: the even half is expired."""
    clock = ManualClock(0)
    b = create_backend(impl, key_type="int64", ttl_clock=clock)
    d = ValueStateDescriptor("v", "int64")
    cfg = _CONFIGS[suffix]
    st = b.get_state(d if cfg is None else d.enable_time_to_live(cfg))
    for start, t in ((0, 0), (1, _TTL_MS // 2)):
        clock.set(t)
        for s in range(start, n, 2 * _LOAD_BATCH):
            k = pa.array(np.arange(s, min(n, s + 2 * _LOAD_BATCH), 2, dtype=np.int64))
            st.put_batch(k, k)
    clock.set(_TTL_MS)
    return b, st, clock


def _dispose(b) -> None:
    b.close()
    gc.collect()  # a closed 1M-entry backend would otherwise still be there in the next run


def _removed(b, before: dict) -> dict:
    """``{strategy: entries removed}`` since ``before`` (a ``ttl_statistics()``)."""
    return {k: v - before.get(k, 0) for k, v in b.ttl_statistics().items()}


def _access_run(impl: str, op: str, suffix: str, n: int, keys: np.ndarray) -> tuple:
    """``(seconds, removed)`` of one access run of ``op`` over ``keys`` on a fresh backend."""
    b, st, _ = _loaded(impl, suffix, n)
    if op == "per_record":
        ks = keys.tolist()
        # Bound once so that the loop's own overhead, the same in every configuration, is small.
        set_key, value = b.set_current_key, st.value

        def run():
            for k in ks:
                set_key(k)
                value()
    else:
        batches = [pa.array(keys[s:s + _BATCH]) for s in range(0, len(keys), _BATCH)]

        def run():
            for k in batches:
                st.get_batch(k)
    before = b.ttl_statistics()
    dt = timed(run)
    removed = _removed(b, before)
    _dispose(b)
    return dt, removed


def _background_run(impl: str, n: int) -> tuple:
    """``(first pass s, idle pass s, entries the idle pass visited, removed)``: two passes of
    background cleanup over all key groups of a fresh backend."""
    b, _, _ = _loaded(impl, "+background", n)
    kgs = len(b.key_group_range)
    removed = []
    first = timed(lambda: removed.append(b.run_background_ttl_cleanup(kgs)))
    left = b.num_entries()
    idle = timed(lambda: removed.append(b.run_background_ttl_cleanup(kgs)))
    if removed[1]:
        raise AssertionError(f"the idle background pass removed {removed[1]} entries")
    _dispose(b)
    return first, idle, left, removed[0]


def _snapshot_write(b, store_dir: str) -> tuple:
    """``(seconds, entries left out)``: ``snapshot()`` + a full checkpoint write of it."""
    store = CheckpointStore(store_dir, max_runs=None)
    before = b.ttl_statistics()
    holder = []

    def write():
        snap = b.snapshot()
        holder.append(snap)
        store.write_snapshot(snap, 1)

    dt = timed(write)
    holder[0].release()
    store.close()
    # The native backend counts what the filter left out when the writer reads the snapshot,
    # the python one in snapshot(): both are in by now.
    return dt, _removed(b, before)["full_snapshot"]


def _compaction_template(impl: str, suffix: str, n: int, root: str) -> str:
    """A store under ``root`` whose version 2 is a full run of the loaded state plus an
    incremental run re-writing every 100th key (now: those even keys are alive again), i.e. two
    runs for ``compact(2, max_runs=1)`` to merge. Returns its directory."""
    b, st, clock = _loaded(impl, suffix, n)
    path = f"{root}/template-{impl}{suffix}"
    store = CheckpointStore(path, max_runs=None, ttl_clock=clock)
    snap = b.snapshot()
    store.commit(1, [store.write_snapshot(snap, 1)])
    b.notify_checkpoint_complete(snap.snapshot_id, 1)
    snap.release()
    k = pa.array(np.arange(0, n, 100, dtype=np.int64))
    st.put_batch(k, k)
    snap = b.snapshot(incremental=True)
    store.commit(2, [store.write_snapshot(snap, 2)])
    snap.release()
    store.close()
    _dispose(b)
    return path


def _compaction_run(template: str, dest: str) -> tuple:
    """``(seconds, entries dropped)`` of compacting a fresh copy of ``template`` (a compaction
    rewrites the version it compacts, so each run needs its own copy)."""
    shutil.copytree(template, dest)
    store = CheckpointStore(dest, max_runs=None, ttl_clock=ManualClock(_TTL_MS))
    out = []
    dt = timed(lambda: out.append(store.compact(2, max_runs=1)))
    store.close()
    if len(out[0]["files"]) != 1:
        raise AssertionError(f"compaction left {len(out[0]['files'])} runs, expected 1")
    dropped = sum(out[0].get("ttl_compaction_expired", {}).values())
    shutil.rmtree(dest)
    return dt, dropped


def _sizes(size: Size) -> list:
    """``[(impl, entries)]``: native at 1M entries (200k quick), python at a reduced size;
    native left out when the extension is missing."""
    out = []
    if has_native():
        out.append(("native", size.n(1_000_000, 200_000)))
    out.append(("python", size.n(200_000, 50_000)))
    return out


def _per_1m(seconds: float, count: int) -> float:
    return seconds * _PER_1M / max(1, count)


def _best(runs: list) -> tuple:
    """The run with the least time of ``[(seconds, ...)]``."""
    return min(runs, key=lambda r: r[0])


def _measure_access(impl: str, n: int, reps: dict) -> list:
    keys = np.random.default_rng(17).integers(0, n, n, dtype=np.int64)
    out = []
    for op, suffixes in _ACCESS_OPS.items():
        runs = {s: [] for s in suffixes}
        # Interleaved, so that drift of the shared machine hits every configuration alike.
        for _ in range(reps[op]):
            for s in suffixes:
                runs[s].append(_access_run(impl, op, s, n, keys))
        t = {s: _per_1m(_best(runs[s])[0], n) for s in suffixes}
        for s in suffixes:
            out.append(record(_CASE, impl + s, f"{op}_s_per_1M_accesses", t[s], "s"))
            if s:
                removed = _best(runs[s])[1]
                out.append(record(_CASE, impl + s, f"{op}_removed_read", removed["read"],
                                  "entries"))
                out.append(record(_CASE, impl + s, f"{op}_removed_incremental",
                                  removed["incremental"], "entries"))
        out.append(record(_CASE, impl + "+read", f"{op}_ratio_over_ttl_off", t["+read"] / t[""],
                          "ratio"))
        for s in suffixes[2:]:
            out.append(record(_CASE, impl + s, f"{op}_ratio_over_read_only", t[s] / t["+read"],
                              "ratio"))
    return out


def _measure_background(impl: str, n: int, reps: int) -> list:
    runs = [_background_run(impl, n) for _ in range(reps)]
    first = min(r[0] for r in runs)
    idle = min(r[1] for r in runs)
    _, _, left, removed = runs[0]
    imp = impl + "+background"
    return [record(_CASE, imp, "background_pass_s_per_1M_entries", _per_1m(first, n), "s"),
            record(_CASE, imp, "background_idle_pass_s_per_1M_entries", _per_1m(idle, left), "s"),
            record(_CASE, imp, "background_removed", removed, "entries")]


def _measure_full_snapshot(impl: str, n: int, reps: int, root: str) -> list:
    suffixes = ("+read", "+full_snapshot")
    backends = {s: _loaded(impl, s, n)[0] for s in suffixes}
    runs = {s: [] for s in suffixes}
    for i in range(reps):
        for s in suffixes:
            d = f"{root}/snap{s}{i}"
            runs[s].append(_snapshot_write(backends[s], d))
            shutil.rmtree(d)
    for b in backends.values():
        _dispose(b)
    t = {s: _per_1m(_best(runs[s])[0], n) for s in suffixes}
    out = []
    for s in suffixes:
        out.append(record(_CASE, impl + s, "full_snapshot_s_per_1M_entries", t[s], "s"))
        out.append(record(_CASE, impl + s, "full_snapshot_removed", runs[s][0][1], "entries"))
    out.append(record(_CASE, impl + "+full_snapshot", "full_snapshot_ratio_over_read_only",
                      t["+full_snapshot"] / t["+read"], "ratio"))
    return out


def _measure_compaction(impl: str, n: int, reps: int, root: str) -> list:
    suffixes = ("+read", "+compaction")
    templates = {s: _compaction_template(impl, s, n, root) for s in suffixes}
    runs = {s: [] for s in suffixes}
    for i in range(reps):
        for s in suffixes:
            runs[s].append(_compaction_run(templates[s], f"{root}/compact{s}{i}"))
    t = {s: _per_1m(_best(runs[s])[0], n) for s in suffixes}
    out = []
    for s in suffixes:
        out.append(record(_CASE, impl + s, "compaction_s_per_1M_entries", t[s], "s"))
        out.append(record(_CASE, impl + s, "compaction_removed", runs[s][0][1], "entries"))
    out.append(record(_CASE, impl + "+compaction", "compaction_ratio_over_read_only",
                      t["+compaction"] / t["+read"], "ratio"))
    return out


_SHORT = {"": "TTL off", "+read": "read", "+incremental5": "incr. 5",
          "+every_record5": "every rec. 5", "+background": "background",
          "+full_snapshot": "full snapshot", "+compaction": "compaction"}


def _short(impl: str) -> str:
    """'native+incremental5' -> 'native incr. 5' (bar labels)."""
    backend, plus, suffix = impl.partition("+")
    return f"{backend} {_SHORT[plus + suffix]}"


def _panel(r: dict):
    """Plot layout (``bench.harness.case`` ``panel``): ``(panel title, bar label)``, one panel per
    timing and per family of ratios; the counts (entries, sizes) stay in the JSON only."""
    m, label = r["metric"], _short(r["impl"])
    for op, what in (("per_record", "per record: set_current_key + value()"),
                     ("get_batch", "get_batch, 64k-row batches")):
        if m == f"{op}_s_per_1M_accesses":
            return f"{what}\ns per 1M accesses", label
        if m == f"{op}_ratio_over_ttl_off":
            return f"{what}\nratio", f"{label} / TTL off"
        if m == f"{op}_ratio_over_read_only":
            return f"{what}\nratio", f"{label} / read"
    if m == "background_pass_s_per_1M_entries":
        return "background, all key groups\ns per 1M entries visited", f"{label}\nhalf expired"
    if m == "background_idle_pass_s_per_1M_entries":
        return "background, all key groups\ns per 1M entries visited", f"{label}\nnone expired"
    if m == "full_snapshot_s_per_1M_entries":
        return "full snapshot + write\ns per 1M entries", label
    if m == "compaction_s_per_1M_entries":
        return "store compaction (2 runs)\ns per 1M entries", label
    if m.endswith("_ratio_over_read_only"):
        return "full snapshot, compaction\nratio", f"{label} / read"
    return None


@case(_CASE, "cost of each TTL cleanup strategy (on read, incremental 5 per access / per "
             "record, background, full snapshot, compaction) per 1M accesses or 1M entries, "
             "half the state expired, native at 1M keys, python at 200k", panel=_panel)
def ttl_cleanup(size: Size):
    """Records of the ``ttl_cleanup`` case (module docstring: workload, configurations,
    metrics). Raises AssertionError if a pass that must remove nothing removed something."""
    out = []
    reps = {"per_record": 1 if size.quick else 3, "get_batch": 3}
    with tempfile.TemporaryDirectory(prefix="statecore-bench-ttl-") as root:
        for impl, n in _sizes(size):
            out.append(record(_CASE, impl, "state_entries", n, "entries"))
            out.append(record(_CASE, impl, "expired_entries", (n + 1) // 2, "entries"))
            out.append(record(_CASE, impl, "accesses", n, "accesses"))
            out.extend(_measure_access(impl, n, reps))
            out.extend(_measure_background(impl, n, 3))
            out.extend(_measure_full_snapshot(impl, n, 3, root))
            out.extend(_measure_compaction(impl, n, 3, root))
    return out

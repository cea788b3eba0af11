"""Snapshot and checkpoint cases (incremental snapshots and checkpoints): snapshot pause,
materialization speed, owner-thread throughput while a checkpoint is written in the background,
incremental vs full checkpoint size, restore speed, and memory (RSS per entry, entries retired for
live snapshots).

Workload of every case: one ReducingState ``sum`` over int64 keys and int64 values (void
namespace), keys ``0 .. n-1`` loaded in 1M-row Arrow batches, max parallelism 128. The native
backend runs at ``n`` = 10M entries (``--quick``: 1M). The pure-Python backend runs at 1M entries at
most: at 10M it needs minutes per load and several GB (hundreds of bytes of RSS per entry), so
its figures are at 1M in both sizes; every case reports an ``entries`` record per implementation so
the size measured is explicit.

Goals are reported as ``goal_*`` records right after the figure they apply to (printed next to
the numbers, drawn as dashed lines by :func:`bench.plots.plot`, never asserted):
``snapshot()`` pause < 1 ms at 10M entries, owner-thread throughput during materialization >= 80%
of the throughput without, incremental checkpoint bytes <= 5% of the full checkpoint after 1% of
the keys changed.

The background write uses ``CheckpointStore.write_snapshot_async(snap, version, writer) -> Future``
(the snapshot released when the write ended, as the Spark operator does) when the store has it,
otherwise ``CheckpointStore.write_snapshot`` in a plain thread; the impl of those records says
which (``native+async`` / ``native+thread``).
"""

from __future__ import annotations

import gc
import mmap
import os
import resource
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from bench.common import has_native, probe_in_child, rss_bytes
from bench.harness import Size, case, record, timed
from statecore import CheckpointStore, ReducingStateDescriptor, create_backend
from statecore.checkpoint.format import MAX_KEY_GROUPS
from statecore.key_groups import assign_key_group, key_group_range_for_operator

_LOAD_BATCH = 1 << 20
_WORK_BATCH = 1 << 14  # rows per add_batch of the owner-thread workload


# --------------------------------------------------------------------------- helpers

def _sizes(size: Size) -> list[tuple[str, int]]:
    """``[(impl, entries), ...]``: native at 10M (quick 1M), python at most 1M (see module
    docstring), both scaled by ``size.scale``. Native is left out when the extension is missing."""
    n_native = size.n(10_000_000, 1_000_000)
    n_python = min(n_native, size.n(1_000_000, 1_000_000))
    out = []
    if has_native():
        out.append(("native", n_native))
    out.append(("python", n_python))
    return out


def _descriptor() -> ReducingStateDescriptor:
    return ReducingStateDescriptor("sum", "sum", "int64")


def _loaded(impl: str, n: int):
    """A backend of ``impl`` holding keys 0..n-1 (value = key) and its ReducingState."""
    b = create_backend(impl, key_type="int64")
    st = b.get_state(_descriptor())
    for s in range(0, n, _LOAD_BATCH):
        k = pa.array(np.arange(s, min(n, s + _LOAD_BATCH), dtype=np.int64))
        st.add_batch(k, k)
    return b, st


def _close(*backends) -> None:
    for b in backends:
        b.close()
    gc.collect()


def _change_one_percent(st, n: int, seed: int = 3) -> int:
    """Change 1% of the n keys (at least one): 90% of them get +1 added, 10% are removed (so the
    incremental run carries tombstones). Returns the number of keys changed."""
    m = max(1, n // 100)
    keys = np.random.default_rng(seed).permutation(n)[:m].astype(np.int64)
    cut = max(1, (m * 9) // 10)
    upd = pa.array(keys[:cut])
    st.add_batch(upd, pa.array(np.ones(len(upd), np.int64)))
    if cut < m:
        st.clear_batch(pa.array(keys[cut:]))
    return m


def _work_batches(n: int, count: int = 64, seed: int = 5):
    """``count`` batches of ``_WORK_BATCH`` random existing keys (updates: no growth), values 1."""
    rng = np.random.default_rng(seed)
    ones = pa.array(np.ones(_WORK_BATCH, np.int64))
    return [(pa.array(rng.integers(0, n, _WORK_BATCH, dtype=np.int64)), ones) for _ in range(count)]


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def _write_in_background(store: CheckpointStore, snap, version: int, writer: str = "p0"):
    """(future, path label): the store's own async write when it has one, else a thread around
    the synchronous write. The caller shuts the returned executor down (None for the async API)."""
    if hasattr(store, "write_snapshot_async"):
        return store.write_snapshot_async(snap, version, writer), "async", None
    ex = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench-ckpt")
    return ex.submit(store.write_snapshot, snap, version, writer), "thread", ex


def _retired(backend) -> int:
    """Entries currently kept alive only for live snapshots (native; 0 for other backends)."""
    stats = getattr(backend, "copy_on_write_stats", None)
    if stats is None:
        return 0
    return sum(s["retired_entries"] for s in stats().values())


def _page_copies(backend) -> int:
    """Pages copied so far because a snapshot shared them (native; 0 for other backends): the
    flat engine's copy-on-write memory, which has no retired entries."""
    stats = getattr(backend, "copy_on_write_stats", None)
    if stats is None:
        return 0
    return sum(s["page_copies"] for s in stats().values())


def rss_probe(impl: str, n: int) -> dict:
    """Load ``n`` entries into a fresh ``impl`` backend and return ``{"rss_delta": bytes,
    "state_bytes": bytes, "entries": int}``. Meant for a fresh interpreter (see
    :func:`_rss_per_entry`): in a process that already freed memory the allocator reuses it and
    the RSS delta understates."""
    gc.collect()
    r0 = rss_bytes()
    b, _ = _loaded(impl, n)
    return {"rss_delta": rss_bytes() - r0, "state_bytes": b.state_bytes(),
            "entries": b.num_entries()}


def _rss_per_entry(impl: str, n: int) -> float:
    """RSS growth per entry in bytes from loading ``n`` entries, measured by :func:`rss_probe`
    in a child interpreter (:func:`bench.common.probe_in_child`). Raises RuntimeError if the
    child fails."""
    got = probe_in_child("bench.snapshots", "rss_probe", impl, n)
    return got["rss_delta"] / max(1, got["entries"])


# --------------------------------------------------------------------------- cases

@case("snapshot_pause", "synchronous backend.snapshot() pause, median of repeats, full and "
                        "incremental (after 1% of the keys changed); int64 -> int64, native 10M / "
                        "python 1M entries")
def snapshot_pause(size: Size):
    """Records per impl: ``entries``; ``pause_ms_full_median`` / ``pause_ms_incremental_median``
    (ms, median over 7 snapshots natively, 3 for python whose snapshot copies everything), each
    snapshot released before the next; ``goal_max_pause_ms`` (1 ms, for 10M entries)."""
    out = []
    for impl, n in _sizes(size):
        reps = 7 if impl == "native" else 3
        b, st = _loaded(impl, n)
        out.append(record("snapshot_pause", impl, "entries", n, "entries"))

        def pauses(incremental: bool) -> list[float]:
            got = []
            for _ in range(reps):
                t = time.perf_counter()
                snap = b.snapshot(incremental=incremental)
                got.append(time.perf_counter() - t)
                snap.release()
            return got

        out.append(record("snapshot_pause", impl, "pause_ms_full_median",
                          statistics.median(pauses(False)) * 1e3, "ms"))
        # A completed full snapshot is the base; then 1% changes make the incremental content.
        base = b.snapshot()
        b.notify_checkpoint_complete(base.snapshot_id)
        base.release()
        _change_one_percent(st, n)
        out.append(record("snapshot_pause", impl, "pause_ms_incremental_median",
                          statistics.median(pauses(True)) * 1e3, "ms"))
        out.append(record("snapshot_pause", impl, "goal_max_pause_ms", 1.0, "ms"))
        _close(b)
    return out


@case("materialize", "write a full snapshot to a local CheckpointStore: state MB/s; RSS per entry "
                     "after loading (fresh interpreter); native 10M / python 1M entries")
def materialize(size: Size):
    """Records per impl: ``entries``; ``state_MB_per_s`` (backend.state_bytes() / seconds of
    ``write_snapshot``, 1e6 bytes per MB); ``write_cpu_s`` (the process's CPU seconds, user +
    system, over that write: on a shared machine the measure that does not count waiting for a
    core) and ``state_MB_per_cpu_s``; ``file_bytes``; ``state_bytes``; ``rss_bytes_per_entry``
    (RSS growth from loading, measured in a child interpreter)."""
    out = []
    for impl, n in _sizes(size):
        b, _ = _loaded(impl, n)
        out.append(record("materialize", impl, "entries", n, "entries"))
        snap = b.snapshot()
        with tempfile.TemporaryDirectory(prefix="statecore-bench-") as d:
            store = CheckpointStore(d)
            cpu = time.process_time()
            dt = timed(lambda: store.write_snapshot(snap, 1))
            cpu = time.process_time() - cpu
            file_bytes = _dir_bytes(d)
        snap.release()
        state_bytes = b.state_bytes()
        out.append(record("materialize", impl, "state_MB_per_s", state_bytes / dt / 1e6, "MB/s"))
        out.append(record("materialize", impl, "write_cpu_s", cpu, "s"))
        out.append(record("materialize", impl, "state_MB_per_cpu_s", state_bytes / cpu / 1e6,
                          "MB/s"))
        out.append(record("materialize", impl, "file_bytes", file_bytes, "bytes"))
        out.append(record("materialize", impl, "state_bytes", state_bytes, "bytes"))
        _close(b)
        out.append(record("materialize", impl, "rss_bytes_per_entry", _rss_per_entry(impl, n),
                          "bytes"))
    return out


@case("throughput_during_snapshot", "owner-thread add_batch rows/s (16k random updates a batch) "
                                    "while a full snapshot is written in the background vs "
                                    "without; native 10M / python 1M entries")
def throughput_during_snapshot(size: Size):
    """Per impl (impl label ``<impl>+async`` or ``<impl>+thread``: the background write path):
    ``entries``; ``rows_per_s_during`` (batches run while the write is in flight, at least one;
    the snapshot() pause itself is excluded and reported as ``pause_ms``); ``rows_per_s_without``
    (the same batches, no snapshot alive); ``ratio_during_over_without``;
    ``goal_min_ratio`` (0.8); ``write_s``; ``retired_entries_peak_during`` (most entries kept
    only for the snapshot, sampled after each of the first 8 batches in flight and every 8th
    after (sampling time excluded from the rate): the chained engine's copy-on-write memory),
    ``page_copies_during`` (pages copied while the snapshot lived: the flat engine's) and
    ``retired_entries_after`` (after the snapshot's release and one more batch, which frees
    them); ``rss_growth_during_bytes`` (RSS after the in-flight
    batches minus before the snapshot: copy-on-write cost, an underestimate if the allocator
    reused freed memory)."""
    out = []
    for impl, n in _sizes(size):
        b, st = _loaded(impl, n)
        work = _work_batches(n)
        # Warm-up, so both measured runs see the same caches and allocator state.
        for k, v in work[:4]:
            st.add_batch(k, v)
        with tempfile.TemporaryDirectory(prefix="statecore-bench-") as d:
            store = CheckpointStore(d)
            rss0 = rss_bytes()
            pages0 = _page_copies(b)
            t = time.perf_counter()
            snap = b.snapshot()
            pause = time.perf_counter() - t
            fut, path, ex = _write_in_background(store, snap, 1)
            t0 = time.perf_counter()
            done = 0
            retired_peak = 0
            sampling = 0.0
            while True:
                k, v = work[done % len(work)]
                st.add_batch(k, v)
                done += 1
                if done <= 8 or done % 8 == 0:
                    ts = time.perf_counter()
                    retired_peak = max(retired_peak, _retired(b))
                    sampling += time.perf_counter() - ts
                if fut.done():
                    break
            during = time.perf_counter() - t0 - sampling
            rss_growth = rss_bytes() - rss0
            pages_during = _page_copies(b) - pages0
            fut.result()
            write_s = time.perf_counter() - t0
            if ex is not None:
                ex.shutdown()
            snap.release()
        st.add_batch(*work[0])  # the next operation frees what the released snapshot retired
        retired_after = _retired(b)
        same = [work[i % len(work)] for i in range(done)]
        without = timed(lambda: [st.add_batch(k, v) for k, v in same])
        rows = done * _WORK_BATCH
        label = f"{impl}+{path}"
        c = "throughput_during_snapshot"
        out += [record(c, label, "entries", n, "entries"),
                record(c, label, "pause_ms", pause * 1e3, "ms"),
                record(c, label, "rows_per_s_during", rows / during, "rows/s"),
                record(c, label, "rows_per_s_without", rows / without, "rows/s"),
                record(c, label, "ratio_during_over_without", without / during, "ratio"),
                record(c, label, "goal_min_ratio", 0.8, "ratio"),
                record(c, label, "write_s", write_s, "s"),
                record(c, label, "retired_entries_peak_during", retired_peak, "entries"),
                record(c, label, "retired_entries_after", retired_after, "entries"),
                record(c, label, "page_copies_during", pages_during, "pages"),
                record(c, label, "rss_growth_during_bytes", max(0, rss_growth), "bytes")]
        _close(b)
    return out


def _checkpoints(impl: str, n: int, d: str):
    """Full checkpoint v1 of n entries, then 1% of the keys changed and an incremental checkpoint
    v2 (runs: v1's full + v2's incremental) plus, of the same state, a full checkpoint in the
    separate store ``d/full``. Returns ``(backend, stats)`` with seconds and bytes of each write."""
    b, st = _loaded(impl, n)
    store = CheckpointStore(os.path.join(d, "chain"))
    snap = b.snapshot()
    store.commit(1, [store.write_snapshot(snap, 1)])
    b.notify_checkpoint_complete(snap.snapshot_id, 1)
    snap.release()
    changed = _change_one_percent(st, n)
    inc = b.snapshot(incremental=True)
    full = b.snapshot()
    t = time.perf_counter()
    inc_desc = store.write_snapshot(inc, 2)
    inc_s = time.perf_counter() - t
    store.commit(2, [inc_desc])
    full_store = CheckpointStore(os.path.join(d, "full"))
    t = time.perf_counter()
    full_desc = full_store.write_snapshot(full, 2)
    full_s = time.perf_counter() - t
    full_store.commit(2, [full_desc])
    b.notify_checkpoint_complete(inc.snapshot_id, 2)
    inc.release()
    full.release()
    return b, {"changed": changed, "inc_s": inc_s, "inc_bytes": inc_desc["size"],
               "full_s": full_s, "full_bytes": full_desc["size"], "store": store}


@case("incremental_checkpoint", "after a full checkpoint, 1% of the keys changed (10% of them "
                                "removed): incremental vs full checkpoint bytes and seconds; "
                                "native 10M / python 1M")
def incremental_checkpoint(size: Size):
    """Records per impl: ``entries``, ``keys_changed``, ``incremental_bytes`` / ``full_bytes``
    (data file sizes), ``incremental_s`` / ``full_s`` (seconds of write_snapshot),
    ``ratio_incremental_over_full_bytes``, ``goal_max_ratio`` (0.05),
    ``ratio_incremental_over_full_s``."""
    out = []
    c = "incremental_checkpoint"
    for impl, n in _sizes(size):
        with tempfile.TemporaryDirectory(prefix="statecore-bench-") as d:
            b, s = _checkpoints(impl, n, d)
        out += [record(c, impl, "entries", n, "entries"),
                record(c, impl, "keys_changed", s["changed"], "entries"),
                record(c, impl, "incremental_bytes", s["inc_bytes"], "bytes"),
                record(c, impl, "full_bytes", s["full_bytes"], "bytes"),
                record(c, impl, "ratio_incremental_over_full_bytes",
                       s["inc_bytes"] / s["full_bytes"], "ratio"),
                record(c, impl, "goal_max_ratio", 0.05, "ratio"),
                record(c, impl, "incremental_s", s["inc_s"], "s"),
                record(c, impl, "full_s", s["full_s"], "s"),
                record(c, impl, "ratio_incremental_over_full_s", s["inc_s"] / s["full_s"], "ratio")]
        _close(b)
    return out


def _read_floor(store: CheckpointStore, version: int, start: int = 0,
                end: int = MAX_KEY_GROUPS - 1) -> tuple[float, float]:
    """``(seconds, CPU seconds of the calling thread)`` of opening ``version`` and reading every
    block of its runs in key groups ``[start, end]``, verifying its XXH64 and decompressing it in
    native code on one thread (``DataFileReader.verify_blocks``: the checks and the LZ4 call of
    the native decoder, nothing parsed, no state built): the floor under a restore of those key
    groups, which reads the same bytes the same way."""
    t, c = time.perf_counter(), time.thread_time()
    with store.open(version) as reader:
        for f in reader.manifest["files"]:
            a, b = f["key_group_range"]
            lo, hi = max(a, start), min(b, end)
            if lo <= hi:
                reader.data_file(f).verify_blocks(lo, hi)
    return time.perf_counter() - t, max(time.thread_time() - c, 1e-9)


def _kernel_s() -> float:
    """CPU seconds the calling thread spent in the kernel so far (Linux; the process's
    elsewhere): in a restore mostly the first touches of the state's fresh memory."""
    who = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)
    return resource.getrusage(who).ru_stime


def _anon_huge_bytes() -> int | None:
    """Bytes of this process's anonymous memory backed by transparent huge pages
    (``AnonHugePages`` of ``/proc/self/smaps_rollup``, Linux 4.14); None where unreadable."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _fault_in_cpu(nbytes: int) -> float:
    """CPU seconds of the calling thread to fault in ``nbytes`` of fresh anonymous memory
    advised for transparent huge pages, one write a 4 KiB page and nothing else (the kernel
    zeroes each page as it faults it in): what a restore into a fresh process pays for that
    much new memory before it stores anything."""
    m = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        if hasattr(mmap, "MADV_HUGEPAGE"):
            m.madvise(mmap.MADV_HUGEPAGE)
        view = np.frombuffer(m, np.uint8)
        c = time.thread_time()
        view[::4096] = 1
        dt = time.thread_time() - c
        del view
        return dt
    finally:
        m.close()


def _first_record(backend, key: int = 0) -> None:
    """The first record processed after a restore: 1 added to ``key`` (one the backend's
    key-group range holds) of the restored state."""
    backend.get_state(_descriptor()).add_batch(pa.array([key], pa.int64()),
                                               pa.array([1], pa.int64()))


def _key_in(kgr, max_parallelism: int) -> int:
    """The smallest int64 key >= 0 of a key group in ``kgr``."""
    key = 0
    while assign_key_group(key, "int64", max_parallelism) not in kgr:
        key += 1
    return key


def fresh_restore_probe(root: str, version: int) -> dict:
    """:func:`_read_floor` then ``CheckpointStore(root).restore`` of ``version`` into a new native
    backend, meant for a fresh interpreter (:func:`bench.common.probe_in_child`), where no freed
    memory is left to reuse and every page of the state is faulted in fresh. Returns
    ``{"floor_s", "floor_cpu", "s", "cpu", "process_cpu", "kernel_s", "process_kernel_s",
    "huge_page_bytes", "fault_in_cpu", "state_bytes", "entries"}`` (seconds, CPU seconds of
    the restoring thread and of the whole process -- the native restore faults its pages in on
    a worker thread too -- kernel seconds of the thread and of the process, as :func:`restore`
    records them, the bytes of huge pages the restore faulted in, :func:`_anon_huge_bytes`,
    None where unknown, and, after the restore, the CPU seconds of faulting in as many bytes
    of other fresh memory alone, :func:`_fault_in_cpu`)."""
    store = CheckpointStore(root)
    floor_s, floor_cpu = _read_floor(store, version)
    fresh = create_backend("native", key_type="int64")
    huge0 = _anon_huge_bytes()
    psys0 = resource.getrusage(resource.RUSAGE_SELF).ru_stime
    sys0, cpu0, proc0 = _kernel_s(), time.thread_time(), time.process_time()
    t = time.perf_counter()
    store.restore(fresh, version)
    dt = time.perf_counter() - t
    huge1 = _anon_huge_bytes()
    out = {"floor_s": floor_s, "floor_cpu": floor_cpu, "s": dt,
           "cpu": max(time.thread_time() - cpu0, 1e-9),
           "process_cpu": max(time.process_time() - proc0, 1e-9), "kernel_s": _kernel_s() - sys0,
           "process_kernel_s": resource.getrusage(resource.RUSAGE_SELF).ru_stime - psys0,
           "huge_page_bytes": None if huge0 is None or huge1 is None else max(huge1 - huge0, 0),
           "state_bytes": fresh.state_bytes(), "entries": fresh.num_entries()}
    out["fault_in_cpu"] = _fault_in_cpu(out["huge_page_bytes"] or out["state_bytes"])
    fresh.close()
    return out


@case("restore", "restore a checkpoint into a fresh backend: state MB/s of a full run and of a "
                 "full + incremental (1% changed) chain, against the native floor of reading, "
                 "verifying and decompressing the same runs; native 10M / python 1M entries")
def restore(size: Size):
    """Records per impl: ``entries``; ``full_state_MB_per_s`` / ``chain_state_MB_per_s`` (restored
    backend.state_bytes() / seconds of ``CheckpointStore.restore``; 1e6 bytes per MB) and the
    matching ``*_s`` seconds; ``full_floor_state_MB_per_s`` / ``chain_floor_state_MB_per_s``
    (the same bytes / seconds of reading, verifying and decompressing the version's runs in
    native code without building state, :func:`_read_floor`, measured just before the restore)
    and ``ratio_full_over_floor`` / ``ratio_chain_over_floor`` (floor seconds / restore
    seconds); the same in CPU seconds of the restoring thread (the floor runs on one thread, the
    restore on it plus a native worker that opens the blocks ahead of the inserts, whose CPU
    these leave out; on a shared machine wall seconds also count the waits for a core):
    ``full_cpu_s`` / ``chain_cpu_s``, ``full_state_MB_per_cpu_s`` / ``chain_state_MB_per_cpu_s``,
    ``ratio_full_over_floor_cpu`` / ``ratio_chain_over_floor_cpu``; and in CPU seconds of every
    thread of the process (MB/s of state per core): ``full_process_cpu_s`` /
    ``chain_process_cpu_s``, ``*_state_MB_per_process_cpu_s``, ``ratio_*_over_floor_process_cpu``;
    ``goal_min_ratio_over_floor`` (0.5), ``goal_min_state_MB_per_s`` (400, the restore runs on
    one core); ``full_first_record_s`` / ``chain_first_record_s`` (from the
    restore's start to the first record processed on the restored state,
    :func:`_first_record`); ``full_kernel_s`` / ``chain_kernel_s`` (the restoring thread's CPU
    seconds in the kernel during the restore, :func:`_kernel_s`: faulting in the state's fresh
    memory, which the floor does not allocate). The restores run in the process that built and
    closed the checkpointed state, whose freed pages the page pool keeps for reuse; native also
    ``fresh_process_full_*`` (``_state_MB_per_s``, ``_s``, ``_cpu_s``, ``_state_MB_per_cpu_s``,
    ``_kernel_s``) and ``ratio_fresh_process_full_over_floor`` / ``..._cpu``: the full run
    restored in a new interpreter (:func:`fresh_restore_probe`), every page of the state faulted
    in fresh; there also ``fresh_process_full_process_cpu_s`` and
    ``fresh_process_full_state_MB_per_process_cpu_s``, the CPU seconds of every thread of the
    process (a native restore faults its pages in on a worker thread too),
    ``fresh_process_full_process_kernel_s`` (of them in the kernel), where the OS tells
    ``fresh_process_full_huge_page_MB`` (memory the restore faulted in as transparent huge
    pages, :func:`_anon_huge_bytes`), and ``fresh_process_fault_in_cpu_s``: CPU seconds of
    faulting in as many bytes of fresh memory in that process with nothing else
    (:func:`_fault_in_cpu`; the state's bytes where the huge pages are unknown), what any
    restore into a fresh process pays besides the floor. Raises RuntimeError if
    a restored backend's entry count is wrong (the figure would be meaningless)."""
    out = []
    c = "restore"
    for impl, n in _sizes(size):
        with tempfile.TemporaryDirectory(prefix="statecore-bench-") as d:
            b, s = _checkpoints(impl, n, d)
            expected = {1: n, 2: b.num_entries()}
            _close(b)
            out.append(record(c, impl, "entries", n, "entries"))
            out.append(record(c, impl, "goal_min_ratio_over_floor", 0.5, "ratio"))
            out.append(record(c, impl, "goal_min_state_MB_per_s", 400.0, "MB/s"))
            for version, what in ((1, "full"), (2, "chain")):
                floor_s, floor_cpu = _read_floor(s["store"], version)
                fresh = create_backend(impl, key_type="int64")
                sys0, cpu0, proc0 = _kernel_s(), time.thread_time(), time.process_time()
                t = time.perf_counter()
                s["store"].restore(fresh, version)
                dt = time.perf_counter() - t
                cpu = max(time.thread_time() - cpu0, 1e-9)
                proc = max(time.process_time() - proc0, 1e-9)
                kernel = _kernel_s() - sys0
                _first_record(fresh)
                first = time.perf_counter() - t
                if fresh.num_entries() != expected[version]:
                    raise RuntimeError(f"{impl} restore of v{version}: {fresh.num_entries()} "
                                       f"entries, expected {expected[version]}")
                state_mb = fresh.state_bytes() / 1e6
                out.append(record(c, impl, f"{what}_state_MB_per_s", state_mb / dt, "MB/s"))
                out.append(record(c, impl, f"{what}_s", dt, "s"))
                out.append(record(c, impl, f"{what}_floor_state_MB_per_s", state_mb / floor_s,
                                  "MB/s"))
                out.append(record(c, impl, f"ratio_{what}_over_floor", floor_s / dt, "ratio"))
                out.append(record(c, impl, f"{what}_cpu_s", cpu, "s"))
                out.append(record(c, impl, f"{what}_state_MB_per_cpu_s", state_mb / cpu, "MB/s"))
                out.append(record(c, impl, f"ratio_{what}_over_floor_cpu", floor_cpu / cpu,
                                  "ratio"))
                out.append(record(c, impl, f"{what}_process_cpu_s", proc, "s"))
                out.append(record(c, impl, f"{what}_state_MB_per_process_cpu_s", state_mb / proc,
                                  "MB/s"))
                out.append(record(c, impl, f"ratio_{what}_over_floor_process_cpu",
                                  floor_cpu / proc, "ratio"))
                out.append(record(c, impl, f"{what}_first_record_s", first, "s"))
                out.append(record(c, impl, f"{what}_kernel_s", kernel, "s"))
                _close(fresh)
            if impl == "native":
                # The full run again, in a new interpreter: no memory freed before to reuse.
                got = probe_in_child("bench.snapshots", "fresh_restore_probe",
                                     s["store"].uri, 1)
                if got["entries"] != expected[1]:
                    raise RuntimeError(f"fresh-process restore: {got['entries']} entries, "
                                       f"expected {expected[1]}")
                mb = got["state_bytes"] / 1e6
                out += [record(c, impl, "fresh_process_full_state_MB_per_s", mb / got["s"],
                               "MB/s"),
                        record(c, impl, "fresh_process_full_s", got["s"], "s"),
                        record(c, impl, "ratio_fresh_process_full_over_floor",
                               got["floor_s"] / got["s"], "ratio"),
                        record(c, impl, "fresh_process_full_cpu_s", got["cpu"], "s"),
                        record(c, impl, "fresh_process_full_state_MB_per_cpu_s", mb / got["cpu"],
                               "MB/s"),
                        record(c, impl, "ratio_fresh_process_full_over_floor_cpu",
                               got["floor_cpu"] / got["cpu"], "ratio"),
                        record(c, impl, "fresh_process_full_kernel_s", got["kernel_s"], "s"),
                        record(c, impl, "fresh_process_full_process_cpu_s", got["process_cpu"],
                               "s"),
                        record(c, impl, "fresh_process_full_state_MB_per_process_cpu_s",
                               mb / got["process_cpu"], "MB/s"),
                        record(c, impl, "fresh_process_full_process_kernel_s",
                               got["process_kernel_s"], "s"),
                        record(c, impl, "fresh_process_fault_in_cpu_s", got["fault_in_cpu"],
                               "s")]
                if got["huge_page_bytes"] is not None:
                    out.append(record(c, impl, "fresh_process_full_huge_page_MB",
                                      got["huge_page_bytes"] / 1e6, "MB"))
    return out


_RESCALE_WRITERS = 4
_RESCALE_READERS = (3, 8)


def _rescale_store(impl: str, n: int, d: str) -> tuple[CheckpointStore, int]:
    """A store holding version 1 of keys ``0 .. n-1`` (value = key) written by
    ``_RESCALE_WRITERS`` tasks, one run each over its key-group range (Flink
    KeyGroupRangeAssignment). The tasks get their keys by restoring a full checkpoint of one
    backend (a 1 -> 4 rescale, not measured). Returns the store and the runs' bytes."""
    b, _ = _loaded(impl, n)
    seed = CheckpointStore(os.path.join(d, "seed"))
    snap = b.snapshot()
    seed.commit(1, [seed.write_snapshot(snap, 1)])
    snap.release()
    mp = b.max_parallelism
    _close(b)
    store = CheckpointStore(os.path.join(d, "rescale"))
    descs = []
    for i in range(_RESCALE_WRITERS):
        task = create_backend(impl, key_type="int64", max_parallelism=mp,
                              key_group_range=key_group_range_for_operator(mp, _RESCALE_WRITERS, i))
        seed.restore(task, 1)
        snap = task.snapshot()
        descs.append(store.write_snapshot(snap, 1, f"p{i}"))
        snap.release()
        _close(task)
    store.commit(1, descs)
    shutil.rmtree(os.path.join(d, "seed"))
    return store, sum(x["size"] for x in descs)


@case("rescale", "restore a checkpoint written by 4 tasks (4 runs, key-group ranges) into 3 and "
                 "into 8 tasks, each reading only its key groups: state MB/s per task, bytes "
                 "read per task against its share, ratio over the native floor; native 10M / "
                 "python 1M entries")
def rescale(size: Size):
    """Per impl and reader parallelism ``p`` in (3, 8) (impl label ``<impl> 4->p``): ``entries``;
    ``state_MB_per_s_per_task`` (mean over the tasks of restored state_bytes() / seconds of its
    ``CheckpointStore.restore``, tasks one after another on one thread) and
    ``state_MB_per_s_per_task_min``; ``max_bytes_read_over_share`` (most bytes a task read from
    data files, footers included, over its share: the runs' bytes times its key groups /
    max parallelism); ``ratio_over_floor`` (summed floor seconds over summed restore seconds,
    the floor of each task :func:`_read_floor` over its key groups, measured before its
    restore); ``state_MB_per_cpu_s_per_task`` / ``ratio_over_floor_cpu``: the same in CPU
    seconds of the restoring thread (see :func:`restore`); ``restore_cpu_s`` and
    ``restore_kernel_s``: those CPU seconds summed over the tasks, and the part of them in the
    kernel (:func:`_kernel_s`: faulting in memory the page pool did not have mapped);
    ``restore_process_cpu_s``, ``ratio_over_floor_process_cpu`` and
    ``state_MB_per_process_cpu_s``: the CPU seconds of every thread of the process summed over
    the tasks, the floor's over them and the state's MB over them (MB/s of state per core);
    ``goal_min_ratio_over_floor`` (0.5), ``goal_min_state_MB_per_s`` (400);
    ``first_record_s_max`` (the slowest task's restore start to its first record processed,
    :func:`_first_record`). Raises RuntimeError when the tasks do not restore exactly the n
    entries."""
    out = []
    c = "rescale"
    for impl, n in _sizes(size):
        with tempfile.TemporaryDirectory(prefix="statecore-bench-") as d:
            store, run_bytes = _rescale_store(impl, n, d)
            mp = store.open(1).max_parallelism
            for p in _RESCALE_READERS:
                rates, over_share, firsts = [], [], []
                floor_total = restore_total = floor_cpu_total = restore_cpu_total = 0.0
                process_cpu_total = state_mb_total = 0.0
                kernel_total = 0.0
                cpu_rates = []
                entries = 0
                for i in range(p):
                    kgr = key_group_range_for_operator(mp, p, i)
                    floor_s, floor_cpu = _read_floor(store, 1, kgr.start, kgr.end)
                    task = create_backend(impl, key_type="int64", max_parallelism=mp,
                                          key_group_range=kgr)
                    stats: dict = {}
                    sys0, cpu0, proc0 = _kernel_s(), time.thread_time(), time.process_time()
                    t = time.perf_counter()
                    store.restore(task, 1, stats=stats)
                    dt = time.perf_counter() - t
                    cpu = max(time.thread_time() - cpu0, 1e-9)
                    process_cpu_total += max(time.process_time() - proc0, 1e-9)
                    kernel_total += _kernel_s() - sys0
                    entries += task.num_entries()
                    state_mb = task.state_bytes() / 1e6
                    state_mb_total += state_mb
                    _first_record(task, _key_in(kgr, mp))
                    firsts.append(time.perf_counter() - t)
                    rates.append(state_mb / dt)
                    cpu_rates.append(state_mb / cpu)
                    floor_cpu_total += floor_cpu
                    restore_cpu_total += cpu
                    share = run_bytes * len(kgr) / mp
                    over_share.append(stats["bytes_read"] / share)
                    floor_total += floor_s
                    restore_total += dt
                    _close(task)
                if entries != n:
                    raise RuntimeError(f"{impl} 4->{p}: tasks restored {entries} entries, "
                                       f"expected {n}")
                label = f"{impl} {_RESCALE_WRITERS}->{p}"
                out += [record(c, label, "entries", n, "entries"),
                        record(c, label, "state_MB_per_s_per_task", statistics.mean(rates),
                               "MB/s"),
                        record(c, label, "state_MB_per_s_per_task_min", min(rates), "MB/s"),
                        record(c, label, "goal_min_state_MB_per_s", 400.0, "MB/s"),
                        record(c, label, "max_bytes_read_over_share", max(over_share), "ratio"),
                        record(c, label, "ratio_over_floor", floor_total / restore_total,
                               "ratio"),
                        record(c, label, "state_MB_per_cpu_s_per_task",
                               statistics.mean(cpu_rates), "MB/s"),
                        record(c, label, "ratio_over_floor_cpu",
                               floor_cpu_total / restore_cpu_total, "ratio"),
                        record(c, label, "restore_cpu_s", restore_cpu_total, "s"),
                        record(c, label, "restore_process_cpu_s", process_cpu_total, "s"),
                        record(c, label, "ratio_over_floor_process_cpu",
                               floor_cpu_total / process_cpu_total, "ratio"),
                        record(c, label, "state_MB_per_process_cpu_s",
                               state_mb_total / process_cpu_total, "MB/s"),
                        record(c, label, "restore_kernel_s", kernel_total, "s"),
                        record(c, label, "goal_min_ratio_over_floor", 0.5, "ratio"),
                        record(c, label, "first_record_s_max", max(firsts), "s")]
    return out

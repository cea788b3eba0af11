"""The Spark running count over a state far larger than the memory budget: statecore's tiered
mode against its in-memory mode and against ``transformWithStateInPandas`` with RocksDB
(``spark_tiered_running_count``).

Starting state: ``keys`` distinct int64 keys ``0..keys-1`` (20M; ``--quick``: 200k), each with a
count drawn uniformly from 1..100, written once as version 0 of the operator's checkpoint by
:meth:`statecore.spark.StatefulOperator.bootstrap` from a Parquet table read as a DataFrame (the
same full runs, routing and metadata a micro-batch's restore reads; two Spark tasks encode
their key-group ranges in parallel). It is bootstrapped rather than streamed in so that the
measured streams start from one full run per task, as a job started from a batch query's
state does; the bootstrap's wall time is recorded (``bootstrap_s``). Each statecore run starts
from its own copy of that checkpoint directory.

Streams (Parquet files, one per micro-batch, read with ``maxFilesPerTrigger=1`` and
``trigger(availableNow=True)``, output into Spark's ``noop`` sink): ``events`` int64 keys (4M in
8 micro-batches; ``--quick``: 200k in 2) drawn from ``0..keys-1`` uniformly, and Zipf(1.0) by
rank (:func:`bench.workloads.zipf_keys`). Each variant emits ``(k, count)`` per input row, the
bootstrapped count included, and commits a checkpoint every micro-batch:

* ``in_memory``: :class:`statecore.spark.StatefulOperator` with :class:`RunningCount`, native
  backend, the whole state in memory; its first micro-batch restores the state (each task its
  key groups) and, with the operator's defaults (``stale_copies=1``, ``standby=True``), each
  Python worker then also keeps a copy of the other partition.
* ``tiered``: the same operator with ``memory_budget`` = 1/16 of a task's share of the state's
  key and value bytes (18 bytes an entry, docs/tiered.md "Memory"): its first micro-batch
  attaches version 0 instead of loading it and reads the keys it lacks from the runs.
* ``transformWithStateInPandas``: Spark's own stateful Python API (RocksDB state store), its
  ``initialState`` the same kind of table read as a DataFrame. It loads an initial state at a
  few thousand keys per second and counts at hundreds of events per second here, so it runs on
  ``tws_keys`` keys (100k) and ``tws_events`` events (20k in 4 micro-batches) with the same
  distributions: its rates are comparable, its totals are not. Left out at ``--quick`` and
  without protobuf.

Per variant and stream: events/s of the whole query (wall clock, micro-batch planning
included), events/s after the first micro-batch (the micro-batches' own durations from Spark's
query progress), the first micro-batch's seconds (restore, attach or initial state, and its
events) and, for statecore, its tasks' load seconds. Resident memory (not at ``--quick``, and
only where ``/proc`` has it): the peak of the Python workers (statecore's state lives there)
and of the JVM (Spark, and RocksDB for ``transformWithStateInPandas``), from a reset of the
kernel's high-water mark (``/proc/PID/clear_refs`` 5) after every worker's cached backends were
closed, and what each process added over its resident memory at the reset. Ratios: tiered /
in_memory and tiered / transformWithStateInPandas, per stream, of both rates.
"""

from __future__ import annotations

import ctypes
import gc
import os
import shutil
import tempfile
import time
from typing import Dict, Iterator, List, Optional

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.common import has_native
from bench.harness import Size, case, record
from bench.spark_e2e import RunningCount, landing_stream, restore_state_store, rocksdb_session
from bench.workloads import zipf_keys
from statecore.descriptors import ReducingStateDescriptor

__all__ = ["write_initial_counts", "write_keys", "reset_peaks", "peak_rss", "rss_figures"]

CASE = "spark_tiered_running_count"
_MAX_PARALLELISM = 128
_PARALLELISM = 2
_OPERATOR = "counts"
#: Key and value bytes of an int64 -> int64 count entry (docs/tiered.md "Memory").
_ENTRY_BYTES = 18
#: The tiered budget is this fraction of a task's share of the state.
_BUDGET_DIVISOR = 16
_OUT_DDL = "k long, count long"
_DISTS = ("uniform", "zipf")


def write_initial_counts(path: str, keys: int, files: int = 4, seed: int = 7) -> None:
    """Write the starting state as ``files`` Parquet files under ``path``: columns ``k`` (int64,
    every key of ``0..keys-1`` once) and ``value`` (int64 counts, uniform in 1..100). Raises
    ValueError for non-positive sizes."""
    if keys < 1 or files < 1:
        raise ValueError("keys and files must be positive")
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(seed)
    bounds = np.linspace(0, keys, files + 1).astype(np.int64)
    for i in range(files):
        k = np.arange(bounds[i], bounds[i + 1], dtype=np.int64)
        pq.write_table(pa.table({"k": k, "value": rng.integers(1, 101, len(k), dtype=np.int64)}),
                       os.path.join(path, f"state-{i:04d}.parquet"))


def write_keys(path: str, dist: str, keys: int, events: int, files: int, seed: int = 1) -> None:
    """Write ``events`` int64 keys of ``0..keys-1`` (column ``k``), drawn ``dist`` ("uniform" or
    "zipf": Zipf(1.0) by rank), as ``files`` Parquet files under ``path`` with increasing
    modification times (the file source's order, one file a micro-batch). Raises ValueError for
    non-positive sizes and KeyError for an unknown ``dist``."""
    if keys < 1 or events < 1 or files < 1:
        raise ValueError("keys, events and files must be positive")
    rng = np.random.default_rng(seed)
    draw = {"uniform": lambda m: rng.integers(0, keys, m, dtype=np.int64),
            "zipf": lambda m: zipf_keys(rng, keys, m)}[dist]
    drawn = draw(events)
    os.makedirs(path, exist_ok=True)
    bounds = np.linspace(0, events, files + 1).astype(np.int64)
    base = 1_700_000_000
    for i in range(files):
        f = os.path.join(path, f"events-{i:04d}.parquet")
        pq.write_table(pa.table({"k": drawn[bounds[i]:bounds[i + 1]]}), f)
        os.utime(f, (base + i, base + i))


# ------------------------------------------------------------------ resident memory (Linux)
def _status_kb(pid: int, field: str) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _python_workers(jvm_pid: int) -> List[int]:
    """The live PySpark worker processes: the forks of the ``pyspark.daemon`` that the JVM
    ``jvm_pid`` started (another JVM's daemon and workers are left out)."""
    daemons, procs = set(), {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if b"pyspark.daemon" in cmd:
            procs[int(d)] = ppid
            if ppid == jvm_pid:
                daemons.add(int(d))
    return sorted(p for p, pp in procs.items() if pp in daemons)


def _clear_worker(_rows: Iterator) -> Iterator[int]:
    """Spark task: close the worker's cached backends and give their memory back, so the next
    variant's peak is its own; yields the worker's pid. Sleeps so that concurrent tasks land
    on distinct workers."""
    from statecore.spark.worker_cache import clear_state_cache

    clear_state_cache()
    gc.collect()
    pa.default_memory_pool().release_unused()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    time.sleep(0.3)
    yield os.getpid()


def reset_peaks(spark) -> Optional[Dict[str, Dict[int, int]]]:
    """Close every Python worker's cached backends and reset the high-water mark of resident
    memory of the workers and the JVM to their current resident memory (Linux
    ``/proc/PID/clear_refs``). Returns the resident bytes right after, ``{"workers": {pid:
    bytes}, "jvm": {pid: bytes}}``, or None when that is not possible here."""
    jvm = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    cleared: set = set()
    for _ in range(4):
        live = set(_python_workers(jvm))
        if live <= cleared:
            break
        n = max(len(live), _PARALLELISM)
        cleared |= set(spark.sparkContext.parallelize(range(n), n)
                       .mapPartitions(_clear_worker).collect())
    try:
        for pid in [jvm] + _python_workers(jvm):
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")
    except OSError:
        return None
    return _memory(jvm, "VmRSS")


def _memory(jvm: int, field: str) -> Optional[Dict[str, Dict[int, int]]]:
    got = {"jvm": {jvm: _status_kb(jvm, field)},
           "workers": {p: _status_kb(p, field) for p in _python_workers(jvm)}}
    if not got["workers"] or any(v is None for d in got.values() for v in d.values()):
        return None
    return {who: {p: 1024 * v for p, v in d.items()} for who, d in got.items()}


def peak_rss(spark) -> Optional[Dict[str, Dict[int, int]]]:
    """The high-water marks of resident memory since :func:`reset_peaks` (VmHWM), ``{"workers":
    {pid: bytes} of the live Python workers, "jvm": {pid: bytes}}``; None where ``/proc`` lacks
    them."""
    return _memory(int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()),
                   "VmHWM")


def rss_figures(before: Optional[Dict[str, Dict[int, int]]],
                peak: Optional[Dict[str, Dict[int, int]]]) -> Dict[str, int]:
    """``{WHO_peak_rss, WHO_added_rss}`` (bytes) for WHO in workers, jvm: the peaks summed over
    the processes alive at the end, and each one's peak less its resident memory at the reset
    (a process started since: its whole peak), summed. A worker that exited during the run is
    left out (its peak went with it). Empty when either argument is None."""
    if before is None or peak is None:
        return {}
    out = {}
    for who in ("workers", "jvm"):
        out[f"{who}_peak_rss"] = sum(peak[who].values())
        out[f"{who}_added_rss"] = sum(max(0, v - before[who].get(p, 0))
                                      for p, v in peak[who].items())
    return out


# ------------------------------------------------------------------ variants
def _noop(df, _batch_id=None) -> None:
    df.write.format("noop").mode("overwrite").save()


def _tws_processor():
    from pyspark.sql.streaming import StatefulProcessor
    from pyspark.sql.types import LongType, StructField, StructType

    class Counter(StatefulProcessor):
        def init(self, handle) -> None:
            self.count = handle.getValueState("count", StructType([StructField("c", LongType())]))

        def handleInitialState(self, key, initialState, timerValues) -> None:
            self.count.update((int(initialState["value"].iloc[0]),))

        def handleInputRows(self, key, rows, timerValues):
            import pandas as pd

            count = self.count.get()[0] if self.count.exists() else 0
            for pdf in rows:
                counts = count + np.arange(1, len(pdf) + 1, dtype=np.int64)
                count += len(pdf)
                yield pd.DataFrame({"k": pdf["k"].to_numpy(), "count": counts})
            self.count.update((count,))

        def close(self) -> None:
            pass

    return Counter()


def _run(writer, checkpoint_dir: str) -> dict:
    """Run ``writer`` with ``trigger(availableNow=True)``; returns ``{"s": wall seconds,
    "batches": [(input rows, trigger ms)]}`` from Spark's query progress."""
    t0 = time.perf_counter()
    query = writer.option("checkpointLocation", checkpoint_dir).trigger(availableNow=True).start()
    try:
        query.awaitTermination()
    finally:
        if query.isActive:
            query.stop()
    secs = time.perf_counter() - t0
    batches = [(int(p["numInputRows"]), float(p["durationMs"]["triggerExecution"]))
               for p in query.recentProgress if int(p["numInputRows"]) > 0]
    return {"s": secs, "batches": batches}


def _operator(checkpoint: str, budget: Optional[int]):
    from statecore.spark import StatefulOperator

    return StatefulOperator(_OPERATOR, RunningCount(), "k", checkpoint, sink=_noop,
                            parallelism=_PARALLELISM, max_parallelism=_MAX_PARALLELISM,
                            backend="native", memory_budget=budget)


_SHORT = {"in_memory": "in memory", "tiered": "tiered", "transformWithStateInPandas": "TWS"}


def _panel(r):
    if r["impl"] == "setup":
        return None
    dist = r["metric"].split("_")[0]
    bar = f"{_SHORT[r['impl']]}\n{dist}"
    if r["unit"] == "events/s" and not r["metric"].endswith("steady_events_per_s"):
        return ("events/s", bar)
    if r["unit"] == "s" and r["metric"].endswith("first_batch_s"):
        return ("1st micro-batch, s", bar)
    if r["unit"] == "bytes" and "workers_added_rss" in r["metric"] and r["impl"] != \
            "transformWithStateInPandas":  # its state is in the JVM
        return ("workers' RSS added", bar)
    if r["unit"] == "ratio":
        other = r["metric"].split("_over_")[1]
        steady = other.endswith("_steady")
        other = _SHORT[other.removesuffix("_steady")]
        return ("tiered / other", f"{dist} / {other}" + ("\nsteady" if steady else ""))
    return None


def _rates(dist: str, run: dict, events: int) -> Dict[str, float]:
    rest = run["batches"][1:]
    out = {f"{dist}_events_per_s": events / run["s"],
           f"{dist}_first_batch_s": run["batches"][0][1] / 1e3 if run["batches"] else 0.0}
    if rest and sum(ms for _, ms in rest) > 0:
        out[f"{dist}_steady_events_per_s"] = (sum(n for n, _ in rest)
                                              / (sum(ms for _, ms in rest) / 1e3))
    return out


@case(CASE,
      "running count per key through Structured Streaming local[2] over 20M bootstrapped keys "
      "(200k at --quick), a checkpoint every micro-batch, uniform and Zipf(1.0) keys: statecore "
      "tiered (memory_budget 1/16 of the state) vs statecore in memory vs "
      "transformWithStateInPandas with RocksDB (100k keys; left out at --quick)", panel=_panel)
def spark_tiered_running_count(size: Size):
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print(f"  {CASE}: pyspark is not installed; skipped")
        return []
    if not has_native():
        print(f"  {CASE}: the native extension is not built; skipped")
        return []
    tws = not size.quick
    if size.quick:
        print(f"  {CASE}: --quick leaves transformWithStateInPandas out (thousands of events/s) "
              "and resident memory unmeasured (closing the workers' backends takes a Spark job "
              "per run)")
    try:
        import google.protobuf  # noqa: F401  (transformWithStateInPandas' Python runner needs it)
    except ImportError:
        if tws:
            print(f"  {CASE}: protobuf is not installed; transformWithStateInPandas skipped")
        tws = False
    keys = size.n(20_000_000, 200_000)
    events = size.n(4_000_000, 200_000)
    files = 2 if size.quick else 8
    tws_keys = min(keys, size.n(100_000, 20_000))
    tws_events = size.n(20_000, 4_000)
    budget = max(1, keys * _ENTRY_BYTES // (_PARALLELISM * _BUDGET_DIVISOR))
    spark, provider_before = rocksdb_session()
    root = tempfile.mkdtemp(prefix="statecore-bench-spark-tiered-")
    out = [record(CASE, "setup", "keys", keys, "keys"),
           record(CASE, "setup", "events", events, "events"),
           record(CASE, "setup", "micro_batches", files, "micro-batches"),
           record(CASE, "setup", "memory_budget_per_task_bytes", budget, "bytes")]
    rates: Dict[tuple, float] = {}  # (variant, dist): events/s of the whole query
    steady: Dict[tuple, Optional[float]] = {}  # the same after the first micro-batch
    try:
        t0 = time.perf_counter()
        write_initial_counts(os.path.join(root, "initial"), keys)
        for dist in _DISTS:
            write_keys(os.path.join(root, f"landing-{dist}"), dist, keys, events, files)
        gen_s = time.perf_counter() - t0
        print(f"  {CASE}: wrote {keys:,} keys of state and 2 x {events:,} events in {gen_s:.1f} s",
              flush=True)
        base = os.path.join(root, "bootstrapped")
        t0 = time.perf_counter()
        _operator(base, None).bootstrap(spark, [
            (ReducingStateDescriptor("count", "count"),
             spark.read.parquet(os.path.join(root, "initial")))])
        boot_s = time.perf_counter() - t0
        out.append(record(CASE, "setup", "bootstrap_s", boot_s, "s"))
        print(f"  {CASE}: bootstrapped {keys:,} keys in {boot_s:.1f} s "
              f"({keys / boot_s:,.0f} keys/s); tiered budget {budget:,} bytes a task "
              f"(1/{_BUDGET_DIVISOR} of {keys * _ENTRY_BYTES // _PARALLELISM:,})", flush=True)
        for dist in _DISTS:
            landing = os.path.join(root, f"landing-{dist}")
            for variant in ("in_memory", "tiered"):
                work = os.path.join(root, f"{variant}-{dist}")
                shutil.copytree(base, os.path.join(work, "state"))
                op = _operator(os.path.join(work, "state"), budget if variant == "tiered"
                               else None)
                before = None if size.quick else reset_peaks(spark)
                run = _run(landing_stream(spark, landing).writeStream.foreachBatch(op),
                           os.path.join(work, "spark"))
                rss = rss_figures(before, peak_rss(spark))
                seen = sum(r.rows for r in op.reports), sum(r.output_rows for r in op.reports)
                if seen != (events, events):
                    raise RuntimeError(f"{variant} {dist}: the operator committed (rows, output "
                                       f"rows) {seen}, not {events} of each")
                got = _rates(dist, run, events)
                first = op.reports[0] if op.reports else None
                if first is not None:
                    got[f"{dist}_first_batch_load_s"] = max(
                        (p.get("load_s", 0.0) for p in first.partitions), default=0.0)
                    loads = ",".join(sorted({str(p.get("load")) for p in first.partitions}))
                    got[f"{dist}_state_bytes"] = float(op.reports[-1].state_bytes)
                else:
                    loads = "?"
                shutil.rmtree(work, ignore_errors=True)
                _emit(out, variant, got, rss, dist)
                rates[(variant, dist)] = got[f"{dist}_events_per_s"]
                steady[(variant, dist)] = got.get(f"{dist}_steady_events_per_s")
                print(f"  {CASE}: {variant:<10} {dist:<8} {events:>10,} events in "
                      f"{run['s']:6.1f} s = {rates[(variant, dist)]:>10,.0f} events/s; first "
                      f"micro-batch {got[f'{dist}_first_batch_s']:.2f} s (load: {loads})"
                      + (f"; workers' peak RSS {rss['workers_peak_rss'] / 2**20:,.0f} MiB, "
                         f"{rss['workers_added_rss'] / 2**20:,.0f} MiB added" if rss else ""),
                      flush=True)
        if tws:
            out.append(record(CASE, "setup", "tws_keys", tws_keys, "keys"))
            out.append(record(CASE, "setup", "tws_events", tws_events, "events"))
            tws_initial = os.path.join(root, "tws-initial")
            write_initial_counts(tws_initial, tws_keys, files=2)
            for dist in _DISTS:
                landing = os.path.join(root, f"tws-landing-{dist}")
                write_keys(landing, dist, tws_keys, tws_events, 4)
                before = None if size.quick else reset_peaks(spark)
                initial = spark.read.parquet(tws_initial).groupBy("k")
                df = landing_stream(spark, landing).groupBy("k").transformWithStateInPandas(
                    statefulProcessor=_tws_processor(), outputStructType=_OUT_DDL,
                    outputMode="Update", timeMode="None", initialState=initial)
                run = _run(df.writeStream.format("noop").outputMode("update"),
                           os.path.join(root, f"tws-{dist}"))
                rss = rss_figures(before, peak_rss(spark))
                got = _rates(dist, run, tws_events)
                _emit(out, "transformWithStateInPandas", got, rss, dist)
                rates[("transformWithStateInPandas", dist)] = got[f"{dist}_events_per_s"]
                steady[("transformWithStateInPandas", dist)] = got.get(
                    f"{dist}_steady_events_per_s")
                print(f"  {CASE}: transformWithStateInPandas {dist:<8} {tws_events:,} events "
                      f"over {tws_keys:,} keys in {run['s']:.1f} s = "
                      f"{rates[('transformWithStateInPandas', dist)]:,.0f} events/s; first "
                      f"micro-batch {got[f'{dist}_first_batch_s']:.2f} s", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        restore_state_store(spark, provider_before)
    for dist in _DISTS:
        for other in ("in_memory", "transformWithStateInPandas"):
            for what, got in (("", rates), ("_steady", steady)):
                a, b = got.get(("tiered", dist)), got.get((other, dist))
                if a and b:
                    out.append(record(CASE, "tiered", f"{dist}_tiered_over_{other}{what}",
                                      a / b, "ratio"))
    return out


def _emit(out: list, impl: str, got: Dict[str, float], rss: Dict[str, int], dist: str) -> None:
    for metric, value in got.items():
        unit = ("events/s" if metric.endswith("events_per_s")
                else "bytes" if metric.endswith("bytes") else "s")
        out.append(record(CASE, impl, metric, value, unit))
    for what, value in rss.items():
        out.append(record(CASE, impl, f"{dist}_{what}_bytes", value, "bytes"))


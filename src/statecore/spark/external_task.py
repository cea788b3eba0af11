"""The task side of :class:`statecore.spark.StatefulOperator` on external keyed state
(``state_store=``, docs/spark.md "Keyed state in an external store"): one partition of one
micro-batch whose keyed state lives in the store (:mod:`statecore.external`), the micro-batch
being the store's epoch.

A task of Spark partition ``i``:

1. takes this worker's backend of the partition when its last pre-committed epoch is the
   version the driver committed last with this very writer (``prev_version`` and
   ``prev_writers`` of the spec: the cache is then exactly the committed state; its union
   lists are re-read), else opens a fresh backend on the store for the partition's key-group
   range, which reads committed entries through on first access -- nothing is downloaded,
   whatever the parallelism was -- and reads the committed operator state for partition ``i``
   of the partitions (``open_operator_state``: redistributed as a restore does);
2. runs the processor as the in-memory task does (the same hooks in the same order: timers,
   TTL and the watermark unchanged);
3. pre-commits epoch ``batch_id`` (the version): its changes go to the store as this task's
   write-ahead log, invisible to readers;
4. reports to the driver through the checkpoint directory as the in-memory task does, minus
   the data file: a pending descriptor ``{"version", "writer"}`` whose report carries the
   log's name (``wal``) and the task's cache counters (``cache_hits``, ``cache_misses``,
   ``cache_key_groups_read``, ``cache_evictions``), recorded once Spark took the task's
   output, with heartbeats
   (:func:`statecore.spark.checkpoint_write.checkpoint_in_background` without a snapshot), so
   the driver's wait and lost-write relaunch are the in-memory path's. The driver writes the
   version's metadata-only manifest naming every partition's log once the sink succeeded,
   then commits the epoch.

A task never commits. Any failure before the pre-commit drops the worker's backend (its cache
holds uncommitted writes); the store discards logs of epochs the driver never commits
(``abort_epoch`` when the micro-batch runs again).
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future
from typing import Any, Dict, Optional

from statecore.key_groups import key_group_range_for_operator

__all__ = ["run_external", "clear_external_backends", "cached_external_backends"]

# Worker-process cache of external backends: (url, namespace, partition, n, maxP, cache kind,
# key type, cache bound, TTL sweep) -> (backend, epoch it pre-committed last, writer of that
# pre-commit).
_BACKENDS: Dict[tuple, tuple] = {}
_LOCK = threading.Lock()
# The cache counters a task reports (CachedExternalBackend.cache_statistics), as cache_<name>.
_CACHE_COUNTERS = ("hits", "misses", "key_groups_read", "evictions")


def clear_external_backends() -> None:
    """Dispose of every external backend this worker process holds (tests, shutdown)."""
    with _LOCK:
        entries = list(_BACKENDS.values())
        _BACKENDS.clear()
    for backend, _epoch, _writer in entries:
        backend.dispose()


def cached_external_backends() -> int:
    """Number of external backends this process holds (tests)."""
    with _LOCK:
        return len(_BACKENDS)


def _take(key: tuple, prev_version: Optional[int], prev_writers):
    """The cached backend of ``key`` when it pre-committed ``prev_version`` as one of the
    writers the driver committed (``prev_writers``), else None (a stale entry is disposed of:
    its cache may hold writes of an epoch that was never committed)."""
    with _LOCK:
        entry = _BACKENDS.pop(key, None)
    if entry is None:
        return None
    backend, epoch, writer = entry
    if (prev_version is not None and epoch == prev_version and prev_writers is not None
            and writer in prev_writers and not backend.disposed):
        return backend
    backend.dispose()
    return None


def _put(key: tuple, backend, epoch: int, writer: str) -> None:
    """Keep ``backend`` for ``key``; entries of the same namespace at another parallelism, or
    of the same partition with other options, are disposed of (no task of this run asks for
    them)."""
    with _LOCK:
        gone = [k for k in _BACKENDS if k[:2] == key[:2] and k != key
                and (k[3] != key[3] or k[2] == key[2])]
        old = [_BACKENDS.pop(k) for k in gone + ([key] if key in _BACKENDS else [])]
        _BACKENDS[key] = (backend, epoch, writer)
    for entry in old:
        if entry[0] is not backend:
            entry[0].dispose()


def _open_backend(spec, partition_id: int):
    from statecore.external import PostgresBackend, RedisBackend
    from statecore.external.urls import store_kind

    cls = PostgresBackend if store_kind(spec.state_store) == "postgres" else RedisBackend
    return cls(
        spec.state_store, spec.state_namespace, key_type=spec.key_type,
        max_parallelism=spec.max_parallelism,
        key_group_range=key_group_range_for_operator(spec.max_parallelism,
                                                     spec.num_partitions, partition_id),
        assigner="spark", cache=spec.backend_kind,
        task=f"p{partition_id}of{spec.num_partitions}", timeout_s=spec.state_store_timeout_s,
        cache_entries=spec.state_store_cache_entries,
        ttl_sweep_key_groups=spec.state_store_ttl_sweep_key_groups)


def _no_data_file(_store, _snap, version: int, writer: str) -> Future:
    """The "write" of a task without a data file: resolved at once to the bare descriptor."""
    fut: Future = Future()
    fut.set_result({"version": version, "writer": writer})
    return fut


def run_external(spec, partition_id: int, inputs, t0: float, task_attempt: int, produce):
    """Run partition ``partition_id`` of ``spec`` (a :class:`statecore.spark.task.TaskSpec`
    with ``state_store`` set) on ``inputs`` (an iterator of its routed input's data batches)
    and yield its output batches (module docstring). ``produce(ctx, inputs, seen, chunked)``
    yields the processor's checked output as the in-memory task runs it. Errors: the
    processor's, the store's (statecore.errors StateError subclasses naming the server),
    :class:`~statecore.spark.task.TaskSpec`'s."""
    from statecore.checkpoint import CheckpointStore
    from statecore.spark.checkpoint_write import checkpoint_in_background
    from statecore.spark.processor import ProcessorContext

    store = CheckpointStore(spec.store_uri)
    key = (spec.state_store, spec.state_namespace, partition_id, spec.num_partitions,
           spec.max_parallelism, spec.backend_kind, spec.key_type,
           spec.state_store_cache_entries, spec.state_store_ttl_sweep_key_groups)
    t_load = time.perf_counter()
    backend = _take(key, spec.prev_version, spec.prev_writers)
    source = "cache"
    if backend is None:
        backend = _open_backend(spec, partition_id)
        source = "external"
        try:
            backend.open_operator_state(partition_id, spec.num_partitions)
        except BaseException:
            backend.dispose()
            raise
    elif spec.prev_version is not None:
        backend.notify_committed(spec.prev_version)
    stats0 = backend.cache_statistics()
    kg_range = backend.key_group_range
    writer = f"p{partition_id}-{spec.attempt}-t{task_attempt}"
    ctx = ProcessorContext(
        backend=backend, operator_name=spec.operator_name, batch_id=spec.batch_id,
        partition_id=partition_id, num_partitions=spec.num_partitions,
        max_parallelism=spec.max_parallelism, key_group_range=kg_range,
        key_column=(spec.key_column if isinstance(spec.key_column, str)
                    else list(spec.key_column)),
        watermark_ms=spec.watermark_ms, is_flush=spec.is_flush and spec.flush_final,
        processing_time_ms=spec.processing_time_ms)
    try:
        if source == "cache":
            # A restore gives every task all tasks' union lists; this backend holds its own.
            backend.refresh_operator_state()
        spec.processor.open(ctx)
        if spec.first_watermark:
            # Event-time TTL stamps writes made before any watermark with the lowest int64 and
            # re-stamps them with the backend's first watermark (observe_watermark). The store
            # holds such entries from the versions without a watermark: every key group is
            # read now, so the re-stamp covers them all and goes to the store with this epoch,
            # as a restore from a checkpoint followed by the first watermark does.
            backend.read_through(kg_range)
        if spec.watermark_ms is not None:
            backend.observe_watermark(spec.watermark_ms)
        load_s = time.perf_counter() - t_load
        chunked = bool(getattr(spec.processor, "chunked_input", False)) and not spec.is_flush
        t_in = time.perf_counter()
        if not chunked:
            inputs = list(inputs)
        input_s = 0.0 if chunked else time.perf_counter() - t_in
        out_rows = 0
        t_proc = time.perf_counter()
        held = None
        seen: Dict[str, Any] = {"rows": 0, "max_event_ms": None}
        for ob in produce(ctx, inputs, seen, chunked):
            out_rows += ob.num_rows
            if held is not None:
                yield held
            held = ob
        proc_s = time.perf_counter() - t_proc
        t_snap = time.perf_counter()
        wal = backend.pre_commit(spec.batch_id, sweep_ttl=not spec.is_flush)
        snap_s = time.perf_counter() - t_snap
        if spec.ttl_background_key_groups and not spec.is_flush:
            # Its removals are writes of the next epoch.
            backend.run_background_ttl_cleanup(spec.ttl_background_key_groups)
        stats = backend.cache_statistics()
        report = {
            "partition": partition_id, "attempt": spec.attempt, "task_attempt": task_attempt,
            "writer": writer, "wal": wal,
            "rows": seen["rows"], "output_rows": out_rows,
            "max_event_ms": seen["max_event_ms"],
            "state_entries": int(backend.num_entries()),
            "state_bytes": int(backend.state_bytes()),
            "load": source, "input_s": input_s, "load_s": load_s, "load_cpu_s": 0.0,
            "restore_bytes": 0, "standby_cpu_s": 0.0, "process_s": proc_s,
            "snapshot_s": snap_s, "incremental": False, "snapshot_id": 0,
            "task_s": time.perf_counter() - t0, "pid": os.getpid(), "gc_frozen_objects": 0,
            "metrics": {k: int(v) for k, v in ctx.metrics.items()},
            # This task's share of the cache's counters (the backend outlives the task).
            **{f"cache_{k}": int(stats[k] - stats0[k]) for k in _CACHE_COUNTERS},
        }
    except BaseException:
        backend.dispose()
        raise
    output_done: Future = Future()
    done = checkpoint_in_background(store, None, spec.batch_id, writer, report, _no_data_file,
                                    output_done, spec.heartbeat_interval_s,
                                    spec.commit_timeout_s)
    _put(key, backend, spec.batch_id, writer)
    try:
        if held is not None:
            yield held
    except BaseException:
        output_done.set_result(False)
        raise
    output_done.set_result(True)
    if not os.environ.get("SPARK_REUSE_WORKER"):
        done.result()

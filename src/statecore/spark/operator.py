"""The statecore Structured Streaming operator: keyed state with exactly-once checkpoints for a
Python processor, built from ``foreachBatch`` + ``repartitionById`` + ``mapInArrow``.

One micro-batch (``StatefulOperator.__call__(df, batch_id)``, used as the ``foreachBatch``
function, or called from one):

1. Driver: read the manifest of version ``batch_id - 1`` (watermark, attempt id); route the
   micro-batch by ``repartitionById(n, op)`` with ``op = (pmod(xxhash64(key), maxP) * n) div
   maxP`` computed in Spark SQL inside the partitioning expression (no key-group column, no
   ``op`` column: the task's Spark partition id is its operator index); ``mapInArrow(task)``;
   hand the result to the sink, whose action runs the tasks. Spark runs the Python function of
   every partition of the shuffle, empty ones included, so every partition checkpoints and
   fires its timers each micro-batch, with or without input. (The end-of-input flush, which
   has no input, routes one *control row* per partition instead: a null key and its index.)
2. Task (partition ``i``, in a Python worker): its key-group range is Flink's
   ``computeKeyGroupRangeForOperatorIndex(maxP, n, i)``. State at version ``batch_id - 1`` comes
   from the in-process cache when this worker process produced exactly that committed version
   (same attempt, and its data file is one of the writers the driver committed) for this
   (checkpoint, operator, partition, n, maxP) — PySpark reuses workers, but a partition lands on
   the same worker only about half the time, so after each task a worker also brings its copies
   of other partitions up to the version the driver commits, in the background (``standby``),
   which makes those a cache hit too — else caught up from an older committed copy
   of the partition that this worker kept (``stale_copies``: the runs committed since are
   applied, :meth:`CheckpointStore.open_changes`), and otherwise is restored from the checkpoint
   store (only the key groups of the range, from whichever runs cover them, which is also how a
   restart with another ``n`` re-splits key groups). The processor runs (its output batches
   stream to the sink while it runs). Then the checkpoint, in two parts:

   * synchronous: ``backend.snapshot(incremental=...)`` — O(1) to O(changes), isolated from
     later writes;
   * asynchronous (a background thread of the worker, or the store's ``write_snapshot_async``):
     write the run ``data/<batch_id>/p<i>-<attempt>-t<task attempt>.sckp``, release the
     snapshot, then record the pending descriptor ``pending/<batch_id>/<same writer>.json``
     (descriptor + the task's counters as ``spark_report``; files rather than an accumulator, so
     the commit does not rely on the driver's SparkContext). A failed write records a pending
     descriptor with an ``error`` instead.

   The task returns as soon as the write started, so the write overlaps the rest of the sink's
   work, the other partitions' tasks and the next operator's job. (A worker that Spark does not
   reuse — ``spark.python.worker.reuse=false`` — exits with ``os._exit`` after the task, so there
   the task waits for its write.) Each Spark task attempt writes its own file, so a retried or
   speculative attempt can never pair one attempt's descriptor with another's bytes.
3. Driver, after the sink's action returned (:meth:`PendingBatch.commit`): wait until every
   partition of this attempt recorded its pending descriptor (at most ``commit_timeout_s``),
   commit version ``batch_id`` (the manifest carries the watermark for the next batch, the
   attempt id and the committed writers), clear the pending descriptors and apply retention
   (``retain_versions``). The store compacts a version whose run chain grew past ``max_runs``.

Incremental checkpoints
-----------------------
Version 0 (no predecessor) is written full. Every later version is incremental: the changes
since the backend's base (tombstones for removals), stored as new runs on top of the previous
version's runs (``checkpoint/store.py`` "Runs and versions"). The base is either the restored
state (a task that restored ``batch_id - 1`` from the store) or, for a backend taken from the
worker cache, its own snapshot of ``batch_id - 1``: the cache entry keeps that snapshot's id and
the task calls ``backend.notify_checkpoint_complete(id)`` once it knows the driver committed
that version with that very data file (``attempt`` and ``writers`` of the manifest) — the
Flink ``notifyCheckpointComplete`` rule: the base moves only to a durable checkpoint. If the
commit never happened (failed batch, replay) the entry does not match and the next task
restores from the store instead, so an incremental run is never relative to an uncommitted one.

Why the driver waits before ``foreachBatch`` returns (exactly-once vs asynchronous writes)
-----------------------------------------------------------------------------------------
Spark records micro-batch ``v`` in its commit log when ``foreachBatch(v)`` returns and never
runs ``v`` again after that. If the operator returned while state ``v`` was still being written,
a crash right then would leave Spark past ``v`` and statecore without version ``v``: batch
``v + 1`` would have no predecessor (or silently miss ``v``'s updates). So version ``v`` is
committed (manifest written) before ``foreachBatch`` returns; what is asynchronous is only the
part between the snapshot and that commit. With several operators in one ``foreachBatch`` (the
demo has two), each :meth:`StatefulOperator.start` runs its sink's action without committing
and :func:`commit_batches` then waits for all of them and commits them at the end, so the
writes of the first operator overlap the second operator's job. A background write that never
reports (its worker died) makes the driver time out with StateError after
``commit_timeout_s``; one that fails reports its error at once. Either way nothing is committed,
``foreachBatch`` raises, and Spark replays ``v``, which restores ``v - 1``.

A micro-batch replayed after a failure restores ``batch_id - 1`` again and its sink overwrites
its own output, so state and output are exactly-once if the processor is deterministic and the
sink is idempotent per batch id (the default sink overwrites ``OUTPUT/batch_id=N/``).

End of input: :meth:`StatefulOperator.flush` runs one more version (``latest + 1``) in which
every partition calls ``processor.flush``; it is committed with ``"final": true`` and a rerun is
a no-op. A finalized checkpoint accepts no further micro-batches.
"""

from __future__ import annotations

import gc
import itertools
import os
import sys
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional

import pyarrow as pa
import pyarrow.compute as pc

from statecore.errors import CheckpointNotFoundError, InvalidInputError, StateError
from statecore.key_groups import check_max_parallelism, key_group_range_for_operator
from statecore.spark.processor import KeyedProcessor, ProcessorContext
from statecore.timers import epoch_ms
from statecore.spark.routing import (
    KEY_GROUP_COLUMN,
    OPERATOR_INDEX_COLUMN,
    backend_key_type,
    operator_index_of,
)
from statecore.spark import handoff
from statecore.spark.worker_cache import (
    _CACHE_LOCK,
    _TASKS_STARTED,
    _CachedState,
    _holds,
    _partition_backend,
    _put_cached,
    _start_standby,
    _take_after_standby,
    _take_stale,
    clear_state_cache,
)

__all__ = ["StatefulOperator", "PendingBatch", "BatchReport", "commit_batches",
           "parquet_batch_sink", "clear_state_cache"]

_INTERNAL = (KEY_GROUP_COLUMN, OPERATOR_INDEX_COLUMN)


# ------------------------------------------------------------------------------------------
# Worker side: the background checkpoint write
# ------------------------------------------------------------------------------------------

def _start_snapshot_write(store, snap, version: int, writer: str) -> Future:
    """Start writing ``snap`` as the data file of ``writer`` at ``version``; the Future resolves
    to the descriptor of :meth:`CheckpointStore.write_snapshot` (or its exception). Uses the
    store's own ``write_snapshot_async`` when it has one, else a plain non-daemon thread (a
    Python interpreter that exits normally finishes it first). Does not release ``snap`` (the
    caller does once the write ended): releasing map snapshots key group by key group as they
    are encoded (``release_snapshot=True``) made the owner thread slower during the write, not
    faster (`statecore bench --case throughput_during_snapshot`, 10M entries: 0.44-0.47 of the
    throughput without a snapshot vs 0.77-1.0 when released at the end)."""
    native_async = getattr(store, "write_snapshot_async", None)
    if native_async is not None:
        # At the store's default nice 10 the write yields to everything else on a busy machine,
        # but the driver waits for it right after the action: it is on the micro-batch's
        # critical path, not background work.
        return native_async(snap, version, writer, nice=0)
    fut: Future = Future()
    fut.set_running_or_notify_cancel()

    def run():
        try:
            fut.set_result(store.write_snapshot(snap, version, writer=writer))
        except BaseException as exc:  # handed to the Future's consumer
            fut.set_exception(exc)

    threading.Thread(target=run, name=f"statecore-write-{writer}", daemon=False).start()
    return fut


def _checkpoint_in_background(store, snap, version: int, writer: str, report: dict,
                              start_write: Callable, output_done: Optional[Future] = None) -> Future:
    """The asynchronous part of a task's checkpoint: write ``snap``'s data file, release the
    snapshot, then record the pending descriptor (``report`` as its ``spark_report``). When the
    write fails, a pending descriptor carrying ``report["error"]`` is recorded instead, so the
    driver fails the micro-batch at once rather than at its timeout. ``output_done``
    (optional): a Future the task resolves to True once Spark took all of its output, False when
    the output was cut short; the descriptor waits for it and nothing is recorded after False
    (the returned Future then fails with StateError). Returns a Future that resolves (to the
    descriptor, or with the exception) once all of that is done. Adds ``write_s`` (seconds from
    the call to the end of the data file write) to ``report``."""
    done: Future = Future()
    done.set_running_or_notify_cancel()
    t_start = time.perf_counter()
    if output_done is None:
        output_done = Future()
        output_done.set_result(True)
    lock = threading.Lock()
    arrivals = [0]

    def finish(write: Future) -> None:
        if not output_done.result():
            done.set_exception(StateError(
                f"checkpoint {writer} of version {version}: the task's output was cut short; "
                "not reported"))
            return
        try:
            desc = write.result()
            store.write_pending(version, writer, dict(desc, spark_report=report))
            done.set_result(desc)
        except BaseException as exc:
            try:
                store.write_pending(version, writer, {
                    "version": version, "writer": writer,
                    "spark_report": dict(report, error=f"{type(exc).__name__}: {exc}")})
            except BaseException:
                pass  # the driver's timeout reports it
            done.set_exception(exc)

    def written(_write: Future) -> None:
        # The snapshot pins copy-on-write memory: released as soon as its bytes are out.
        report["write_s"] = time.perf_counter() - t_start
        snap.release()

    def arrive(_f: Future) -> None:
        # The data file and the task's output, in either order; the second records.
        with lock:
            arrivals[0] += 1
            last = arrivals[0] == 2
        if last:
            finish(write)

    try:
        write = start_write(store, snap, version, writer)
    except BaseException as exc:
        write = Future()
        write.set_exception(exc)
    # SnapshotWriteFuture.cancel stops a running write; a plain Future's cancel is a no-op then.
    done.cancel_write = write.cancel
    write.add_done_callback(written)
    write.add_done_callback(arrive)
    output_done.add_done_callback(arrive)
    return done


def _task_attempt_number() -> int:
    """Spark's attempt number of the running task (0 outside a Spark task)."""
    try:
        from pyspark import TaskContext
    except ImportError:
        return 0
    tc = TaskContext.get()
    return int(tc.attemptNumber()) if tc is not None else 0


class _InThread:
    """``fn()`` in a daemon thread started at once; :meth:`result` waits and returns its value
    or raises its exception in the caller's thread."""

    def __init__(self, fn: Callable, name: str):
        self._value: Any = None
        self._error: Optional[BaseException] = None

        def run() -> None:
            try:
                self._value = fn()
            except BaseException as exc:  # re-raised by result() in the caller's thread
                self._error = exc

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self) -> None:
        self._thread.join()

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


def _spark_partition_id() -> int:
    """The running Spark task's partition id (StateError outside a Spark task)."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:
        raise StateError("the operator's task runs only inside a Spark task")
    return int(tc.partitionId())


# len(sys.modules) at this process's last freeze (None: not frozen yet), and how many times it
# froze: at most _GC_MAX_FREEZES, so code that imports something new in every task cannot make
# every task freeze (and keep) its predecessors' leftovers.
_GC_FROZEN_MODULES: Optional[int] = None
_GC_FREEZES = 0
_GC_MAX_FREEZES = 4
# gc.get_freeze_count() right after this process's last freeze: the call walks the whole
# permanent generation (~80k+ objects, 10-20 ms with the cache misses on the 2-core bench
# machine), too slow to repeat in every task's report.
_GC_FROZEN_COUNT = 0


def _freeze_worker_gc() -> None:
    """Move every object this Python worker holds now to the interpreter's permanent generation
    (``gc.freeze``, CPython >= 3.7) at its first statecore task, and again at the start of a
    later task when modules were imported since the last freeze, so later cyclic collections
    skip them.

    Why: PySpark's daemon runs a full ``gc.collect()`` after every task of a reused worker. With
    pyspark, pyarrow and pandas loaded that is ~80k objects and took 60-150 ms a task on the
    2-core machine of ``bench/results``, holding the GIL the whole time -- right when the task's
    background checkpoint write needs it, which the driver waits for. Measured with the
    running-count job (4M events, 1M keys, 8 micro-batches): the driver's total wait for writes
    0.69-0.81 s without, 0.05-0.29 s with the freeze; the workers' writes 1.2-1.5 s vs 0.55-0.6 s.

    Why again after imports: the first task imports statecore's backends and checkpoint store
    (and pyarrow may import pandas on first use), objects a freeze at its start cannot include
    (29,724 left outside the permanent generation in a worker after two running-count runs);
    collecting them cost 12-39 ms after every task, 0.2 ms with the second freeze (timed by a
    ``mapInArrow`` in those workers; py-spy of three runs, 250 Hz: 489 samples in the daemon's
    ``gc.collect`` before, 26 after). A
    task starts right after the daemon's collection that followed the previous task, so what is
    frozen then survived a full collection: live objects, not garbage. At most
    ``_GC_MAX_FREEZES`` (4) freezes per process.

    What is frozen is what exists at those task starts (modules, their globals, PySpark's
    worker state, the cached state of earlier tasks): cyclic garbage among those objects is
    never collected (reference counting still frees the rest; cached backends are closed
    explicitly, which frees their native memory), a bounded cost: a process freezes again only
    when its set of modules grew, and only a few times. Objects created later are collected as
    usual."""
    global _GC_FROZEN_MODULES, _GC_FROZEN_COUNT, _GC_FREEZES
    modules = len(sys.modules)
    if _GC_FROZEN_MODULES != modules and _GC_FREEZES < _GC_MAX_FREEZES:
        _GC_FROZEN_MODULES = modules
        _GC_FREEZES += 1
        gc.freeze()
        _GC_FROZEN_COUNT = gc.get_freeze_count()


def _event_time_ms(arr) -> Optional[int]:
    """Max of a timestamp (any unit) or int64-milliseconds column, in ms; None when all null."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if pa.types.is_timestamp(t):
        return pc.max(epoch_ms(arr, "event-time column")).as_py()
    if pa.types.is_integer(t):
        return pc.max(arr).as_py()
    raise InvalidInputError(
        f"event-time column must be a timestamp or int64 milliseconds, got {t}")


@dataclass(frozen=True)
class _TaskSpec:
    """Everything a task needs, pickled once per micro-batch into the ``mapInArrow`` function."""

    operator_name: str
    store_uri: str
    processor: KeyedProcessor
    backend_kind: str
    key_type: str
    key_column: str
    event_time_column: Optional[str]
    max_parallelism: int
    num_partitions: int
    batch_id: int
    prev_version: Optional[int]
    prev_attempt: Optional[str]
    attempt: str
    watermark_ms: Optional[int]
    is_flush: bool
    output_schema: pa.Schema
    prev_writers: Optional[frozenset] = None
    start_write: Optional[Callable] = None
    commit_timeout_s: float = 300.0
    ttl_background_key_groups: int = 0
    stale_copies: int = 1
    freeze_worker_gc: bool = True
    standby: bool = True
    handoff: bool = False

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        t0 = time.perf_counter()
        if self.freeze_worker_gc:
            _freeze_worker_gc()
        # repartitionById(n, op) puts the rows of operator index i into Spark partition i, so
        # the task's partition id is its operator index (the index column is not shipped).
        partition_id = _spark_partition_id()
        if not 0 <= partition_id < self.num_partitions:
            raise StateError(
                f"operator {self.operator_name}: Spark partition {partition_id} is not an "
                f"operator index in [0, {self.num_partitions})")
        if self.handoff and self.prev_version is not None:
            relayed = self._hand_off(partition_id, batches)
            if relayed is not None:
                yield from relayed
                return
        yield from self._run(partition_id, batches, t0)

    def _cache_key(self, partition_id: int, store=None) -> tuple:
        """The worker cache's key of ``partition_id`` (``store``: this operator's
        CheckpointStore, when the caller has one)."""
        from statecore.checkpoint import CheckpointStore

        uri = (store if store is not None else CheckpointStore(self.store_uri)).uri
        return (uri, self.operator_name, partition_id)

    def _want(self) -> tuple:
        return (self.prev_version, self.prev_attempt, self.num_partitions, self.max_parallelism,
                self.backend_kind, self.key_type)

    def _hand_off(self, partition_id: int, batches: Iterator[pa.RecordBatch]):
        """The output of this task run by the worker of this host that holds the partition's
        state at the previous version (:mod:`statecore.spark.handoff`), or None when this
        worker holds it itself (or a standby here is bringing it up) or no other worker takes
        the task."""
        cache_key = self._cache_key(partition_id)
        if _holds(cache_key, self._want()):
            return None
        return handoff.relay(self, cache_key, partition_id, _task_attempt_number(),
                             lambda: self._data_chunks(batches, partition_id))

    def _take_for_handoff(self, partition_id: int) -> Optional[_CachedState]:
        """In the holder: this worker's cached state of the partition at exactly the previous
        version, taken out of the cache for the handed-off task, or None."""
        return _take_after_standby(self._cache_key(partition_id), self._want(),
                                   self.prev_writers, self.commit_timeout_s)

    def _data_chunks(self, batches: Iterator[pa.RecordBatch], partition_id: int):
        """The routed input's data rows, chunk by chunk as Spark delivers them (internal
        columns removed). InvalidInputError as soon as a null key arrives. The flush's input is
        its control row (a null key) alone: StateError unless exactly one came."""
        allowed = 1 if self.is_flush else 0  # the flush's one control row
        nulls = 0
        for b in batches:
            if b.num_rows == 0:
                continue
            keys = b.column(self.key_column)
            c = keys.null_count
            if c:
                nulls += c
                if nulls > allowed:
                    raise InvalidInputError(
                        f"operator {self.operator_name}: Spark partition {partition_id} received "
                        f"{nulls - allowed} rows with a null key in column {self.key_column!r}; "
                        "filter null keys before the operator")
                b = b.filter(keys.is_valid())
            if b.num_rows:
                if any(n in _INTERNAL for n in b.schema.names):
                    b = b.select([n for n in b.schema.names if n not in _INTERNAL])
                yield b
        if nulls != allowed:
            raise StateError(
                f"operator {self.operator_name}: Spark partition {partition_id} received no "
                "control row; was the routed DataFrame repartitioned again?")

    def _run(self, partition_id: int, batches: Iterator[pa.RecordBatch],
             t0: Optional[float] = None, *, hit: Optional[_CachedState] = None,
             task_attempt: Optional[int] = None, output_taken: Optional[Callable] = None):
        """The task of ``partition_id`` on the input ``batches``: load, process, snapshot,
        start the checkpoint write, yield the output. A handed-off task (run by the holder,
        :mod:`statecore.spark.handoff`) brings its ``hit`` (the cached state already taken),
        its Spark ``task_attempt`` and ``output_taken()``, which returns once the relaying task
        gave the last output batch to Spark (True) or failed to (False)."""
        from statecore.checkpoint import CheckpointStore

        if t0 is None:
            t0 = time.perf_counter()
        if task_attempt is None:
            task_attempt = _task_attempt_number()
        kg_range = key_group_range_for_operator(self.max_parallelism, self.num_partitions, partition_id)
        store = CheckpointStore(self.store_uri)
        cache_key = self._cache_key(partition_id, store)
        backend = None
        source = "empty"
        op_key = cache_key[:2]
        with _CACHE_LOCK:
            _TASKS_STARTED[op_key] = _TASKS_STARTED.get(op_key, 0) + 1
        standby_cpu = None
        handed_off = hit is not None
        if self.prev_version is not None:
            if hit is None:
                hit = _take_after_standby(cache_key, self._want(), self.prev_writers,
                                          self.commit_timeout_s)
            if hit is None:
                source = "checkpoint"
            else:
                backend, standby_cpu = hit.backend, hit.standby_cpu_s
                source = "handoff" if handed_off else \
                    "cache" if standby_cpu is None else "standby"
        changes = None
        if backend is None and self.prev_version is not None and self.stale_copies:
            stale = _take_stale(cache_key, store, self.prev_version,
                                (self.num_partitions, self.max_parallelism, self.backend_kind,
                                 self.key_type), kg_range)
            if stale is not None:
                backend, changes = stale
                source = "catch-up"
        if backend is None:
            backend = _partition_backend(self.backend_kind, self.key_type, self.max_parallelism,
                                         self.num_partitions, partition_id)
        ctx = ProcessorContext(
            backend=backend, operator_name=self.operator_name, batch_id=self.batch_id,
            partition_id=partition_id, num_partitions=self.num_partitions,
            max_parallelism=self.max_parallelism, key_group_range=kg_range,
            key_column=self.key_column, watermark_ms=self.watermark_ms, is_flush=self.is_flush)
        writer = f"p{partition_id}-{self.attempt}-t{task_attempt}"
        restoring = None
        load_cpu = [0.0]  # CPU seconds of the load's thread (load_s is its wall time)
        try:
            t_load = time.perf_counter()
            chunked = bool(getattr(self.processor, "chunked_input", False)) and not self.is_flush
            # A handed-off task's relay sends the data chunks (it checked the keys for nulls).
            inputs: Any = batches if handed_off else self._data_chunks(batches, partition_id)
            if source in ("checkpoint", "catch-up"):
                # The restored (caught-up) state becomes the backend's incremental base. It is
                # loaded in a thread while this one takes the input as it arrives (mostly native
                # code and file reads without the GIL; receiving the input mostly waits for
                # Spark), and the processor sees the backend only after that.
                def load():
                    t_cpu = time.thread_time()
                    try:
                        if changes is None:
                            store.restore(backend, self.prev_version)
                            return
                        try:
                            backend.apply_changes(changes)
                        finally:
                            changes.release()
                    finally:
                        load_cpu[0] = time.thread_time() - t_cpu
                restoring = _InThread(load, f"statecore-restore-p{partition_id}")
                early: List[pa.RecordBatch] = []
                if chunked:
                    for chunk in inputs:
                        early.append(chunk)
                        if restoring.done():
                            break
                else:
                    early = list(inputs)
                restoring.result()
                restoring = None
                inputs = itertools.chain(early, inputs) if chunked else early
            # State is declared after the restore, as in Flink: get_state then checks the
            # descriptor against the restored meta (StateMigrationError on a mismatch).
            self.processor.open(ctx)
            if self.watermark_ms is not None:
                # Event-time TTL stamps writes with the micro-batch's watermark (also on a
                # backend restored from the checkpoint), after open() registered the states.
                backend.observe_watermark(self.watermark_ms)
            load_s = time.perf_counter() - t_load

            # A processor with chunked_input consumes the input chunk by chunk as it arrives
            # (its output streams back meanwhile); the others get it all at once.
            t_in = time.perf_counter()
            if chunked:
                input_s = 0.0
            else:
                inputs = list(inputs)
                input_s = time.perf_counter() - t_in
            out_rows = 0
            t_proc = time.perf_counter()
            # The last output batch is held back until the checkpoint write started, so the
            # write overlaps Spark taking that batch (for a processor with one output batch per
            # micro-batch, all of its output) instead of starting after it; holding one batch
            # keeps memory bounded by the processor's own batch size.
            held = None
            seen: Dict[str, Any] = {"rows": 0, "max_event_ms": None}
            for ob in self._produce(ctx, inputs, seen, chunked):
                out_rows += ob.num_rows
                if held is not None:
                    yield held
                held = ob
            rows, max_event_ms = seen["rows"], seen["max_event_ms"]
            proc_s = time.perf_counter() - t_proc

            # Synchronous part of the checkpoint: the snapshot (isolated from later writes).
            # The first version of a checkpoint is full; every later one holds the changes
            # since the backend's base (the restored state, or the cached backend's snapshot
            # of the committed previous version).
            t_snap = time.perf_counter()
            snap = backend.snapshot(incremental=self.prev_version is not None)
            snapshot_id = int(snap.snapshot_id)
            snap_s = time.perf_counter() - t_snap
            # TTL background cleanup while the write runs (copy-on-write keeps the snapshot);
            # its removals go into the next version.
            if self.ttl_background_key_groups and not self.is_flush:
                backend.run_background_ttl_cleanup(self.ttl_background_key_groups)
            report = {
                "partition": partition_id, "attempt": self.attempt,
                "task_attempt": task_attempt, "writer": writer,
                "rows": rows, "output_rows": out_rows, "max_event_ms": max_event_ms,
                "state_entries": int(backend.num_entries()), "state_bytes": int(backend.state_bytes()),
                "load": source, "input_s": input_s, "load_s": load_s, "load_cpu_s": load_cpu[0],
                "standby_cpu_s": standby_cpu or 0.0,
                "process_s": proc_s, "snapshot_s": snap_s,
                "incremental": bool(snap.incremental), "snapshot_id": snapshot_id,
                "task_s": time.perf_counter() - t0, "pid": os.getpid(),
                "gc_frozen_objects": _GC_FROZEN_COUNT,
                "metrics": {k: int(v) for k, v in ctx.metrics.items()},
            }
        except BaseException:
            if restoring is not None:
                # A restore still running writes into the backend: it ends before the close.
                restoring.join()
            backend.close()
            raise
        # Asynchronous part: the data file, written in the background while the held output
        # goes to Spark and the task ends; the pending descriptor ("partition i of this attempt
        # is complete") once both the file and the output are done, so a task whose output was
        # cut short (a sink that does not evaluate everything) never reports.
        output_done: Future = Future()
        done = _checkpoint_in_background(store, snap, self.batch_id, writer, report,
                                         self.start_write or _start_snapshot_write, output_done)
        _put_cached(cache_key, _CachedState(
            self.batch_id, self.attempt, self.num_partitions, self.max_parallelism,
            self.backend_kind, self.key_type, backend, writer=writer, snapshot_id=snapshot_id,
            write=done, abandon_after_s=2 * self.commit_timeout_s,
            pristine=not (self.ttl_background_key_groups and not self.is_flush)),
            self.stale_copies)
        if self.handoff:
            handoff.claim(cache_key, self.batch_id)
        if self.standby and self.stale_copies and not self.is_flush:
            _start_standby(store, op_key, cache_key, self.batch_id,
                           (self.num_partitions, self.max_parallelism, self.backend_kind,
                            self.key_type), self.stale_copies, self.handoff)
        try:
            if held is not None:
                yield held
        except BaseException:
            output_done.set_result(False)
            raise
        output_done.set_result(True if output_taken is None else output_taken())
        if not os.environ.get("SPARK_REUSE_WORKER"):
            # A worker that is not reused exits with os._exit right after the task (pyspark
            # daemon), which would kill the write: finish it inside the task.
            done.result()

    def _produce(self, ctx: ProcessorContext, inputs, seen: Dict[str, Any], chunked: bool):
        """The processor's checked output batches for this task: ``flush``, or ``process_batch``
        on the input rows -- all at once from the list ``inputs``, or with ``chunked`` once per
        chunk of the iterator ``inputs`` -- and then ``on_watermark``; sets ``seen["rows"]``
        (input rows) and ``seen["max_event_ms"]`` (max event time in ms, or None).
        InvalidInputError for a null key and for output not matching the output schema."""
        if self.is_flush:
            for ob in self.processor.flush(ctx) or ():
                yield self._check_output(ob)
            return
        if chunked:
            batches = inputs
        elif inputs:
            table = pa.Table.from_batches(inputs).combine_chunks()
            batches = table.to_batches()[:1] if table.num_rows else []
        else:
            batches = []
        for batch in batches:
            seen["rows"] += batch.num_rows
            keys = batch.column(self.key_column)
            if keys.null_count:
                raise InvalidInputError(
                    f"operator {self.operator_name}: {keys.null_count} rows have a "
                    f"null key in column {self.key_column!r}; filter them before the "
                    "operator")
            if self.event_time_column is not None:
                m = _event_time_ms(batch.column(self.event_time_column))
                if m is not None and (seen["max_event_ms"] is None or m > seen["max_event_ms"]):
                    seen["max_event_ms"] = m
            for ob in self.processor.process_batch(batch, ctx) or ():
                yield self._check_output(ob)
        if self.watermark_ms is not None:
            for ob in self.processor.on_watermark(ctx, self.watermark_ms) or ():
                yield self._check_output(ob)

    def _check_output(self, ob) -> pa.RecordBatch:
        if isinstance(ob, pa.Table):
            ob = ob.combine_chunks()
            ob = ob.to_batches()[0] if ob.num_rows else pa.RecordBatch.from_pylist([], schema=ob.schema)
        if not isinstance(ob, pa.RecordBatch):
            raise InvalidInputError(
                f"operator {self.operator_name}: the processor must return pyarrow RecordBatches, "
                f"got {type(ob).__name__}")
        schema = self.output_schema
        if ob.schema.equals(schema):
            return ob
        missing = [n for n in schema.names if n not in ob.schema.names]
        if missing:
            raise InvalidInputError(
                f"operator {self.operator_name}: output batch lacks columns {missing} of the "
                f"processor's output_schema")
        try:
            t = pa.Table.from_batches([ob.select(schema.names)]).cast(schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
            raise InvalidInputError(
                f"operator {self.operator_name}: output batch {ob.schema} does not match "
                f"output_schema {schema}: {exc}") from exc
        return t.combine_chunks().to_batches()[0] if t.num_rows else \
            pa.RecordBatch.from_pylist([], schema=schema)


# ------------------------------------------------------------------------------------------
# Driver side
# ------------------------------------------------------------------------------------------

def _processor_config(processor) -> Any:
    """``processor.config()`` as canonical JSON data (None when the processor has no config)."""
    import json

    cfg = processor.config() if hasattr(processor, "config") else None
    try:
        return json.loads(json.dumps(cfg, sort_keys=True))
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"processor.config() must return JSON-able data: {exc}") from exc


def parquet_batch_sink(output_path: str) -> Callable:
    """A sink idempotent per batch id: overwrite ``<output_path>/batch_id=<N>/`` with Parquet.

    Spark's file commit protocol makes the directory appear complete or not at all; a replayed
    batch replaces it. Reading ``output_path`` with Spark yields a ``batch_id`` column through
    partition discovery.
    """
    root = output_path.rstrip("/")

    def sink(out_df, batch_id: int) -> None:
        out_df.write.mode("overwrite").parquet(f"{root}/batch_id={int(batch_id)}")

    return sink


@dataclass
class BatchReport:
    """What one committed version cost and produced (driver side).

    ``checkpoint_bytes``: bytes of the data files written for this version (the new runs);
    ``checkpoint_total_bytes``: bytes of every run the committed manifest lists (what a restore
    reads); ``incremental``: every partition wrote an incremental run; ``wait_seconds``: time
    the driver waited for background checkpoint writes after the sink's action; ``seconds``:
    from the start of the micro-batch to its commit; ``ttl_expired``: {TTL cleanup strategy:
    expired values, list elements and map entries removed} over all partitions since their
    previous snapshots (the manifest's ``ttl_expired``).

    Where the time went (seconds, ``time.perf_counter`` differences): ``phases``, on the driver:
    ``plan_s`` (manifest reads, checks, building the plan), ``action_s`` (the sink's action, i.e.
    the Spark job that runs the tasks), ``wait_s`` (= ``wait_seconds``), ``commit_s`` (manifest,
    pending cleanup, retention); ``partitions``, one dict per partition from its task:
    ``partition``, ``pid`` (worker process that ran the task), ``load`` ("empty", "cache",
    "handoff", "standby", "catch-up", "checkpoint"; "handoff": the worker Spark gave the task to
    handed it to the worker of its host that held the partition, which ran it on its cache hit,
    see ``StatefulOperator(handoff=)``; "standby": a cache hit on a copy that the worker brought
    up to date between its tasks, see ``StatefulOperator(standby=)``), ``load_s`` (cache take or
    restore, plus ``processor.open``; before the input is read), ``load_cpu_s`` (CPU seconds of
    the thread that restored or caught up; 0 for the other loads), ``standby_cpu_s`` (CPU
    seconds the standby spent on that copy, between the tasks; 0 for the other loads), ``input_s`` (receiving the routed input; 0 for a processor with ``chunked_input``,
    whose input arrives during ``process_s``), ``process_s``, ``snapshot_s`` (the synchronous
    snapshot), ``task_s`` (task start to snapshot), ``write_s`` (the background data file write),
    ``gc_frozen_objects`` (``gc.get_freeze_count()`` of the worker right after its last freeze, 0
    without one; see ``freeze_worker_gc``)."""

    operator_name: str
    version: int
    rows: int
    output_rows: int
    state_entries: int
    state_bytes: int
    checkpoint_bytes: int
    watermark_ms: Optional[int]
    seconds: float
    loads: Dict[str, int] = field(default_factory=dict)
    metrics: Dict[str, int] = field(default_factory=dict)
    final: bool = False
    checkpoint_total_bytes: int = 0
    incremental: bool = False
    wait_seconds: float = 0.0
    ttl_expired: Dict[str, int] = field(default_factory=dict)
    phases: Dict[str, float] = field(default_factory=dict)
    partitions: List[Dict[str, Any]] = field(default_factory=list)


#: Fields of a task's report copied into :attr:`BatchReport.partitions`.
_TASK_TIMINGS = ("partition", "pid", "load", "input_s", "load_s", "load_cpu_s", "standby_cpu_s",
                 "process_s", "snapshot_s", "task_s", "write_s", "gc_frozen_objects")


class StatefulOperator:
    """A keyed, checkpointed Python operator for Structured Streaming micro-batches.

    Args:
        name: operator name; its checkpoint lives in ``<checkpoint>/<name>`` (``[A-Za-z0-9_.-]``).
        processor: a :class:`statecore.spark.KeyedProcessor` (see its module for the contract).
        key_column: name of the key column (Spark string, bigint, int, binary, double, boolean,
            timestamp or timestamp_ntz; ``routing.backend_key_type``). Multi-column keys: a
            struct column of those (``F.struct(a, b).alias("k")``): Spark routes it as
            ``xxhash64(a, b)`` and the processor receives the key as a struct array (per
            record a tuple).
        checkpoint: directory or URI (``pyarrow.fs``) under which the operator checkpoints.
        sink: ``sink(out_df, batch_id)``, idempotent per batch id, running an action that
            evaluates every partition of ``out_df`` (each action re-runs the tasks, so one is
            cheapest; the last one's state wins); default :func:`parquet_batch_sink`
            (``output`` required).
        output: output directory for the default sink.
        parallelism: number of partitions (operator instances) ``n``; may differ between runs
            (rescaling: restores re-split key groups).
        max_parallelism: number of key groups (fixed for the life of the checkpoint).
        backend: ``"python"`` or ``"native"`` (``statecore.backends.create_backend``).
        event_time_column: timestamp (or int64 ms) column whose maximum over earlier micro-batches
            is the watermark handed to the processor; None = no watermark.
        retain_versions: committed versions kept (>= 2, so a replay of the latest batch can
            restore its predecessor); older versions' manifests and the runs no kept version
            references are deleted after each commit.
        max_runs: the store compacts a committed version whose key groups need more than this
            many runs (incremental chain length, int >= 1), so restores stay bounded; None =
            never.
        commit_timeout_s: seconds the driver waits, after the sink's action, for every
            partition's background checkpoint write to report (> 0); past it the micro-batch
            fails with StateError and Spark replays it.
        ttl_background_key_groups: key groups per partition and micro-batch that TTL background
            cleanup (``StateTtlConfig(cleanup_in_background=True)``) expires right after the
            snapshot (int >= 0; 0 = none).
        stale_copies: partitions of this operator a Python worker keeps besides the one it ran
            last (int >= 0, default 1). PySpark hands a partition to another worker about half
            the time; a worker holding an older committed copy of it catches up by applying the
            runs committed since (``load = "catch-up"``) instead of restoring the whole chain.
            Costs up to that many more partitions' state in memory per worker; 0 = none.
        standby: keep those copies current (default True): after its task a worker waits, in a
            background thread, for the driver's commit of that micro-batch and catches its
            copies of other partitions up to it, restoring the next partitions after its own
            while it holds fewer than ``stale_copies`` (standby replicas, as in Kafka Streams),
            so a partition that moves to this worker finds its state ready (``load =
            "standby"``) instead of catching up or restoring at the start of its task. Costs
            that catch-up CPU every micro-batch in every worker (between its tasks) rather than
            only when a partition moves, and the ``stale_copies`` copies' memory from the
            second micro-batch on rather than after the first moves; False catches up only on
            demand. No effect with ``stale_copies=0``. Measured on the 2-core bench machine
            (running count, 1M keys, 4M events, 8 micro-batches, interleaved A/B): 4.17-4.48 s
            with standby against 4.41-4.80 s without. With ``handoff`` it skips the partitions
            that another live worker of its host holds.
        handoff: a task that PySpark gives to a worker other than the one holding its
            partition's state is handed to that worker when it runs on the same host
            (:mod:`statecore.spark.handoff`): the task's worker relays its input and output
            over a Unix domain socket, and the holder runs it on its cached state (``load =
            "handoff"``), so a partition's state stays in one process instead of being copied
            into every worker that runs it. Falls back to loading locally whenever the holder
            is gone or does not hold exactly the previous version. Default False: on the
            2-core bench machine (running count, 1M keys, 4M and 8M events, interleaved A/B)
            it cut the Python workers' CPU by 0.45-0.6 s a run (no standby catch-ups) and
            Spark's commitOffsets, but the Spark job itself took 4-15% longer (the relay's
            copies and three Python threads sharing each worker's GIL in a swap), so wall
            time was no better. It halves the memory of state per host (no standby copies of
            partitions another worker holds).
        freeze_worker_gc: at its first task in a Python worker process, and at a later task
            when modules were imported since, move the objects the worker holds to the
            permanent generation (``gc.freeze``), so that the full
            ``gc.collect()`` PySpark's daemon runs after every task of a reused worker stops
            holding the GIL for tens of ms while the task's checkpoint write needs it (see
            ``_freeze_worker_gc``; the task reports ``gc_frozen_objects``). It affects the whole
            worker process, the user's other tasks in it included; False leaves the garbage
            collector alone.

    Raises InvalidInputError for bad arguments (at construction) and for inputs the contract
    forbids (at run time: null keys, a key column of another type, output not matching the
    schema); StateError when a finalized checkpoint receives more input or a partition did not
    report; CheckpointNotFoundError when the previous version needed by a micro-batch is gone.
    """

    def __init__(self, name: str, processor: KeyedProcessor, key_column: str, checkpoint: str, *,
                 sink: Optional[Callable] = None, output: Optional[str] = None,
                 parallelism: int = 2, max_parallelism: int = 128, backend: str = "python",
                 event_time_column: Optional[str] = None, retain_versions: int = 3,
                 max_runs: Optional[int] = 8, commit_timeout_s: float = 300.0,
                 ttl_background_key_groups: int = 0, stale_copies: int = 1,
                 freeze_worker_gc: bool = True, standby: bool = True, handoff: bool = False):
        import re

        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}", name):
            raise InvalidInputError(f"operator name must match [A-Za-z0-9_.-]+, got {name!r}")
        if not isinstance(processor, KeyedProcessor):
            for hook in ("open", "process_batch", "on_watermark", "flush", "output_schema"):
                if not hasattr(processor, hook):
                    raise InvalidInputError(f"processor lacks {hook!r} (see statecore.spark.KeyedProcessor)")
        if not isinstance(getattr(processor, "output_schema", None), pa.Schema):
            raise InvalidInputError("processor.output_schema must be a pyarrow.Schema")
        if not isinstance(key_column, str) or not key_column:
            raise InvalidInputError(f"key_column must be a column name, got {key_column!r}")
        self.max_parallelism = check_max_parallelism(max_parallelism)
        if isinstance(parallelism, bool) or not isinstance(parallelism, int) \
                or not 0 < parallelism <= self.max_parallelism:
            raise InvalidInputError(
                f"parallelism must be an int in [1, max_parallelism={self.max_parallelism}], "
                f"got {parallelism!r}")
        if backend not in ("python", "native"):
            raise InvalidInputError(f"backend must be 'python' or 'native', got {backend!r}")
        if isinstance(retain_versions, bool) or not isinstance(retain_versions, int) or retain_versions < 2:
            raise InvalidInputError(f"retain_versions must be an int >= 2, got {retain_versions!r}")
        if max_runs is not None and (isinstance(max_runs, bool) or not isinstance(max_runs, int)
                                     or max_runs < 1):
            raise InvalidInputError(f"max_runs must be an int >= 1 or None, got {max_runs!r}")
        if isinstance(commit_timeout_s, bool) or not isinstance(commit_timeout_s, (int, float)) \
                or not commit_timeout_s > 0:
            raise InvalidInputError(f"commit_timeout_s must be a number > 0, got {commit_timeout_s!r}")
        if isinstance(ttl_background_key_groups, bool) or not isinstance(ttl_background_key_groups, int) \
                or ttl_background_key_groups < 0:
            raise InvalidInputError(
                f"ttl_background_key_groups must be an int >= 0, got {ttl_background_key_groups!r}")
        if isinstance(stale_copies, bool) or not isinstance(stale_copies, int) or stale_copies < 0:
            raise InvalidInputError(f"stale_copies must be an int >= 0, got {stale_copies!r}")
        if not isinstance(freeze_worker_gc, bool):
            raise InvalidInputError(f"freeze_worker_gc must be a bool, got {freeze_worker_gc!r}")
        if not isinstance(standby, bool):
            raise InvalidInputError(f"standby must be a bool, got {standby!r}")
        if not isinstance(handoff, bool):
            raise InvalidInputError(f"handoff must be a bool, got {handoff!r}")
        if sink is None:
            if output is None:
                raise InvalidInputError("give either sink= or output= (directory of the default sink)")
            sink = parquet_batch_sink(output)
        self.name = name
        self.processor = processor
        self.key_column = key_column
        self.checkpoint = os.fspath(checkpoint)
        self.store_uri = self.checkpoint.rstrip("/") + "/" + name
        if "://" not in self.store_uri:
            self.store_uri = os.path.abspath(self.store_uri)
        self.sink = sink
        self.parallelism = parallelism
        self.backend = backend
        self.event_time_column = event_time_column
        self.retain_versions = retain_versions
        self.max_runs = max_runs
        self.commit_timeout_s = float(commit_timeout_s)
        self.ttl_background_key_groups = ttl_background_key_groups
        self.stale_copies = stale_copies
        self.freeze_worker_gc = freeze_worker_gc
        self.standby = standby
        self.handoff = handoff
        self.reports: List[BatchReport] = []
        self._store = None
        # Tests replace the worker-side write (a Callable like _start_snapshot_write).
        self._start_write: Optional[Callable] = None

    # -------------------------------------------------------------------------- public API

    @property
    def store(self):
        """The operator's :class:`statecore.checkpoint.CheckpointStore` (one per operator object:
        commit, compaction and retention of a store are serialized by its lock)."""
        from statecore.checkpoint import CheckpointStore

        if self._store is None or self._store.max_runs != self.max_runs:
            self._store = CheckpointStore(self.store_uri, max_runs=self.max_runs)
        return self._store

    def latest_version(self) -> Optional[int]:
        """Highest committed version (micro-batch id, or the flush version), or None."""
        return self.store.latest_version()

    def is_finalized(self) -> bool:
        """True once the end-of-input flush has been committed."""
        store = self.store
        v = store.latest_version()
        return v is not None and bool(store.metadata(v).get("final"))

    def __call__(self, df, batch_id: int) -> BatchReport:
        """``foreachBatch`` entry point: process micro-batch ``batch_id`` of ``df``."""
        return self.process(df, int(batch_id))

    def process(self, df, batch_id: int) -> BatchReport:
        """Run micro-batch ``batch_id`` on DataFrame ``df`` and commit version ``batch_id``
        (:meth:`start` then :meth:`PendingBatch.commit`). See the module docstring for the
        protocol; errors: class docstring."""
        return self.start(df, batch_id).commit()

    def start(self, df, batch_id: int) -> "PendingBatch":
        """Run micro-batch ``batch_id`` on ``df`` up to and including the sink's action, without
        committing: returns a :class:`PendingBatch` whose ``commit()`` waits for the background
        checkpoint writes and commits version ``batch_id``. Several operators in one
        ``foreachBatch`` start each and then commit all (:func:`commit_batches`), so the writes
        of one overlap the actions of the others. Errors: class docstring."""
        if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 0:
            raise InvalidInputError(f"batch_id must be an int >= 0, got {batch_id!r}")
        store = self.store
        latest = store.latest_version()
        if latest is not None and batch_id >= latest and store.metadata(latest).get("final"):
            raise StateError(
                f"operator {self.name}: checkpoint {self.store_uri} was finalized by the "
                f"end-of-input flush at version {latest}; it cannot take micro-batch {batch_id}")
        field_names = df.schema.fieldNames()
        if self.key_column not in field_names:
            raise InvalidInputError(
                f"operator {self.name}: key column {self.key_column!r} not in {field_names}")
        if self.event_time_column is not None and self.event_time_column not in field_names:
            raise InvalidInputError(
                f"operator {self.name}: event-time column {self.event_time_column!r} not in "
                f"{field_names}")
        key_type = backend_key_type(df.schema[self.key_column].dataType)
        return self._launch(df.sparkSession, df, batch_id, key_type, is_flush=False)

    def flush(self, spark) -> Optional[BatchReport]:
        """End of input, exactly once: run version ``latest + 1`` in which every partition calls
        ``processor.flush`` (no input rows, no watermark), write its output through the sink
        under that id and commit it with ``"final": true``. Returns None without doing anything
        when the checkpoint is empty or already finalized (so a rerun of a finished job is a
        no-op). A flush killed midway is redone by the next call."""
        store = self.store
        latest = store.latest_version()
        if latest is None:
            return None
        meta = store.metadata(latest)
        if meta.get("final"):
            return None
        return self._launch(spark, None, latest + 1, meta["key_type"], is_flush=True).commit()

    # ------------------------------------------------------------------------------ internals

    def _control_rows(self, spark, n: int):
        """The DataFrame of the flush's ``n`` control rows (operator index ``i``, a null key of
        NullType), from one partition: they need no parallelism, and each source partition is
        one more task in the shuffle's map stage."""
        from pyspark.sql import functions as F

        return spark.range(0, n, 1, 1).select(
            F.lit(None).alias(self.key_column),
            F.col("id").cast("int").alias(OPERATOR_INDEX_COLUMN))

    def _launch(self, spark, df, batch_id: int, key_type: str, *,
                is_flush: bool) -> "PendingBatch":
        from pyspark.sql.pandas.types import from_arrow_schema

        t0 = time.perf_counter()
        store = self.store
        n, mp = self.parallelism, self.max_parallelism
        prev = batch_id - 1 if batch_id > 0 else None
        prev_meta: Dict[str, Any] = {}
        processor_config = _processor_config(self.processor)
        if prev is not None:
            if prev in store.versions():
                prev_meta = store.metadata(prev)
            elif store.versions():
                raise CheckpointNotFoundError(
                    f"operator {self.name}: micro-batch {batch_id} needs version {prev} of "
                    f"{self.store_uri}, which is not committed (have {store.versions()[-5:]}); "
                    "the Spark checkpoint and the statecore checkpoint do not belong together")
            else:
                # Starting empty here would silently lose the state of batches 0..prev.
                raise CheckpointNotFoundError(
                    f"operator {self.name}: micro-batch {batch_id} needs version {prev} but "
                    f"{self.store_uri} holds no committed version; the Spark checkpoint is "
                    "older than the statecore checkpoint (use a fresh Spark checkpoint too)")
        if prev_meta:
            if int(prev_meta["max_parallelism"]) != mp:
                raise InvalidInputError(
                    f"operator {self.name}: max_parallelism is fixed for the life of a checkpoint "
                    f"({prev_meta['max_parallelism']}), got {mp}")
            if prev_meta.get("key_type") not in (None, key_type):
                raise InvalidInputError(
                    f"operator {self.name}: key column type {key_type} differs from the "
                    f"checkpoint's {prev_meta['key_type']}")
            if "processor_config" in prev_meta and prev_meta["processor_config"] != processor_config:
                raise InvalidInputError(
                    f"operator {self.name}: the processor's configuration "
                    f"{processor_config} differs from the one the checkpoint was built with "
                    f"{prev_meta['processor_config']}; use a new checkpoint")
        watermark = None if is_flush else prev_meta.get("watermark_ms")
        attempt = uuid.uuid4().hex[:12]

        spec = _TaskSpec(
            operator_name=self.name, store_uri=self.store_uri, processor=self.processor,
            backend_kind=self.backend, key_type=key_type, key_column=self.key_column,
            event_time_column=self.event_time_column, max_parallelism=mp, num_partitions=n,
            batch_id=batch_id, prev_version=prev, prev_attempt=prev_meta.get("attempt"),
            attempt=attempt, watermark_ms=watermark, is_flush=is_flush,
            output_schema=self.processor.output_schema,
            prev_writers=(frozenset(prev_meta["writers"]) if "writers" in prev_meta else None),
            start_write=self._start_write, commit_timeout_s=self.commit_timeout_s,
            ttl_background_key_groups=self.ttl_background_key_groups,
            stale_copies=self.stale_copies, freeze_worker_gc=self.freeze_worker_gc,
            standby=self.standby, handoff=self.handoff)

        if df is None:
            # The flush has no input: its control rows, one per partition, each carrying its
            # index, make the n partitions.
            from pyspark.sql import functions as F

            routed = (self._control_rows(spark, n)
                      .repartitionById(n, F.col(OPERATOR_INDEX_COLUMN))
                      .drop(OPERATOR_INDEX_COLUMN))
        else:
            # Spark runs the Python function of every partition of the shuffle, empty ones
            # included, so the data needs no rows added to make each partition run; the index
            # is computed inside the partitioning expression (a projection adding it first was
            # one more Dataset, i.e. one more analysis on the driver: ~15 ms a micro-batch) and
            # never shipped: the task knows it from its partition id. Unioning in a control row
            # per partition, as this did up to stop 31, cost 14-15% of the bench job's time
            # (interleaved A/B, running count, 1M keys, 4M events).
            routed = df.repartitionById(n, operator_index_of(self.key_column, n, mp))
        out = routed.mapInArrow(spec, from_arrow_schema(self.processor.output_schema))
        t_action = time.perf_counter()
        self.sink(out, batch_id)
        pending = PendingBatch(self, batch_id, attempt, n, key_type, is_flush, prev_meta,
                               watermark, processor_config, t0)
        pending.phases = {"plan_s": t_action - t0, "action_s": time.perf_counter() - t_action}
        return pending


#: PendingBatch.wait's polling: every _WAIT_POLL_S seconds for the first _WAIT_FINE_S, then
#: growing 1.25x a poll to 0.2 s.
_WAIT_POLL_S = 0.002
_WAIT_FINE_S = 0.25


class PendingBatch:
    """A micro-batch of one operator whose sink action ran but whose version is not committed
    yet (from :meth:`StatefulOperator.start`). The tasks' checkpoint writes may still be in
    flight; :meth:`wait` blocks until every partition of this attempt reported and
    :meth:`commit` then commits the version. Not thread-safe; commit at most once."""

    def __init__(self, op: StatefulOperator, batch_id: int, attempt: str, num_partitions: int,
                 key_type: str, is_flush: bool, prev_meta: Dict[str, Any], watermark: Optional[int],
                 processor_config: Any, t0: float):
        self.op = op
        self.batch_id = batch_id
        self.attempt = attempt
        self.num_partitions = num_partitions
        self.key_type = key_type
        self.is_flush = is_flush
        self.prev_meta = prev_meta
        self.watermark = watermark
        self.processor_config = processor_config
        self.t0 = t0
        self.report: Optional[BatchReport] = None
        self._parts: Optional[List[dict]] = None
        self._wait_s = 0.0
        #: driver phase timings so far (see BatchReport.phases); set by StatefulOperator._launch
        self.phases: Dict[str, float] = {}

    def wait(self, timeout_s: Optional[float] = None) -> List[dict]:
        """Wait until every partition ``0..n-1`` of this attempt recorded its pending descriptor
        and return their reports (with ``descriptor``), by partition. Polls the store's pending
        descriptors every 2 ms for the first 250 ms, then at steps growing by 1.25x to at most
        200 ms: the writes usually end within tens of ms of the action, and the time between
        the last write's end and the poll that sees it adds to every micro-batch (growing from
        5 ms, a write that ended 20 ms after the action was seen ~9 ms late). A poll lists one
        directory of the local checkpoint (well under a millisecond).
        ``timeout_s``: default the operator's
        ``commit_timeout_s``. Raises StateError when a partition's background write reported
        an error (at once) or when some partition did not report within the timeout (its worker
        died, or the sink's action did not evaluate every partition): the micro-batch then
        fails and Spark replays it from the previous version."""
        if self._parts is not None:
            return self._parts
        op = self.op
        n = self.num_partitions
        timeout = op.commit_timeout_s if timeout_s is None else float(timeout_s)
        t_start = time.perf_counter()
        deadline = t_start + timeout
        fine_until = t_start + _WAIT_FINE_S
        delay = _WAIT_POLL_S
        while True:
            by_part: Dict[int, dict] = {}
            for d in op.store.pending(self.batch_id):
                r = d.get("spark_report")
                # Earlier attempts of this batch id (other writers, maybe another n) are ignored.
                if not isinstance(r, dict) or r.get("attempt") != self.attempt:
                    continue
                if r.get("error"):
                    raise StateError(
                        f"operator {op.name}: micro-batch {self.batch_id}: the checkpoint write "
                        f"of partition {r.get('partition')} ({d.get('writer')}) failed: "
                        f"{r['error']}; the micro-batch is not committed (Spark replays it "
                        "from the previous version)")
                r = dict(r, descriptor={k: v for k, v in d.items() if k != "spark_report"})
                # Several Spark task attempts of one partition each write their own file; all
                # hold the same state (deterministic processor): the latest attempt wins.
                have = by_part.get(r["partition"])
                if have is None or r.get("task_attempt", 0) > have.get("task_attempt", 0):
                    by_part[r["partition"]] = r
            if sorted(by_part) == list(range(n)):
                break
            now = time.perf_counter()
            if now >= deadline:
                missing = sorted(set(range(n)) - set(by_part))
                raise StateError(
                    f"operator {op.name}: micro-batch {self.batch_id}: partitions {missing} did "
                    f"not report their checkpoint within {timeout:g} s after the sink's action "
                    f"(reported: {sorted(by_part)}); either their worker died before the "
                    "background write finished or the sink's action did not evaluate every "
                    "partition of the DataFrame it is given (use a write, not a limit). The "
                    "micro-batch is not committed; Spark replays it from the previous version")
            time.sleep(min(delay, max(deadline - now, 0.0)))
            if now >= fine_until:
                delay = min(delay * 1.25, 0.2)
        self._wait_s = time.perf_counter() - t_start
        self._parts = [by_part[i] for i in range(n)]
        return self._parts

    def commit(self) -> BatchReport:
        """Wait (:meth:`wait`) and commit version ``batch_id``: manifest with the watermark for
        the next micro-batch, the attempt id, the committed writers (the worker caches' key),
        the processor config and counters; then clear the pending descriptors and apply
        retention. Returns the :class:`BatchReport`; a second call returns the same one."""
        if self.report is not None:
            return self.report
        op = self.op
        parts = self.wait()
        t_commit = time.perf_counter()
        store = op.store
        n, mp = self.num_partitions, op.max_parallelism
        batch_max = [r["max_event_ms"] for r in parts if r["max_event_ms"] is not None]
        new_wm = self.prev_meta.get("watermark_ms")
        if batch_max:
            new_wm = max(batch_max) if new_wm is None else max(new_wm, max(batch_max))
        metrics: Dict[str, int] = {}
        for r in parts:
            for k, v in r["metrics"].items():
                metrics[k] = metrics.get(k, 0) + v
        loads: Dict[str, int] = {}
        for r in parts:
            loads[r["load"]] = loads.get(r["load"], 0) + 1
        rows = sum(r["rows"] for r in parts)
        out_rows = sum(r["output_rows"] for r in parts)
        entries = sum(r["state_entries"] for r in parts)
        sbytes = sum(r["state_bytes"] for r in parts)
        ckpt_bytes = sum(r["descriptor"]["size"] for r in parts)
        incremental = all(r["descriptor"].get("kind") == "incremental" for r in parts)
        metadata = {
            "operator": op.name, "batch_id": self.batch_id, "attempt": self.attempt,
            "writers": [r["descriptor"]["writer"] for r in parts],
            "num_partitions": n, "max_parallelism": mp, "key_type": self.key_type,
            "key_column": op.key_column, "backend": op.backend,
            "processor": type(op.processor).__qualname__,
            "processor_config": self.processor_config,
            "input_watermark_ms": self.watermark, "watermark_ms": new_wm,
            "rows": rows, "output_rows": out_rows, "state_entries": entries,
            "state_bytes": sbytes, "checkpoint_bytes": ckpt_bytes, "metrics": metrics,
            "loads": loads, "final": self.is_flush,
        }
        manifest = store.commit(self.batch_id, [r["descriptor"] for r in parts], metadata)
        store.clear_pending(self.batch_id)
        store.retain(op.retain_versions)
        phases = dict(self.phases, wait_s=self._wait_s, commit_s=time.perf_counter() - t_commit)
        self.report = BatchReport(
            operator_name=op.name, version=self.batch_id, rows=rows, output_rows=out_rows,
            state_entries=entries, state_bytes=sbytes, checkpoint_bytes=ckpt_bytes,
            watermark_ms=new_wm, seconds=time.perf_counter() - self.t0, loads=loads,
            metrics=metrics, final=self.is_flush,
            checkpoint_total_bytes=sum(int(f["size"]) for f in manifest["files"]),
            incremental=incremental, wait_seconds=self._wait_s,
            ttl_expired=dict(manifest.get("ttl_expired", {})), phases=phases,
            partitions=[{k: r[k] for k in _TASK_TIMINGS if k in r} for r in parts])
        op.reports.append(self.report)
        return self.report


def commit_batches(pending: List[PendingBatch]) -> List[BatchReport]:
    """Commit several operators' micro-batches of one ``foreachBatch`` call: first wait until
    every one's checkpoint writes reported (so none is committed when another's failed), then
    commit them in order. Returns their reports, in order. Errors: :meth:`PendingBatch.wait`,
    ``CheckpointStore.commit``. A crash between two commits leaves some operators one version
    ahead; Spark replays the batch and each operator restores ``batch_id - 1`` again."""
    for p in pending:
        p.wait()
    return [p.commit() for p in pending]

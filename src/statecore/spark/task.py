"""The task side of :class:`statecore.spark.StatefulOperator`: the ``mapInArrow`` function that
runs one partition (operator index) of one micro-batch in a PySpark Python worker.

A task (:class:`TaskSpec`, pickled once per micro-batch by the driver) of Spark partition ``i``:

1. loads the state at version ``batch_id - 1`` of its key-group range (Flink's
   ``KeyGroupRangeAssignment.computeKeyGroupRangeForOperatorIndex(maxP, n, i)``): from this
   worker's cache when the worker holds exactly that committed version
   (:mod:`statecore.spark.worker_cache`), from the worker of this host that holds it
   (``handoff``, :mod:`statecore.spark.handoff`), by catching up an older committed copy, or
   by restoring it from the checkpoint store;
2. runs the processor on the routed input, its output streaming to Spark;
3. takes the synchronous snapshot and starts the asynchronous checkpoint write
   (:mod:`statecore.spark.checkpoint_write`), then returns its last output batch.

Exactly-once contract kept here (task side): a task only *pre-commits*. It writes its own data
file and pending descriptor under a writer name unique to its Spark task attempt and never
commits a version; the driver commits version ``batch_id`` once the sink succeeded and every
partition reported. A task builds only on committed state: a replayed micro-batch (a failed
attempt, a crash before the commit) reloads the committed version ``batch_id - 1``, because a
cached or handed-off backend is used only when it holds exactly that committed version, and an
incremental snapshot's base moves only to a committed checkpoint (Flink's
``notifyCheckpointComplete`` rule).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional

import pyarrow as pa
import pyarrow.compute as pc

from statecore.errors import InvalidInputError, StateError
from statecore.key_groups import key_group_range_for_operator
from statecore.operator_state import UNION_LIST
from statecore.spark import handoff
from statecore.spark.checkpoint_write import checkpoint_in_background, start_snapshot_write
from statecore.spark.processor import KeyedProcessor, ProcessorContext
from statecore.spark.routing import KEY_GROUP_COLUMN, OPERATOR_INDEX_COLUMN
from statecore.spark.worker_cache import (
    CachedState,
    holds,
    note_task_started,
    partition_backend,
    put_cached,
    start_standby,
    take_after_standby,
    take_stale,
)
from statecore.spark.worker_gc import freeze_worker_gc, frozen_object_count
from statecore.timers import epoch_ms

__all__ = ["TaskSpec"]

# Routing columns a task drops from its input, should the routed DataFrame carry them.
_INTERNAL = (KEY_GROUP_COLUMN, OPERATOR_INDEX_COLUMN)


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


def _union_lists_as_restored(backend, store, version: int, partition_id: int,
                             num_partitions: int) -> None:
    """Give a backend kept from the previous micro-batch (cache, standby, handoff) the
    operator state a restore of ``version`` would: it holds its own union lists only, a
    restore every partition's (Flink restores union list state whole). Reads the version only
    when the backend holds union list state (every partition runs the same processor)."""
    if not backend.operator_state.has_kind(UNION_LIST):
        return
    with store.open(version) as reader:
        backend.operator_state.restore(reader, partition_id, num_partitions)


def _spark_partition_id() -> int:
    """The running Spark task's partition id (StateError outside a Spark task)."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:
        raise StateError("the operator's task runs only inside a Spark task")
    return int(tc.partitionId())


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
class TaskSpec:
    """One micro-batch's task of the operator: everything a task needs, built by the driver
    (:meth:`statecore.spark.StatefulOperator.start`) and pickled once per micro-batch as the
    ``mapInArrow`` function. Calling it with the routed input of Spark partition ``i`` (an
    iterator of ``pyarrow.RecordBatch``) runs partition ``i`` and yields its output batches
    (``output_schema``).

    Fields: the operator's settings (see :class:`statecore.spark.StatefulOperator`) plus the
    micro-batch's: ``batch_id`` (the version the task writes: the Spark batch id plus the
    run's offset, :mod:`statecore.spark.versions`), ``prev_version`` (``batch_id - 1``, None
    for the first), ``prev_attempt`` and ``prev_writers`` (the attempt id and the
    data files the driver committed for ``prev_version``: a cached backend serves only when it
    matches them), ``prev_commit_id`` (that version's manifest ``commit_id``, None when not
    recorded: a cached backend's incremental base commit), ``attempt`` (this attempt's id,
    part of the writer name ``p<i>-<attempt>-t<task attempt>``), ``watermark_ms`` (ms, or None),
    ``processing_time_ms`` (the micro-batch's processing time, ms; None only in specs built
    without one, which then skip ``on_processing_time``), ``is_flush`` (a flush: the input is
    one control row per partition), ``flush_final`` (with ``is_flush``: the end-of-input flush,
    which calls ``processor.flush``; False: a non-final flush, which calls ``on_watermark`` and
    ``on_processing_time`` as a micro-batch without rows does), ``broadcast_ipc`` (the
    micro-batch's broadcast table as one Arrow IPC stream, or None: every partition hands it to
    ``processor.process_broadcast`` before its input), ``start_write`` (replaces
    :func:`start_snapshot_write`; tests), ``heartbeat_interval_s`` (seconds between the
    heartbeats of the background write, which tell the driver it is alive; None = none),
    ``state_store``, ``state_namespace`` and ``state_store_timeout_s`` (keyed state in an
    external store, the store's URL, namespace and the bound of every wait on it: the task
    runs :func:`statecore.spark.external_task.run_external` instead; None = in-memory state
    checkpointed to ``store_uri``), ``state_store_cache_entries`` and
    ``state_store_ttl_sweep_key_groups`` (the store backend's ``cache_entries`` and
    ``ttl_sweep_key_groups``), ``first_watermark`` (the first
    version with a watermark: an external task reads its whole key-group range through before
    the watermark re-stamps what was written without one), ``memory_budget`` (bytes, or None:
    each task's native backend is a tiered backend with that budget attached to the
    operator's committed versions in ``store_uri``, docs/tiered.md; the operator then sets
    ``stale_copies`` to 0, so a task's backend is its own cached one or a fresh attach),
    ``block_target_bytes`` and ``compression`` (bytes and a block codec, or None: the store's
    defaults; the block size and codec of the runs the task writes).

    Errors raised in the task (which fails it, and with it the micro-batch): StateError outside
    a Spark task or for a partition id outside ``[0, num_partitions)``; InvalidInputError for a
    null key, an event-time column of another type, output not matching ``output_schema``;
    whatever restoring, the processor or the snapshot raise."""

    operator_name: str
    store_uri: str
    processor: KeyedProcessor
    backend_kind: str
    key_type: str
    key_column: Any  # a column name, or a tuple of names (multi-column key)
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
    prev_commit_id: Optional[str] = None
    start_write: Optional[Callable] = None
    commit_timeout_s: float = 300.0
    ttl_background_key_groups: int = 0
    stale_copies: int = 1
    freeze_worker_gc: bool = True
    standby: bool = True
    handoff: bool = False
    processing_time_ms: Optional[int] = None
    flush_final: bool = True
    heartbeat_interval_s: Optional[float] = None
    broadcast_ipc: Optional[bytes] = None
    state_store: Optional[str] = None
    state_namespace: Optional[str] = None
    state_store_timeout_s: float = 10.0
    state_store_cache_entries: Optional[int] = 2_000_000
    state_store_ttl_sweep_key_groups: int = 16
    first_watermark: bool = False
    memory_budget: Optional[int] = None
    block_target_bytes: Optional[int] = None
    compression: Optional[str] = None

    @property
    def backend_label(self) -> str:
        """The backend kind as the worker cache matches it: ``backend_kind``, or for the
        tiered mode (``memory_budget``) ``"<kind>/tiered:<budget bytes>"``, so a cached backend
        of the other mode (or another budget) never serves."""
        if self.memory_budget is None:
            return self.backend_kind
        return f"{self.backend_kind}/tiered:{self.memory_budget}"

    @property
    def key_columns(self) -> tuple:
        """The key column names (one for a single-column key)."""
        kc = self.key_column
        return (kc,) if isinstance(kc, str) else tuple(kc)

    def _key_nulls(self, batch) -> tuple:
        """(rows whose key is null, the boolean mask of the others or None when there are
        none): a multi-column key is null when any of its columns is."""
        cols = [batch.column(c) for c in self.key_columns]
        if not any(c.null_count for c in cols):
            return 0, None
        valid = cols[0].is_valid()
        for c in cols[1:]:
            valid = pc.and_(valid, c.is_valid())
        return batch.num_rows - pc.sum(valid).as_py(), valid

    def _key_label(self) -> str:
        kc = self.key_columns
        return f"column {kc[0]!r}" if len(kc) == 1 else f"columns {list(kc)!r}"

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The ``mapInArrow`` function: run this Spark task's partition on ``batches``."""
        t0 = time.perf_counter()
        if self.freeze_worker_gc:
            freeze_worker_gc()
        # repartitionById(n, op) puts the rows of operator index i into Spark partition i, so
        # the task's partition id is its operator index (the index column is not shipped).
        partition_id = _spark_partition_id()
        if not 0 <= partition_id < self.num_partitions:
            raise StateError(
                f"operator {self.operator_name}: Spark partition {partition_id} is not an "
                f"operator index in [0, {self.num_partitions})")
        if self.state_store is not None:
            from statecore.spark.external_task import run_external

            yield from run_external(self, partition_id, self._data_chunks(batches, partition_id),
                                    t0, _task_attempt_number(), self._produce)
            return
        if self.handoff and self.prev_version is not None:
            relayed = self._hand_off(partition_id, batches)
            if relayed is not None:
                yield from relayed
                return
        yield from self.run(partition_id, batches, t0)

    def _cache_key(self, partition_id: int, store=None) -> tuple:
        """The worker cache's key of ``partition_id`` (``store``: this operator's
        CheckpointStore, when the caller has one)."""
        from statecore.checkpoint import CheckpointStore

        uri = (store if store is not None else CheckpointStore(self.store_uri)).uri
        return (uri, self.operator_name, partition_id)

    def _want(self) -> tuple:
        return (self.prev_version, self.prev_attempt, self.num_partitions, self.max_parallelism,
                self.backend_label, self.key_type)

    def _hand_off(self, partition_id: int, batches: Iterator[pa.RecordBatch]):
        """The output of this task run by the worker of this host that holds the partition's
        state at the previous version (:mod:`statecore.spark.handoff`), or None when this
        worker holds it itself (or a standby here is bringing it up) or no other worker takes
        the task."""
        cache_key = self._cache_key(partition_id)
        if holds(cache_key, self._want()):
            return None
        return handoff.relay(self, cache_key, partition_id, _task_attempt_number(),
                             lambda: self._data_chunks(batches, partition_id))

    def take_for_handoff(self, partition_id: int) -> Optional[CachedState]:
        """In the holder: this worker's cached state of the partition at exactly the previous
        version, taken out of the cache for the handed-off task, or None."""
        return take_after_standby(self._cache_key(partition_id), self._want(),
                                  self.prev_writers, self.commit_timeout_s,
                                  self.prev_commit_id)

    def _data_chunks(self, batches: Iterator[pa.RecordBatch], partition_id: int):
        """The routed input's data rows, chunk by chunk as Spark delivers them (internal
        columns removed). InvalidInputError as soon as a null key arrives. The flush's input is
        its control row (a null key) alone: StateError unless exactly one came."""
        allowed = 1 if self.is_flush else 0  # the flush's one control row
        nulls = 0
        for b in batches:
            if b.num_rows == 0:
                continue
            c, valid = self._key_nulls(b)
            if c:
                nulls += c
                if nulls > allowed:
                    raise InvalidInputError(
                        f"operator {self.operator_name}: Spark partition {partition_id} received "
                        f"{nulls - allowed} rows with a null key in {self._key_label()}; "
                        "filter null keys before the operator")
                b = b.filter(valid)
            if b.num_rows:
                if any(n in _INTERNAL for n in b.schema.names):
                    b = b.select([n for n in b.schema.names if n not in _INTERNAL])
                yield b
        if nulls != allowed:
            raise StateError(
                f"operator {self.operator_name}: Spark partition {partition_id} received no "
                "control row; was the routed DataFrame repartitioned again?")

    def run(self, partition_id: int, batches: Iterator[pa.RecordBatch],
            t0: Optional[float] = None, *, hit: Optional[CachedState] = None,
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
        kg_range = key_group_range_for_operator(self.max_parallelism, self.num_partitions,
                                                partition_id)
        store = CheckpointStore(self.store_uri, **{
            k: v for k, v in (("block_target_bytes", self.block_target_bytes),
                              ("compression", self.compression)) if v is not None})
        cache_key = self._cache_key(partition_id, store)
        backend = None
        source = "empty"
        op_key = cache_key[:2]
        note_task_started(op_key)
        standby_cpu = None
        handed_off = hit is not None
        if self.prev_version is not None:
            if hit is None:
                hit = take_after_standby(cache_key, self._want(), self.prev_writers,
                                         self.commit_timeout_s, self.prev_commit_id)
            if hit is None:
                source = "checkpoint"
            else:
                backend, standby_cpu = hit.backend, hit.standby_cpu_s
                source = "handoff" if handed_off else \
                    "cache" if standby_cpu is None else "standby"
        changes = None
        if backend is None and self.prev_version is not None and self.stale_copies:
            stale = take_stale(cache_key, store, self.prev_version,
                               (self.num_partitions, self.max_parallelism, self.backend_label,
                                self.key_type), kg_range)
            if stale is not None:
                backend, changes = stale
                source = "catch-up"
        if backend is None:
            # The tiered mode attaches the operator's committed versions (docs/tiered.md).
            tiered = ({} if self.memory_budget is None
                      else {"memory_budget": self.memory_budget, "checkpoint": store})
            backend = partition_backend(self.backend_kind, self.key_type, self.max_parallelism,
                                        self.num_partitions, partition_id, **tiered)
        ctx = ProcessorContext(
            backend=backend, operator_name=self.operator_name, batch_id=self.batch_id,
            partition_id=partition_id, num_partitions=self.num_partitions,
            max_parallelism=self.max_parallelism, key_group_range=kg_range,
            key_column=(self.key_column if isinstance(self.key_column, str)
                        else list(self.key_column)),
            watermark_ms=self.watermark_ms, is_flush=self.is_flush and self.flush_final,
            processing_time_ms=self.processing_time_ms)
        writer = f"p{partition_id}-{self.attempt}-t{task_attempt}"
        restoring = None
        load_cpu = [0.0]  # CPU seconds of the load's thread (load_s is its wall time)
        restore_stats: dict = {}  # bytes the load read from the checkpoint
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
                            # Operator state is redistributed from all the version's writers
                            # when the parallelism changed (statecore.operator_state).
                            store.restore(backend, self.prev_version, stats=restore_stats,
                                          operator_index=partition_id,
                                          parallelism=self.num_partitions)
                            return
                        try:
                            backend.apply_changes(changes)
                        finally:
                            changes.release()
                            restore_stats["bytes_read"] = changes.bytes_read
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
            elif self.prev_version is not None:
                _union_lists_as_restored(backend, store, self.prev_version, partition_id,
                                         self.num_partitions)
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
                "state_entries": int(backend.num_entries()),
                "state_bytes": int(backend.state_bytes()),
                "load": source, "input_s": input_s, "load_s": load_s, "load_cpu_s": load_cpu[0],
                "restore_bytes": int(restore_stats.get("bytes_read", 0)),
                "standby_cpu_s": standby_cpu or 0.0,
                "process_s": proc_s, "snapshot_s": snap_s,
                "incremental": bool(snap.incremental), "snapshot_id": snapshot_id,
                "task_s": time.perf_counter() - t0, "pid": os.getpid(),
                "gc_frozen_objects": frozen_object_count(),
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
        done = checkpoint_in_background(store, snap, self.batch_id, writer, report,
                                        self.start_write or start_snapshot_write, output_done,
                                        self.heartbeat_interval_s, self.commit_timeout_s)
        put_cached(cache_key, CachedState(
            self.batch_id, self.attempt, self.num_partitions, self.max_parallelism,
            self.backend_label, self.key_type, backend, writer=writer, snapshot_id=snapshot_id,
            write=done, abandon_after_s=2 * self.commit_timeout_s,
            pristine=not (self.ttl_background_key_groups and not self.is_flush)),
            self.stale_copies)
        if self.handoff:
            handoff.claim(cache_key, self.batch_id)
        if self.standby and self.stale_copies and not self.is_flush:
            start_standby(store, op_key, cache_key, self.batch_id,
                          (self.num_partitions, self.max_parallelism, self.backend_label,
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
        chunk of the iterator ``inputs`` -- and then ``on_watermark`` and
        ``on_processing_time``; sets ``seen["rows"]``
        (input rows) and ``seen["max_event_ms"]`` (max event time in ms, or None).
        InvalidInputError for a null key and for output not matching the output schema.

        The broadcast table, when the micro-batch has one, goes to ``process_broadcast``
        first, so the rows (or the flush) see the broadcast state it leaves."""
        if self.broadcast_ipc is not None:
            table = pa.ipc.open_stream(self.broadcast_ipc).read_all()
            for ob in self.processor.process_broadcast(table, ctx) or ():
                yield self._check_output(ob)
        if self.is_flush and self.flush_final:
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
            nulls, _ = self._key_nulls(batch)
            if nulls:
                raise InvalidInputError(
                    f"operator {self.operator_name}: {nulls} rows have a "
                    f"null key in {self._key_label()}; filter them before the operator")
            if self.event_time_column is not None:
                m = _event_time_ms(batch.column(self.event_time_column))
                if m is not None and (seen["max_event_ms"] is None or m > seen["max_event_ms"]):
                    seen["max_event_ms"] = m
            for ob in self.processor.process_batch(batch, ctx) or ():
                yield self._check_output(ob)
        if self.watermark_ms is not None:
            for ob in self.processor.on_watermark(ctx, self.watermark_ms) or ():
                yield self._check_output(ob)
        hook = getattr(self.processor, "on_processing_time", None)
        if self.processing_time_ms is not None and hook is not None:
            for ob in hook(ctx, self.processing_time_ms) or ():
                yield self._check_output(ob)

    def _check_output(self, ob) -> pa.RecordBatch:
        if isinstance(ob, pa.Table):
            ob = ob.combine_chunks()
            ob = (ob.to_batches()[0] if ob.num_rows
                  else pa.RecordBatch.from_pylist([], schema=ob.schema))
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


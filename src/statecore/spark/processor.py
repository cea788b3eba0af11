"""The user's side of the statecore Spark operator: :class:`KeyedProcessor` and
:class:`ProcessorContext`.

A processor is the stateful logic of one keyed operator. The operator
(:class:`statecore.spark.StatefulOperator`) routes every row to the partition that owns its key
group, restores that partition's key-group range at version ``batch_id - 1`` into a keyed state
backend, and then, once per partition and micro-batch, calls on the processor::

    open(ctx)                              # declare state: ctx.backend.get_state(descriptor)
    process_broadcast(table, ctx) -> batches  # the driver's broadcast table, when given
    process_batch(batch, ctx)  -> batches  # all input rows routed to this partition (if any);
                                           # with chunked_input once per input chunk
    on_watermark(ctx, wm_ms)   -> batches  # after the input, when a watermark is known
    on_processing_time(ctx, pt_ms) -> batches  # then, with the micro-batch's processing time
    flush(ctx)                 -> batches  # only in the final flush, instead of the above

and finally snapshots the backend as version ``ctx.batch_id``. Every partition runs every
micro-batch, even one without input rows, so event-time and processing-time timers fire on time.
A non-final flush (``StatefulOperator.flush(spark, final=False)``, the end of one run of a
scheduled job) runs like a micro-batch without rows: ``on_watermark`` with the watermark the
input so far allows, then ``on_processing_time``; ``flush`` is not called.

Contract for processors
-----------------------
* The processor object is pickled to the Spark workers; keep it small (configuration only).
  State lives in ``ctx.backend`` only — anything kept on ``self`` is lost between micro-batches.
* ``open`` is called for each task (one partition, one micro-batch) before the other methods,
  possibly on a backend that was reused from an earlier micro-batch in the same worker process:
  ``get_state`` with the same descriptor returns the same state.
* ``process_batch`` receives one ``pa.RecordBatch`` holding all input rows routed to this partition
  for the micro-batch (the operator's internal columns removed), in no particular order: the
  order of rows after a Spark shuffle is not deterministic, so a processor whose result depends on
  order must sort (``batch.sort_by(...)``). The key column is ``ctx.key_column``; with a
  multi-column key (``key_column=["a", "b"]``) the batch holds the ordinary columns ``a`` and
  ``b``, the key of a row is the tuple ``(a, b)`` (``ctx.backend.set_current_key((a, b))``) and
  ``ctx.keys(batch)`` gives the key array the backend's batch methods take (a struct array).
* ``chunked_input = True`` (class attribute, default False): ``process_batch`` is called once
  per input chunk as Spark delivers it (Arrow batches of up to
  ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows, in arrival order) instead of once
  with all rows, so processing and output overlap the arrival of the rest of the input. For
  processors whose result does not need all rows at once (a running aggregate per row); one
  that sorts the micro-batch's rows must not set it. A failure in a later chunk fails the task
  after earlier chunks changed the state: the task's backend is then discarded and the retry
  restores the previous version, as for any failure.
* Returned/yielded batches must match ``output_schema`` (same field names; types are cast when
  safe, otherwise :class:`statecore.errors.InvalidInputError` fails the micro-batch).
* Determinism: a replayed micro-batch restores version ``batch_id - 1`` and runs again on the same
  rows; its output replaces the earlier attempt's. A processor that is a deterministic function of
  (state, rows, watermark, processing time) therefore gives exactly-once state and output.
* Watermark: ``ctx.watermark_ms`` is the largest event time (milliseconds since the epoch, UTC)
  seen in EARLIER micro-batches minus the operator's ``watermark_delay`` (Spark's rules: a
  micro-batch never moves its own watermark, and ``withWatermark``'s delay), never lower than
  the previous micro-batch's, or ``None`` before the first micro-batch with an event time.
  ``on_watermark`` is called only when it is not ``None``. Late rows (event time below the
  watermark) are not dropped: the processor decides what to do with them.
* Processing time: ``ctx.processing_time_ms`` is the micro-batch's processing time, the
  driver's wall clock (ms since the epoch, UTC) when it started the micro-batch, never lower
  than the previous micro-batch's; a replay of a committed batch id runs with the processing
  time recorded in its version (``processing_time_ms`` in the metadata), so processing-time
  timers fire in the same micro-batch again. ``on_processing_time`` is called with it in every
  micro-batch and non-final flush (not in the final flush, which, like a Flink job reaching the
  end of its input, fires no processing-time timer unless ``flush`` does); fire
  processing-time timers there.
* Configuration: ``config()`` returns JSON-able settings that give the state its meaning (a
  window size, a gap); a checkpoint cannot be continued with different ones.
* Operator state: ``ctx.operator_state`` holds non-keyed state of the partition (Flink's
  operator state: even-split and union list state, broadcast state); it is restored for
  ``ctx.partition_id`` of ``ctx.num_partitions``, redistributed when that number changed.
* Broadcast input: ``StatefulOperator.start(df, batch_id, broadcast=table)`` (and ``process``,
  ``flush``) hands a small driver-side ``pa.Table`` (rules, thresholds) to every partition:
  ``process_broadcast(table, ctx)`` runs after ``open`` and before the partition's input rows,
  in every partition, with or without rows (Flink's ``processBroadcastElement``). Keep what is
  needed in ``ctx.operator_state.get_broadcast_state(...)``: it is committed with the version,
  so a micro-batch without a table reads what the last one left, and a replay restores
  ``batch_id - 1`` and applies the table again. The state must be a function of the table
  only (every partition gets the same table and must store the same thing).
* Counters: ``ctx.metrics[name] += n`` (ints) are summed over partitions and stored in the
  committed version's metadata (e.g. late rows dropped).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import pyarrow as pa

__all__ = ["KeyedProcessor", "ProcessorContext"]


@dataclass
class ProcessorContext:
    """What a processor sees of the running task.

    Attributes:
        backend: the keyed state backend (``statecore.backends``) holding this partition's
            key-group range at version ``batch_id - 1`` when the task starts.
        operator_name: name of the operator (also its checkpoint sub-directory).
        batch_id: the state version this task produces: the Spark micro-batch id plus the
            offset of the current run, equal to the batch id until a non-final flush
            (``statecore.spark.versions``); a flush's version is the one after the latest.
        partition_id: Spark partition = operator index in ``[0, num_partitions)``.
        num_partitions: the operator's parallelism for this micro-batch.
        max_parallelism: number of key groups.
        key_group_range: the inclusive ``KeyGroupRange`` this partition owns
            (Flink ``computeKeyGroupRangeForOperatorIndex``).
        key_column: the operator's ``key_column`` as given: the name of the key column in the
            batches given to ``process_batch``, or the list of names of a multi-column key.
        key_columns: the key column names as a tuple (one name for a single-column key).
        watermark_ms: event-time watermark (ms since the epoch, UTC) or None; see module doc.
        is_flush: True only during the final (end-of-input) flush, the one that calls
            ``flush``; a non-final flush runs as a micro-batch without rows.
        metrics: int counters summed over partitions into the version's metadata.
        processing_time_ms: the micro-batch's processing time (ms since the epoch, UTC), the
            same in every partition and in a replay; see module doc. None only for a context
            built outside the operator.
    """

    backend: Any
    operator_name: str
    batch_id: int
    partition_id: int
    num_partitions: int
    max_parallelism: int
    key_group_range: Any
    key_column: Union[str, List[str]]
    watermark_ms: Optional[int]
    is_flush: bool = False
    metrics: Dict[str, int] = field(default_factory=lambda: defaultdict(int))
    key_columns: Tuple[str, ...] = ()
    processing_time_ms: Optional[int] = None

    def __post_init__(self) -> None:
        if not self.key_columns:
            kc = self.key_column
            self.key_columns = (kc,) if isinstance(kc, str) else tuple(kc)

    @property
    def operator_state(self):
        """The backend's non-keyed operator state (``backend.operator_state``, a
        :class:`statecore.operator_state.OperatorStateStore`: ``get_list_state``,
        ``get_union_list_state``, ``get_broadcast_state``). Committed with every version as this
        partition's; when a micro-batch runs with another number of partitions than the
        previous version, it is redistributed on restore for ``partition_id`` of
        ``num_partitions`` (even-split lists cut into contiguous parts, union lists whole in
        every partition, broadcast state copied; docs/architecture.md "Operator state")."""
        return self.backend.operator_state

    def keys(self, batch) -> pa.Array:
        """The key of every row of ``batch`` (a ``pa.RecordBatch`` or ``pa.Table`` as given to
        ``process_batch``) as one array, as the backend's batch methods (``add_batch``,
        ``get_batch``, ...) take keys: the key column itself for a single-column key, for a
        multi-column key a struct array of the key columns (field ``i`` = ``key_columns[i]``;
        ``to_pylist()`` gives dicts, the backend takes the struct array as is). Raises KeyError
        when a key column is missing."""
        if len(self.key_columns) == 1:
            col = batch.column(self.key_columns[0])
        else:
            cols = [batch.column(c) for c in self.key_columns]
            if any(isinstance(c, pa.ChunkedArray) for c in cols):
                cols = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c
                        for c in cols]
            col = pa.StructArray.from_arrays(cols, names=list(self.key_columns))
        return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


class KeyedProcessor:
    """Base class of processors; every hook defaults to doing nothing.

    Subclasses set :attr:`output_schema` (a ``pa.Schema``) and override the hooks they need.
    Only schemas whose types Spark's ``mapInArrow`` understands may be used (timestamps must be
    ``timestamp[us, tz=UTC]`` to round-trip unchanged in a UTC session).
    """

    #: Schema of every batch the processor returns.
    output_schema: pa.Schema = pa.schema([])
    #: True: ``process_batch`` once per input chunk as it arrives (see the module docstring).
    chunked_input: bool = False

    def config(self) -> Any:
        """JSON-able settings that change the meaning of the state (e.g. a session gap). The
        operator stores them with every version and refuses to continue a checkpoint with a
        different value (InvalidInputError). Default: None (nothing to check)."""
        return None

    def open(self, ctx: ProcessorContext) -> None:
        """Declare state (``ctx.backend.get_state(descriptor)``) and keep the handles on
        ``self``."""

    def process_broadcast(self, table: pa.Table,
                          ctx: ProcessorContext) -> Iterable[pa.RecordBatch]:
        """The micro-batch's broadcast table (``StatefulOperator.start(..., broadcast=)``), the
        same ``pa.Table`` in every partition, called after ``open`` and before
        ``process_batch`` (also in partitions without rows, and in a flush given one); store
        what the keyed input needs in broadcast state (``ctx.operator_state``). Returns output
        batches like ``process_batch`` (may be empty). Not called in a micro-batch without a
        broadcast table. Default: ignore the table."""
        return ()

    def process_batch(self, batch: pa.RecordBatch,
                      ctx: ProcessorContext) -> Iterable[pa.RecordBatch]:
        """Consume the micro-batch's rows for this partition; return output batches (may be
        empty)."""
        return ()

    def on_watermark(self, ctx: ProcessorContext, watermark_ms: int) -> Iterable[pa.RecordBatch]:
        """Called after ``process_batch`` with the watermark (ms); fire event-time timers here,
        typically through ``ctx.backend.timers.advance_watermark(...)``."""
        return ()

    def on_processing_time(self, ctx: ProcessorContext,
                           processing_time_ms: int) -> Iterable[pa.RecordBatch]:
        """Called after ``process_batch`` and ``on_watermark`` with the micro-batch's processing
        time (ms, ``ctx.processing_time_ms``) in every micro-batch and non-final flush, not in
        the final flush; fire processing-time timers here, typically through
        ``ctx.backend.timers.advance_processing_time(processing_time_ms)``."""
        return ()

    def flush(self, ctx: ProcessorContext) -> Iterable[pa.RecordBatch]:
        """End of all input (the final flush): emit whatever is still pending (open windows,
        sessions) and clear it. Called instead of ``on_watermark`` and ``on_processing_time``:
        processing-time timers not yet due fire only if this fires them
        (``advance_processing_time(2**63 - 1)``); ``ctx.processing_time_ms`` is the flush's
        processing time."""
        return ()

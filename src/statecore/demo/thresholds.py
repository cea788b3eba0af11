"""Dynamic per-route delay thresholds: the broadcast input example of the Spark operator.

The driver passes, with a micro-batch (``StatefulOperator.start(df, batch_id,
broadcast=table)``), a small table of threshold changes: ``route`` (string, ``origin|dest``)
and ``minutes`` (int64; null removes the route's threshold). :class:`RouteThresholds` applies
it to broadcast state in ``process_broadcast`` (Flink's ``processBroadcastElement``), so every
partition holds the same thresholds and a micro-batch without a table keeps the ones in force;
``process_batch`` then counts, per route key, the flights whose departure delay exceeds the
route's threshold in force for that micro-batch (Flink's ``processElement`` reading broadcast
state).
"""

from __future__ import annotations

from typing import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from statecore.descriptors import MapStateDescriptor, ValueStateDescriptor
from statecore.errors import InvalidInputError
from statecore.spark.processor import KeyedProcessor, ProcessorContext

__all__ = ["RouteThresholds", "THRESHOLD_SCHEMA", "THRESHOLDS", "THRESHOLD_OUTPUT_SCHEMA"]

#: The broadcast table a micro-batch may carry: threshold changes, null minutes = remove.
THRESHOLD_SCHEMA = pa.schema([("route", pa.string()), ("minutes", pa.int64())])

#: The thresholds in force (route -> minutes), broadcast state of every partition.
THRESHOLDS = MapStateDescriptor("thresholds", "string", "int64")

THRESHOLD_OUTPUT_SCHEMA = pa.schema([
    ("route", pa.string()),
    ("threshold_minutes", pa.int64()),
    ("flights", pa.int64()),
    ("delayed", pa.int64()),
    ("delayed_total", pa.int64()),
])


class RouteThresholds(KeyedProcessor):
    """Counts delayed departures per route against thresholds the driver changes at run time.

    Input rows: the route key column (``origin|dest``, string) and ``dep_delay`` (minutes,
    float or int; null = cancelled, never delayed). Per micro-batch and route with rows and a
    threshold in force, one :data:`THRESHOLD_OUTPUT_SCHEMA` row: the threshold, the route's
    ``flights`` in the micro-batch, ``delayed`` (those with ``dep_delay > threshold``) and
    ``delayed_total`` (keyed ValueState ``delayed``, int64: the sum of ``delayed`` over the
    route's micro-batches so far, each counted against its own micro-batch's threshold). Rows
    of routes without a threshold are ignored.

    Broadcast table (:data:`THRESHOLD_SCHEMA`): upserts into the broadcast state
    :data:`THRESHOLDS`; a null ``minutes`` removes the route. InvalidInputError when a column
    is missing or a route is null.
    """

    output_schema = THRESHOLD_OUTPUT_SCHEMA

    def open(self, ctx: ProcessorContext) -> None:
        """Register the broadcast thresholds and the per-route ``delayed`` total."""
        self.thresholds = ctx.operator_state.get_broadcast_state(THRESHOLDS)
        self.total = ctx.backend.get_state(ValueStateDescriptor("delayed", "int64"))

    def process_broadcast(self, table: pa.Table,
                          ctx: ProcessorContext) -> Iterable[pa.RecordBatch]:
        """Apply the threshold changes in row order (a later row of a route wins)."""
        missing = [c for c in THRESHOLD_SCHEMA.names if c not in table.column_names]
        if missing:
            raise InvalidInputError(f"threshold table lacks columns {missing}: {table.schema}")
        routes = table.column("route").to_pylist()
        minutes = table.column("minutes").cast(pa.int64()).to_pylist()
        for route, m in zip(routes, minutes):
            if route is None:
                raise InvalidInputError("threshold table: a route is null")
            if m is None:
                self.thresholds.remove(route)
            else:
                self.thresholds.put(route, m)
        return ()

    def process_batch(self, batch: pa.RecordBatch,
                      ctx: ProcessorContext) -> Iterable[pa.RecordBatch]:
        """Count this micro-batch's delayed flights per route against the thresholds in
        force; yields one batch sorted by route."""
        key = ctx.key_column
        thresholds = dict(self.thresholds.items())
        if not thresholds:
            return
        routes = batch.column(key)
        threshold = pa.array([thresholds.get(r) for r in routes.to_pylist()], pa.int64())
        delay = batch.column("dep_delay").cast(pa.float64())
        delayed = pc.fill_null(pc.greater(delay, threshold.cast(pa.float64())), False)
        t = pa.table({"route": routes, "threshold": threshold, "one": pc.cast(
            pc.is_valid(routes), pa.int64()), "delayed": delayed.cast(pa.int64())})
        t = t.filter(pc.is_valid(threshold))
        if t.num_rows == 0:
            return
        agg = t.group_by("route").aggregate(
            [("threshold", "max"), ("one", "sum"), ("delayed", "sum")]).sort_by("route")
        keys = agg.column("route").combine_chunks()
        delayed_now = agg.column("delayed_sum").combine_chunks()
        total = pc.add(pc.fill_null(self.total.get_batch(keys), 0), delayed_now)
        self.total.put_batch(keys, total)
        yield pa.RecordBatch.from_arrays(
            [keys, agg.column("threshold_max").combine_chunks(),
             agg.column("one_sum").combine_chunks(), delayed_now, total],
            schema=THRESHOLD_OUTPUT_SCHEMA)

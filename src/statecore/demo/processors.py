"""The two processors of the bundled flights job.

* :class:`AircraftSessions` — per aircraft (``tailnum``) event-time sessions with Spark SQL
  ``session_window`` semantics.
* :class:`RouteDelays` — per route (``origin|dest``) running arrival-delay statistics, kept with
  the batch state API (``get_batch`` / ``put_batch``).

Event times are milliseconds since the epoch (UTC) inside state and timers; output timestamps
are ``timestamp[us, tz=UTC]``.
"""

from __future__ import annotations

import struct
from typing import Iterable, List

import pyarrow as pa
import pyarrow.compute as pc

from statecore.descriptors import ValueStateDescriptor
from statecore.errors import InvalidInputError
from statecore.spark.processor import KeyedProcessor, ProcessorContext

__all__ = ["AircraftSessions", "RouteDelays", "SESSION_SCHEMA", "ROUTE_SCHEMA", "ROUTE_KEY_SEPARATOR"]

_TS = pa.timestamp("us", tz="UTC")
_INT64_MAX = 2**63 - 1

SESSION_SCHEMA = pa.schema([
    ("tailnum", pa.string()),
    ("session_start", _TS),
    ("session_end", _TS),
    ("flights", pa.int64()),
    ("cancelled", pa.int64()),
    ("dep_delay_minutes", pa.int64()),
])

ROUTE_SCHEMA = pa.schema([
    ("origin", pa.string()),
    ("dest", pa.string()),
    ("flights", pa.int64()),
    ("arr_delay_count", pa.int64()),
    ("arr_delay_sum", pa.int64()),
    ("arr_delay_max", pa.int64()),
])

#: The route key is ``origin + "|" + dest`` (a single string key column, so that Spark's routing
#: hash and the backend's key-group assignment see the same bytes).
ROUTE_KEY_SEPARATOR = "|"

# Open session value: start_ms, last_event_ms, flights, cancelled, dep_delay_sum (5 x int64 LE).
_SESSION = struct.Struct("<5q")


def _timestamps_ms(arr) -> List[int]:
    """Python ints (ms since the epoch) of a timestamp column of any unit; nulls not allowed."""
    if arr.null_count:
        raise InvalidInputError(f"event-time column has {arr.null_count} null values")
    if not pa.types.is_timestamp(arr.type):
        raise InvalidInputError(f"event_time must be a timestamp column, got {arr.type}")
    per_ms = {"s": None, "ms": 1, "us": 1000, "ns": 1_000_000}[arr.type.unit]
    raw = arr.cast(pa.int64())
    if per_ms is None:
        raw = pc.multiply(raw, 1000)
    elif per_ms != 1:
        # Integer divide truncates toward zero; floor it so pre-1970 times round down too.
        raw = pc.subtract(pc.divide(raw, per_ms),
                          pc.cast(pc.and_(pc.less(raw, 0), pc.not_equal(pc.multiply(pc.divide(raw, per_ms), per_ms), raw)), pa.int64()))
    return raw.to_pylist()


class AircraftSessions(KeyedProcessor):
    """Sessions of each aircraft: a session ends once no flight of the same ``tailnum`` follows
    within ``gap_ms`` of its last flight (Spark ``session_window``: an event exactly ``gap_ms``
    after the last one joins the session; ``session_end = last event + gap``).

    State per aircraft: one ValueState ``open_session`` (binary, 5 x int64: start, last event,
    flights, cancelled, dep-delay sum) and one event-time timer at ``session_end``.

    Emission: a session is emitted when it is closed, that is when the watermark (largest event
    time of EARLIER micro-batches) is strictly past its end — an event at exactly the watermark
    may still arrive and would join it — or when a later flight of the same aircraft starts a
    new session, and at the end of input (:meth:`flush`).

    Late events (event time before the open session's start, which the in-order landing of the
    job never produces): an event within ``gap_ms`` before the start extends the open session
    backwards (what ``session_window`` would do); one further back, or one without an open
    session whose own session would already be over (``t + gap < watermark``), is dropped and
    counted in the metric ``late_rows`` — sessions already emitted are never changed.

    Input columns: ``tailnum`` (string, non-null), ``event_time`` (timestamp), ``dep_time``
    (null = cancelled), ``dep_delay`` (minutes, float or int, nulls ignored).
    """

    output_schema = SESSION_SCHEMA

    def __init__(self, gap_ms: int):
        if isinstance(gap_ms, bool) or not isinstance(gap_ms, int) or gap_ms <= 0:
            raise InvalidInputError(f"session gap must be a positive int (ms), got {gap_ms!r}")
        self.gap_ms = gap_ms

    def config(self):
        return {"gap_ms": self.gap_ms}

    def open(self, ctx: ProcessorContext) -> None:
        self.state = ctx.backend.get_state(ValueStateDescriptor("open_session", "binary"))
        self.timers = ctx.backend.timers

    def _row(self, out, key, start, last, flights, cancelled, delay):
        out["tailnum"].append(key)
        out["session_start"].append(start * 1000)
        out["session_end"].append((last + self.gap_ms) * 1000)
        out["flights"].append(flights)
        out["cancelled"].append(cancelled)
        out["dep_delay_minutes"].append(delay)

    @staticmethod
    def _empty_out():
        return {name: [] for name in SESSION_SCHEMA.names}

    @staticmethod
    def _to_batch(out) -> pa.RecordBatch:
        cols = [pa.array(out["tailnum"], pa.string()),
                pa.array(out["session_start"], pa.int64()).cast(_TS),
                pa.array(out["session_end"], pa.int64()).cast(_TS),
                pa.array(out["flights"], pa.int64()),
                pa.array(out["cancelled"], pa.int64()),
                pa.array(out["dep_delay_minutes"], pa.int64())]
        return pa.RecordBatch.from_arrays(cols, schema=SESSION_SCHEMA)

    def process_batch(self, batch: pa.RecordBatch, ctx: ProcessorContext) -> Iterable[pa.RecordBatch]:
        gap = self.gap_ms
        wm = ctx.watermark_ms
        # Rows of a key arrive in no particular order after the shuffle: sort for determinism.
        batch = batch.sort_by([(ctx.key_column, "ascending"), ("event_time", "ascending")])
        keys = batch.column(ctx.key_column).to_pylist()
        times = _timestamps_ms(batch.column("event_time"))
        cancelled = pc.is_null(batch.column("dep_time")).to_pylist()
        delays = pc.fill_null(batch.column("dep_delay").cast(pa.int64()), 0).to_pylist()
        out = self._empty_out()
        backend, state, timers = ctx.backend, self.state, self.timers
        late = 0
        i, n = 0, len(keys)
        while i < n:
            key = keys[i]
            j = i
            while j < n and keys[j] == key:
                j += 1
            backend.set_current_key(key)
            raw = state.value()
            if raw is None:
                cur = None
                old_end = None
            else:
                cur = list(_SESSION.unpack(raw))
                old_end = cur[1] + gap
            for r in range(i, j):
                t = times[r]
                if cur is not None and cur[0] - gap <= t <= cur[1] + gap:
                    if t < cur[0]:
                        cur[0] = t
                    if t > cur[1]:
                        cur[1] = t
                    cur[2] += 1
                    cur[3] += cancelled[r]
                    cur[4] += delays[r]
                    continue
                if cur is not None and t < cur[0] - gap:
                    late += 1
                    continue
                if cur is None and wm is not None and t + gap < wm:
                    late += 1
                    continue
                if cur is not None:  # t is past the open session's end: it is closed
                    self._row(out, key, *cur)
                cur = [t, t, 1, int(cancelled[r]), delays[r]]
            new_end = cur[1] + gap if cur is not None else None
            if new_end != old_end:
                if old_end is not None:
                    timers.delete_event_time_timer(old_end)
                if new_end is not None:
                    timers.register_event_time_timer(new_end)
            if cur is not None:
                state.update(_SESSION.pack(*cur))
            i = j
        if late:
            ctx.metrics["late_rows"] += late
        if out["tailnum"]:
            yield self._to_batch(out)

    def _fire(self, ctx: ProcessorContext, up_to_ms: int) -> Iterable[pa.RecordBatch]:
        out = self._empty_out()
        for ts, key, _ns in self.timers.advance_watermark(up_to_ms):
            ctx.backend.set_current_key(key)
            raw = self.state.value()
            if raw is None:
                continue
            cur = _SESSION.unpack(raw)
            if cur[1] + self.gap_ms != ts:
                continue  # a stale timer: the session was extended and re-registered
            self._row(out, key, *cur)
            self.state.clear()
        if out["tailnum"]:
            yield self._to_batch(out)

    def on_watermark(self, ctx: ProcessorContext, watermark_ms: int) -> Iterable[pa.RecordBatch]:
        # Closed means watermark > end; timers fire at ts <= argument.
        return self._fire(ctx, watermark_ms - 1)

    def flush(self, ctx: ProcessorContext) -> Iterable[pa.RecordBatch]:
        return self._fire(ctx, _INT64_MAX)


class RouteDelays(KeyedProcessor):
    """Running arrival-delay statistics per route, emitted for the routes touched by each
    micro-batch (the last row emitted for a route is its total so far). The micro-batch id is not
    a column of the processor's output: the job's sink writes each micro-batch to
    ``route_delays/batch_id=N/``, which readers (Spark, ``pyarrow.dataset`` with hive
    partitioning) expose as the ``batch_id`` column.

    The key column holds ``origin|dest``. State per route, four ValueStates (int64):
    ``flights`` (rows), ``arr_delay_count`` (rows with a non-null ``arr_delay``),
    ``arr_delay_sum`` (minutes) and ``arr_delay_max`` (minutes; absent while no delay is known,
    emitted as null). The micro-batch is pre-aggregated with Arrow ``group_by`` and merged into
    state with one ``get_batch`` / ``put_batch`` per state.
    """

    output_schema = ROUTE_SCHEMA

    def open(self, ctx: ProcessorContext) -> None:
        b = ctx.backend
        self.flights = b.get_state(ValueStateDescriptor("flights", "int64"))
        self.count = b.get_state(ValueStateDescriptor("arr_delay_count", "int64"))
        self.total = b.get_state(ValueStateDescriptor("arr_delay_sum", "int64"))
        self.max = b.get_state(ValueStateDescriptor("arr_delay_max", "int64"))

    def process_batch(self, batch: pa.RecordBatch, ctx: ProcessorContext) -> Iterable[pa.RecordBatch]:
        key = ctx.key_column
        delay = batch.column("arr_delay").cast(pa.int64())
        t = pa.table({key: batch.column(key), "d": delay,
                      "one": pa.array([1] * batch.num_rows, pa.int64())})
        agg = t.group_by(key).aggregate([("one", "sum"), ("d", "count"), ("d", "sum"), ("d", "max")])
        agg = agg.sort_by(key)
        keys = agg.column(key).combine_chunks()

        def merge(state, add, combine):
            old = state.get_batch(keys)
            new = add.combine_chunks().cast(pa.int64())
            merged = combine(old, new)
            return merged

        flights = merge(self.flights, agg.column("one_sum"),
                        lambda o, n: pc.add(pc.fill_null(o, 0), n))
        count = merge(self.count, agg.column("d_count"),
                      lambda o, n: pc.add(pc.fill_null(o, 0), n))
        total = merge(self.total, agg.column("d_sum"),
                      lambda o, n: pc.add(pc.fill_null(o, 0), pc.fill_null(n, 0)))
        mx = merge(self.max, agg.column("d_max"),
                   lambda o, n: pc.max_element_wise(o, n, skip_nulls=True))
        self.flights.put_batch(keys, flights)
        self.count.put_batch(keys, count)
        self.total.put_batch(keys, total)
        has_max = pc.is_valid(mx)
        if pc.any(has_max).as_py():
            self.max.put_batch(keys.filter(has_max), mx.filter(has_max))
        parts = pc.split_pattern(keys, ROUTE_KEY_SEPARATOR, max_splits=1)
        origin = pc.list_element(parts, 0)
        dest = pc.list_element(parts, 1)
        yield pa.RecordBatch.from_arrays([origin, dest, flights, count, total, mx], schema=ROUTE_SCHEMA)

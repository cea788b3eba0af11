"""The two processors of the bundled flights job.

* :class:`AircraftSessions` — per aircraft (``tailnum``) event-time sessions with Spark SQL
  ``session_window`` semantics, numbered within the aircraft's activity period.
* :class:`RouteDelays` — per route (``origin|dest``) running arrival-delay statistics, kept with
  the batch state API (``get_batch`` / ``put_batch``).

Event times are milliseconds since the epoch (UTC) inside state and timers; output timestamps
are ``timestamp[us, tz=UTC]``.

Idle state and event-time TTL. Both processors keep state per key that would otherwise live
forever (an aircraft's activity, a route's statistics). With an idle TTL they give it an
event-time :class:`~statecore.ttl.StateTtlConfig` (update type OnCreateAndWrite, visibility
NeverReturnExpired): every micro-batch that has rows of a key rewrites its state, stamped with
the micro-batch's watermark; a key whose state was last written at watermark ``w`` and that
shows up again in a micro-batch with watermark ``>= w + ttl`` finds it expired and starts a new
*activity period* (counters from zero, ``active_since`` = its first event time in that
micro-batch). Expired state is removed by the cleanup strategies (incremental on access,
background after each checkpoint, compaction filter, full snapshots) whether or not the key
comes back, so state stays bounded by the keys active within the TTL.
``statecore.demo.reference`` models exactly this with Spark SQL.
"""

from __future__ import annotations

import struct
from typing import Iterable, List, Optional

import pyarrow as pa
import pyarrow.compute as pc

from statecore.descriptors import ValueStateDescriptor
from statecore.errors import InvalidInputError
from statecore.spark.processor import KeyedProcessor, ProcessorContext
from statecore.timers import epoch_ms
from statecore.ttl import StateTtlConfig

__all__ = ["AircraftSessions", "RouteDelays", "SESSION_SCHEMA", "ROUTE_SCHEMA",
           "ROUTE_KEY_SEPARATOR", "idle_ttl"]

_TS = pa.timestamp("us", tz="UTC")
_INT64_MAX = 2**63 - 1

SESSION_SCHEMA = pa.schema([
    ("tailnum", pa.string()),
    ("session_start", _TS),
    ("session_end", _TS),
    ("flights", pa.int64()),
    ("cancelled", pa.int64()),
    ("dep_delay_minutes", pa.int64()),
    ("active_since", _TS),
    ("session_number", pa.int64()),
])

ROUTE_SCHEMA = pa.schema([
    ("origin", pa.string()),
    ("dest", pa.string()),
    ("active_since", _TS),
    ("flights", pa.int64()),
    ("arr_delay_count", pa.int64()),
    ("arr_delay_sum", pa.int64()),
    ("arr_delay_max", pa.int64()),
])

#: The route key is ``origin + "|" + dest`` (a single string key column, so that Spark's routing
#: hash and the backend's key-group assignment see the same bytes).
ROUTE_KEY_SEPARATOR = "|"

# Open session value: start_ms, last_event_ms, flights, cancelled, dep_delay_sum, active_since_ms,
# session_number (7 x int64 LE).
_SESSION = struct.Struct("<7q")
# Aircraft activity value: active_since_ms, sessions opened in the period (2 x int64 LE).
_ACTIVITY = struct.Struct("<2q")

#: Incremental cleanup entries per state access (Flink's default cleanup size).
_CLEANUP_SIZE = 5
#: Compaction-filter clock re-read interval in entries (Flink's default).
_COMPACTION_QUERY_EVERY = 1000


def idle_ttl(ttl_ms: int) -> StateTtlConfig:
    """The event-time TTL of the demo's per-key state: ``ttl_ms`` (milliseconds, > 0) after the
    last write on the watermark, OnCreateAndWrite, NeverReturnExpired, removed on read, by
    incremental cleanup (5 entries per access), in the background, by the compaction filter and
    out of full snapshots. Raises InvalidInputError for a bad ``ttl_ms``."""
    return StateTtlConfig(ttl_ms, time_characteristic="event_time",
                          cleanup_incrementally=_CLEANUP_SIZE, cleanup_in_background=True,
                          cleanup_in_compaction=_COMPACTION_QUERY_EVERY, cleanup_full_snapshot=True)


def _check_ttl(idle_ttl_ms):
    if idle_ttl_ms is not None and (isinstance(idle_ttl_ms, bool)
                                    or not isinstance(idle_ttl_ms, int) or idle_ttl_ms <= 0):
        raise InvalidInputError(
            f"idle TTL must be a positive int (ms) or None, got {idle_ttl_ms!r}")
    return idle_ttl_ms


def _descriptor(name: str, value_type: str, idle_ttl_ms):
    d = ValueStateDescriptor(name, value_type)
    return d if idle_ttl_ms is None else d.enable_time_to_live(idle_ttl(idle_ttl_ms))


def _timestamps_ms(arr) -> List[int]:
    """Python ints (ms since the epoch) of a timestamp column of any unit; nulls not allowed."""
    return _timestamps_ms_array(arr).to_pylist()


def _timestamps_ms_array(arr) -> pa.Array:
    """int64 array (ms since the epoch, floored) of a timestamp column of any unit; nulls not
    allowed (InvalidInputError)."""
    if arr.null_count:
        raise InvalidInputError(f"event-time column has {arr.null_count} null values")
    if not pa.types.is_timestamp(arr.type):
        raise InvalidInputError(f"event_time must be a timestamp column, got {arr.type}")
    return epoch_ms(arr, "event_time")


class AircraftSessions(KeyedProcessor):
    """Sessions of each aircraft: a session ends once no flight of the same ``tailnum`` follows
    within ``gap_ms`` of its last flight (Spark ``session_window``: an event exactly ``gap_ms``
    after the last one joins the session; ``session_end = last event + gap``).

    State per aircraft: one ValueState ``open_session`` (binary, 7 x int64: start, last event,
    flights, cancelled, dep-delay sum, active since, session number) and one event-time timer at
    ``session_end``, both cleared when the session is emitted; and one ValueState ``aircraft``
    (binary, 2 x int64: ``active_since``, sessions opened) that outlives sessions. With
    ``idle_ttl_ms`` the ``aircraft`` state has the event-time TTL of the module docstring: an
    aircraft idle for longer starts a new activity period. Without it the state is kept forever.

    Output columns beyond ``session_window``'s: ``active_since`` (the first event time of the
    activity period the session opened in) and ``session_number`` (1, 2, ... within that
    period).

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

    def __init__(self, gap_ms: int, idle_ttl_ms: Optional[int] = None):
        """``gap_ms``: session gap (ms, > 0); ``idle_ttl_ms``: event-time TTL of the ``aircraft``
        state (ms, > 0) or None to keep it forever. Raises InvalidInputError otherwise."""
        if isinstance(gap_ms, bool) or not isinstance(gap_ms, int) or gap_ms <= 0:
            raise InvalidInputError(f"session gap must be a positive int (ms), got {gap_ms!r}")
        self.gap_ms = gap_ms
        self.idle_ttl_ms = _check_ttl(idle_ttl_ms)

    def config(self):
        """``{"gap_ms", "session_layout"}``: a checkpoint continues only with the same gap and
        session value layout; the idle TTL may change between runs (as in Flink)."""
        return {"gap_ms": self.gap_ms, "session_layout": 2}

    def open(self, ctx: ProcessorContext) -> None:
        """Register the ``open_session`` and ``aircraft`` value states (binary) and keep the
        backend's timer service."""
        self.state = ctx.backend.get_state(ValueStateDescriptor("open_session", "binary"))
        self.aircraft = ctx.backend.get_state(_descriptor("aircraft", "binary", self.idle_ttl_ms))
        self.timers = ctx.backend.timers

    def _row(self, out, key, start, last, flights, cancelled, delay, since, number):
        out["tailnum"].append(key)
        out["session_start"].append(start * 1000)
        out["session_end"].append((last + self.gap_ms) * 1000)
        out["flights"].append(flights)
        out["cancelled"].append(cancelled)
        out["dep_delay_minutes"].append(delay)
        out["active_since"].append(since * 1000)
        out["session_number"].append(number)

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
                pa.array(out["dep_delay_minutes"], pa.int64()),
                pa.array(out["active_since"], pa.int64()).cast(_TS),
                pa.array(out["session_number"], pa.int64())]
        return pa.RecordBatch.from_arrays(cols, schema=SESSION_SCHEMA)

    def process_batch(self, batch: pa.RecordBatch,
                      ctx: ProcessorContext) -> Iterable[pa.RecordBatch]:
        """Fold the rows (input columns of the class docstring), per aircraft in event-time
        order, into its open session; yields one batch of :data:`SESSION_SCHEMA` with the
        sessions a later flight closed (none: nothing yielded). Moves the aircraft's timer to
        the new session end and counts dropped late rows in ``ctx.metrics["late_rows"]``."""
        gap = self.gap_ms
        wm = ctx.watermark_ms
        # Rows of a key arrive in no particular order after the shuffle: sort for determinism.
        batch = batch.sort_by([(ctx.key_column, "ascending"), ("event_time", "ascending")])
        keys = batch.column(ctx.key_column).to_pylist()
        times = _timestamps_ms(batch.column("event_time"))
        cancelled = pc.is_null(batch.column("dep_time")).to_pylist()
        delays = pc.fill_null(batch.column("dep_delay").cast(pa.int64()), 0).to_pylist()
        out = self._empty_out()
        backend, state, timers, aircraft = ctx.backend, self.state, self.timers, self.aircraft
        late = 0
        i, n = 0, len(keys)
        while i < n:
            key = keys[i]
            j = i
            while j < n and keys[j] == key:
                j += 1
            backend.set_current_key(key)
            # Expired (idle longer than the TTL) or never seen: a new activity period.
            act = aircraft.value()
            since, opened = (times[i], 0) if act is None else _ACTIVITY.unpack(act)
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
                opened += 1
                cur = [t, t, 1, int(cancelled[r]), delays[r], since, opened]
            new_end = cur[1] + gap if cur is not None else None
            if new_end != old_end:
                if old_end is not None:
                    timers.delete_event_time_timer(old_end)
                if new_end is not None:
                    timers.register_event_time_timer(new_end)
            if cur is not None:
                state.update(_SESSION.pack(*cur))
            # Written on every micro-batch with rows of the aircraft: the TTL counts idle time.
            aircraft.update(_ACTIVITY.pack(since, opened))
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
        """Emit (as :data:`SESSION_SCHEMA` batches) and clear the sessions whose end is
        strictly before ``watermark_ms`` (ms)."""
        # Closed means watermark > end; timers fire at ts <= argument.
        return self._fire(ctx, watermark_ms - 1)

    def flush(self, ctx: ProcessorContext) -> Iterable[pa.RecordBatch]:
        """End of input: emit and clear every open session."""
        return self._fire(ctx, _INT64_MAX)


class RouteDelays(KeyedProcessor):
    """Running arrival-delay statistics per route, emitted for the routes touched by each
    micro-batch (the last row emitted for a route is its total so far). The micro-batch id is not
    a column of the processor's output: the job's sink writes each micro-batch to
    ``route_delays/batch_id=N/``, which readers (Spark, ``pyarrow.dataset`` with hive
    partitioning) expose as the ``batch_id`` column.

    The key column holds ``origin|dest``. State per route, five ValueStates (int64):
    ``active_since`` (ms: first event time of the route's activity period), ``flights`` (rows),
    ``arr_delay_count`` (rows with a non-null ``arr_delay``), ``arr_delay_sum`` (minutes) and
    ``arr_delay_max`` (minutes; absent while no delay is known, emitted as null). The
    micro-batch is pre-aggregated with Arrow ``group_by`` and merged into state with one
    ``get_batch`` / ``put_batch`` per state, TTL included.

    With ``idle_ttl_ms`` every state has the event-time TTL of the module docstring: a route
    not flown for longer starts a new period and its statistics start from zero (seasonal
    routes come back as a new season); without it the statistics run over all input.
    """

    output_schema = ROUTE_SCHEMA

    def __init__(self, idle_ttl_ms: Optional[int] = None):
        """``idle_ttl_ms``: event-time TTL of the route state (ms, > 0) or None to keep it
        forever. Raises InvalidInputError otherwise."""
        self.idle_ttl_ms = _check_ttl(idle_ttl_ms)

    def config(self):
        """``{"route_layout": 2}``: layout 2 added the ``active_since`` state, so checkpoints
        of older layouts cannot continue; the idle TTL may change between runs."""
        return {"route_layout": 2}

    def open(self, ctx: ProcessorContext) -> None:
        """Register the five int64 value states of the class docstring (with the idle TTL)."""
        b, ttl = ctx.backend, self.idle_ttl_ms
        self.since = b.get_state(_descriptor("active_since", "int64", ttl))
        self.flights = b.get_state(_descriptor("flights", "int64", ttl))
        self.count = b.get_state(_descriptor("arr_delay_count", "int64", ttl))
        self.total = b.get_state(_descriptor("arr_delay_sum", "int64", ttl))
        self.max = b.get_state(_descriptor("arr_delay_max", "int64", ttl))

    def process_batch(self, batch: pa.RecordBatch,
                      ctx: ProcessorContext) -> Iterable[pa.RecordBatch]:
        """Merge the micro-batch's per-route aggregates (input columns: the ``origin|dest`` key
        column, ``event_time`` (timestamp), ``arr_delay`` (minutes, nulls ignored)) into state;
        yields one :data:`ROUTE_SCHEMA` batch with the updated statistics of every route in
        the batch, sorted by key."""
        key = ctx.key_column
        delay = batch.column("arr_delay").cast(pa.int64())
        t = pa.table({key: batch.column(key), "d": delay,
                      "one": pa.array([1] * batch.num_rows, pa.int64()),
                      "t": _timestamps_ms_array(batch.column("event_time"))})
        agg = t.group_by(key).aggregate([("one", "sum"), ("d", "count"), ("d", "sum"), ("d", "max"),
                                         ("t", "min")])
        agg = agg.sort_by(key)
        keys = agg.column(key).combine_chunks()

        def merge(state, add, combine):
            old = state.get_batch(keys)
            new = add.combine_chunks().cast(pa.int64())
            merged = combine(old, new)
            return merged

        # Every state of a route is written in each micro-batch that has the route, so they
        # share one TTL timestamp and expire together.
        since = merge(self.since, agg.column("t_min"), lambda o, n: pc.coalesce(o, n))
        flights = merge(self.flights, agg.column("one_sum"),
                        lambda o, n: pc.add(pc.fill_null(o, 0), n))
        count = merge(self.count, agg.column("d_count"),
                      lambda o, n: pc.add(pc.fill_null(o, 0), n))
        total = merge(self.total, agg.column("d_sum"),
                      lambda o, n: pc.add(pc.fill_null(o, 0), pc.fill_null(n, 0)))
        mx = merge(self.max, agg.column("d_max"),
                   lambda o, n: pc.max_element_wise(o, n, skip_nulls=True))
        self.since.put_batch(keys, since)
        self.flights.put_batch(keys, flights)
        self.count.put_batch(keys, count)
        self.total.put_batch(keys, total)
        has_max = pc.is_valid(mx)
        if pc.any(has_max).as_py():
            self.max.put_batch(keys.filter(has_max), mx.filter(has_max))
        parts = pc.split_pattern(keys, ROUTE_KEY_SEPARATOR, max_splits=1)
        origin = pc.list_element(parts, 0)
        dest = pc.list_element(parts, 1)
        since_ts = pc.multiply(since, 1000).cast(_TS)
        yield pa.RecordBatch.from_arrays([origin, dest, since_ts, flights, count, total, mx],
                                         schema=ROUTE_SCHEMA)

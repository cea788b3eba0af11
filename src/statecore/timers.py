"""Timer service shared by every backend (after Flink's ``InternalTimerService``): event-time
and processing-time timers.

Timers belong to (key, namespace) and to one of two time domains, and are partitioned by the key
group of their key, so they snapshot, restore and rescale exactly like keyed state. They are
stored under their encoded timer key (:func:`statecore.serializers.encode_timer_key`), which
sorts by timestamp within a key group and ends with a marker byte for a processing-time timer,
and appear in snapshots as the pseudo-state ``__timers__`` (kind ``timers``) with empty values
(byte layout: docs/formats.md "Values", timers). Both domains share that pseudo-state, so a
snapshot written before processing-time timers existed restores as event-time timers.

Semantics (Flink's), the same in each domain: registering the same (timestamp, key, namespace)
twice keeps one timer; ``advance_watermark(wm)`` (event time) and ``advance_processing_time(now)``
(processing time) fire and remove every timer of their domain with ``ts <=`` the new time, in
ascending timestamp order, ties broken by key group and then by encoded key. Neither time moves
back: a call with a lower value fires the timers at or behind the current time (e.g. ones
registered late, after the time passed them), as the next advance would in Flink. Timers
registered while handling fired timers fire on a later call. The domains are independent: a
watermark never fires a processing-time timer and the reverse. The current times are not part of
a snapshot (the caller supplies them: the Spark operator passes every micro-batch's watermark and
processing time).
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np
import pyarrow as pa

from statecore import serializers as S
from statecore.arrow_input import (
    arrow_type_ok,
    as_arrow_array,
    check_arrow_type,
    coerce_key_array,
    is_arrow_input,
    key_pylist,
)
from statecore.errors import InvalidInputError, StateMigrationError

__all__ = ["TimerService", "TIMERS_STATE_NAME", "EVENT_TIME", "PROCESSING_TIME", "epoch_ms"]

TIMERS_STATE_NAME = "__timers__"
#: Time domains (Flink's ``TimeDomain``), as the ``domain`` argument of the batch calls.
EVENT_TIME, PROCESSING_TIME = "event_time", "processing_time"
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def epoch_ms(arr, what: str = "timestamps") -> pa.Array:
    """int64 milliseconds since the epoch of a timestamp array of any unit (finer units floored,
    so pre-1970 times round down too) or of an int64 array (taken as ms already); a
    ChunkedArray is combined; nulls stay null. Raises InvalidInputError for another type, or
    when seconds do not fit in int64 milliseconds."""
    import pyarrow.compute as pc

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.type == pa.int64():
        return arr
    if not pa.types.is_timestamp(arr.type):
        raise InvalidInputError(f"{what} must be int64 (ms) or a timestamp type, got {arr.type}")
    per_ms = {"s": None, "ms": 1, "us": 1000, "ns": 1_000_000}[arr.type.unit]
    raw = arr.cast(pa.int64())
    if per_ms is None:
        try:
            return pc.multiply_checked(raw, 1000)
        except pa.ArrowInvalid as e:
            raise InvalidInputError(f"{what}: seconds beyond int64 milliseconds: {e}") from None
    if per_ms == 1:
        return raw
    # Integer divide truncates toward zero; one less where a negative value had a remainder.
    q = pc.divide(raw, per_ms)
    return pc.subtract(q, pc.cast(pc.and_(pc.less(raw, 0),
                                          pc.not_equal(pc.multiply(q, per_ms), raw)), pa.int64()))


class _Domain:
    """The timers of one time domain: per key group ``{encoded timer key: (ts, key, ns)}`` and a
    heap ``(ts, key group, encoded key)`` that may hold entries already deleted (checked on
    pop)."""

    def __init__(self):
        self.timers: dict[int, dict[bytes, tuple[int, Any, Any]]] = {}
        self.heap: list[tuple[int, int, bytes]] = []
        self.count = 0
        self.time = _INT64_MIN

    def insert(self, kg: int, enc: bytes, entry) -> None:
        group = self.timers.setdefault(kg, {})
        if enc in group:
            return
        group[enc] = entry
        self.count += 1
        heapq.heappush(self.heap, (entry[0], kg, enc))

    def remove(self, kg: int, enc: bytes) -> bool:
        """Remove one timer; False when it was not there."""
        group = self.timers.get(kg)
        if group is None or group.pop(enc, None) is None:
            return False
        self.count -= 1
        if not group:
            del self.timers[kg]
        return True

    def drop_key_group(self, kg: int) -> None:
        group = self.timers.pop(kg, None)
        if group:
            self.count -= len(group)  # their heap entries are skipped when popped

    def maybe_compact(self) -> None:
        # Deleted timers stay in the heap until popped; rebuild when they dominate so that
        # register/delete churn cannot grow memory without bound.
        if len(self.heap) > 64 and len(self.heap) > 2 * self.count:
            self.heap = [(e[0], kg, enc) for kg, g in self.timers.items() for enc, e in g.items()]
            heapq.heapify(self.heap)

    def fire(self) -> list[tuple[int, Any, Any]]:
        """Remove and return every timer with ``ts <= self.time`` in firing order."""
        fired = []
        heap, now = self.heap, self.time
        while heap and heap[0][0] <= now:
            ts, kg, enc = heapq.heappop(heap)
            group = self.timers.get(kg)
            entry = group.pop(enc, None) if group is not None else None
            if entry is None:
                continue  # deleted earlier, or a duplicate heap entry of a re-registered timer
            if not group:
                del self.timers[kg]
            self.count -= 1
            fired.append(entry)
        return fired

    def listing(self) -> list[tuple[int, int, Any, Any]]:
        return [(kg, ts, k, ns) for kg, enc, (ts, k, ns) in
                sorted(((kg, enc, e) for kg, g in self.timers.items() for enc, e in g.items()),
                       key=lambda r: (r[2][0], r[0], r[1]))]

    def clear(self) -> None:
        self.timers.clear()
        self.heap.clear()
        self.count = 0


def _time_arg(value, what: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise InvalidInputError(f"{what} must be an int (ms), got {value!r}")
    v = int(value)
    if not _INT64_MIN <= v <= _INT64_MAX:
        raise InvalidInputError(f"{what} {v} does not fit in int64")
    return v


class TimerService:
    """Event-time and processing-time timers of one keyed backend (Flink's ``TimerService``:
    ``registerEventTimeTimer``/``deleteEventTimeTimer``/``currentWatermark`` and
    ``registerProcessingTimeTimer``/``deleteProcessingTimeTimer``/``currentProcessingTime``).

    ``backend`` provides ``key_type``, ``max_parallelism``, ``key_group_range`` (KeyGroupRange),
    ``current_key`` and ``current_key_group`` (the backend validates the key and raises
    InvalidInputError when none is set), and ``check_open()`` (raises StateError once the backend
    is disposed: every timer call below then raises it, before anything else).
    ``namespace_type`` is the key-serializer type of timer namespaces (both domains): ``"void"``
    (namespace must be None), ``"int64"``, ``"int32"``, ``"string"`` or ``"binary"``.
    Timestamps are int64 milliseconds. Processing time is whatever clock the caller advances with
    :meth:`advance_processing_time` (the Spark operator: the micro-batch's processing time); the
    service never reads a wall clock, so replays fire the same timers.

    Attributes ``current_watermark`` and ``current_processing_time``: the highest value passed to
    :meth:`advance_watermark` / :meth:`advance_processing_time`, the lowest int64 before any.
    """

    def __init__(self, backend, namespace_type: str = "void"):
        self._backend = backend
        self.namespace_type = S.key_serializer(namespace_type).name
        if self.namespace_type == "pickle":
            raise InvalidInputError("timer namespaces cannot be pickled objects")
        self._key_ser = S.key_serializer(backend.key_type)
        self._ns_ser = S.key_serializer(self.namespace_type)
        self._event = _Domain()
        self._processing = _Domain()

    @property
    def current_watermark(self) -> int:
        """The event-time watermark (ms) timers fired against; lowest int64 before any."""
        return self._event.time

    @property
    def current_processing_time(self) -> int:
        """The processing time (ms) timers fired against; lowest int64 before any."""
        return self._processing.time

    def check_open(self) -> None:
        """Raise StateError when the backend is disposed (``KeyedStateBackend.dispose``): the
        timers are part of the backend's state and go with it."""
        self._backend.check_open()

    def _domain(self, domain: str) -> _Domain:
        if domain == EVENT_TIME:
            return self._event
        if domain == PROCESSING_TIME:
            return self._processing
        raise InvalidInputError(
            f"timer domain must be {EVENT_TIME!r} or {PROCESSING_TIME!r}, got {domain!r}")

    # ------------------------------------------------------------------ per-key API
    def _encode(self, ts, namespace, processing: bool) -> tuple[int, bytes, int, Any]:
        self.check_open()
        b = self._backend
        # InvalidInputError without a current key, StateError for one set by another thread
        key, kg = b.require_current_key()
        ns = self._ns_ser.check(namespace)
        enc = S.encode_timer_key(kg, b.max_parallelism, ts, key, self._key_ser, ns, self._ns_ser,
                                 processing_time=processing)
        return kg, enc, key, ns

    def register_event_time_timer(self, timestamp: int, namespace=None) -> None:
        """Register an event-time timer at ``timestamp`` (ms) for the current key and
        ``namespace``. Registering an existing timer is a no-op. Raises InvalidInputError on a
        bad timestamp or namespace, or when no current key is set."""
        kg, enc, key, ns = self._encode(timestamp, namespace, False)
        self._event.insert(kg, enc, (int(timestamp), key, ns))

    def delete_event_time_timer(self, timestamp: int, namespace=None) -> None:
        """Delete the event-time timer at ``timestamp`` for the current key and ``namespace``
        (no-op when absent)."""
        kg, enc, _, _ = self._encode(timestamp, namespace, False)
        if self._event.remove(kg, enc):
            self._event.maybe_compact()

    def register_processing_time_timer(self, timestamp: int, namespace=None) -> None:
        """Register a processing-time timer at ``timestamp`` (ms) for the current key and
        ``namespace`` (Flink's ``registerProcessingTimeTimer``); it fires at the first
        :meth:`advance_processing_time` with a time at or after ``timestamp``. Errors as
        :meth:`register_event_time_timer`."""
        kg, enc, key, ns = self._encode(timestamp, namespace, True)
        self._processing.insert(kg, enc, (int(timestamp), key, ns))

    def delete_processing_time_timer(self, timestamp: int, namespace=None) -> None:
        """Delete the processing-time timer at ``timestamp`` for the current key and
        ``namespace`` (no-op when absent)."""
        kg, enc, _, _ = self._encode(timestamp, namespace, True)
        if self._processing.remove(kg, enc):
            self._processing.maybe_compact()

    # ------------------------------------------------------------------ batch API
    def _batch(self, keys, timestamps, namespaces, processing: bool):
        """Validated ``[(kg, encoded timer key, (ts, key, ns))]`` of a batch, before anything
        changes (InvalidInputError names what is wrong)."""
        self.check_open()
        b = self._backend
        arr = coerce_key_array(keys, b.key_type)
        ts = as_arrow_array(timestamps, "timestamps",
                            lambda t: pa.types.is_integer(t) or pa.types.is_timestamp(t))
        if len(ts) != len(arr):
            raise InvalidInputError(f"timestamps have {len(ts)} rows but keys have {len(arr)}")
        if ts.null_count:
            raise InvalidInputError(f"timestamps contain {ts.null_count} null(s)")
        vals = epoch_ms(ts).to_pylist()
        if namespaces is None:
            nss = [self._ns_ser.check(None)] * len(arr)
        elif is_arrow_input(namespaces):
            ns_arr = as_arrow_array(namespaces, "namespaces",
                                    lambda t: arrow_type_ok(self.namespace_type, t))
            if len(ns_arr) != len(arr):
                raise InvalidInputError(
                    f"namespaces have {len(ns_arr)} rows but keys have {len(arr)}")
            if self.namespace_type == "void":
                raise InvalidInputError(
                    "timers with the void namespace accept only namespaces=None")
            check_arrow_type(ns_arr, self.namespace_type, "namespaces")
            if ns_arr.null_count:
                raise InvalidInputError("namespaces must not contain nulls")
            nss = ns_arr.to_pylist()
        else:
            nss = [self._ns_ser.check(namespaces)] * len(arr)
        out = []
        for key, t, ns in zip(key_pylist(arr, b.key_type), vals, nss):
            kg = b.key_group_of(key)
            enc = S.encode_timer_key(kg, b.max_parallelism, t, key, self._key_ser, ns,
                                     self._ns_ser, processing_time=processing)
            out.append((kg, enc, (int(t), key, ns)))
        return out

    def register_batch(self, keys, timestamps, namespaces=None, domain: str = EVENT_TIME) -> None:
        """Register one timer per row: ``keys`` (the backend's key type, no nulls),
        ``timestamps`` (int64 ms, or a timestamp array floored to ms; no nulls, same length),
        ``namespaces`` as the state batch API (None = the void namespace or the value for every
        row, or an array of the namespace type), ``domain`` :data:`EVENT_TIME` (default) or
        :data:`PROCESSING_TIME`. Existing timers stay single. The backend's current key does not
        change. InvalidInputError before anything changes on bad input or an unknown domain."""
        d = self._domain(domain)
        for kg, enc, entry in self._batch(keys, timestamps, namespaces, d is self._processing):
            d.insert(kg, enc, entry)

    def delete_batch(self, keys, timestamps, namespaces=None, domain: str = EVENT_TIME) -> None:
        """Delete one timer per row of ``domain`` (absent ones are ignored); arguments as
        :meth:`register_batch`."""
        d = self._domain(domain)
        for kg, enc, _ in self._batch(keys, timestamps, namespaces, d is self._processing):
            d.remove(kg, enc)
        d.maybe_compact()

    def _list(self, d: _Domain) -> list[tuple[int, Any]]:
        self.check_open()
        b = self._backend
        key, kg = b.require_current_key()
        group = d.timers.get(kg, {})
        return [(ts, ns) for enc, (ts, k, ns) in sorted(group.items()) if k == key]

    def list_event_time_timers(self) -> list[tuple[int, Any]]:
        """``(timestamp, namespace)`` of every event-time timer of the current key, ascending by
        encoded key."""
        return self._list(self._event)

    def list_processing_time_timers(self) -> list[tuple[int, Any]]:
        """``(timestamp, namespace)`` of every processing-time timer of the current key,
        ascending by encoded key."""
        return self._list(self._processing)

    def all_timers(self) -> list[tuple[int, int, Any, Any]]:
        """``(key_group, timestamp, key, namespace)`` of every event-time timer held, in firing
        order (timestamp, then key group and encoded key); nothing is removed. For inspection."""
        self.check_open()
        return self._event.listing()

    def all_processing_time_timers(self) -> list[tuple[int, int, Any, Any]]:
        """As :meth:`all_timers`, for the processing-time timers."""
        self.check_open()
        return self._processing.listing()

    # ------------------------------------------------------------------ time
    def advance_watermark(self, watermark: int) -> list[tuple[int, Any, Any]]:
        """Fire (remove and return) every event-time timer with ``ts <= max(watermark,
        current_watermark)``, as ``[(ts, key, namespace), ...]`` in ascending (ts, key group,
        encoded key) order. Raises InvalidInputError when ``watermark`` is not an int64."""
        self.check_open()
        wm = _time_arg(watermark, "watermark")
        if wm > self._event.time:
            self._event.time = wm
            observe = getattr(self._backend, "observe_watermark", None)
            if observe is not None:
                observe(wm)  # event-time TTL follows the timers' watermark
        return self._event.fire()

    def advance_processing_time(self, now_ms: int) -> list[tuple[int, Any, Any]]:
        """Fire (remove and return) every processing-time timer with ``ts <= max(now_ms,
        current_processing_time)``, as ``[(ts, key, namespace), ...]`` in ascending (ts, key
        group, encoded key) order (Flink fires a processing-time timer once the clock reaches its
        time). Event-time timers and the TTL clock are untouched. Raises InvalidInputError when
        ``now_ms`` is not an int64."""
        self.check_open()
        now = _time_arg(now_ms, "processing time")
        if now > self._processing.time:
            self._processing.time = now
        return self._processing.fire()

    # ------------------------------------------------------------------ bookkeeping
    def num_timers(self) -> int:
        """Number of registered timers, both domains."""
        self.check_open()
        return self._event.count + self._processing.count

    def num_bytes(self) -> int:
        """Bytes of all encoded timer keys, both domains (values are empty)."""
        self.check_open()
        return sum(len(enc) for d in (self._event, self._processing)
                   for g in d.timers.values() for enc in g)

    def clear(self) -> None:
        """Remove every registered timer (``KeyedStateBackend.close`` calls it)."""
        self._event.clear()
        self._processing.clear()

    def meta(self) -> dict:
        """Snapshot meta of the ``__timers__`` pseudo-state."""
        return {"name": TIMERS_STATE_NAME, "kind": "timers", "namespace_type": self.namespace_type,
                "value_type": "binary"}

    def key_groups(self) -> list[int]:
        """Key groups holding at least one timer (either domain), ascending."""
        return sorted(set(self._event.timers) | set(self._processing.timers))

    def snapshot_all(self) -> dict:
        """``{key_group: (keys, values)}`` (as :meth:`snapshot_entries`) for the key groups that
        hold timers: what a snapshot copies synchronously, O(timers) and not O(key groups)."""
        return {kg: self.snapshot_entries(kg) for kg in self.key_groups()}

    def snapshot_entries(self, key_group: int) -> tuple[pa.Array, pa.Array]:
        """``(keys, values)`` of one key group, both domains, as pa.binary arrays sorted by key
        bytes; values are empty."""
        keys = sorted([*self._event.timers.get(key_group, ()),
                       *self._processing.timers.get(key_group, ())])
        return pa.array(keys, pa.binary()), pa.array([b""] * len(keys), pa.binary())

    def restore(self, snapshot) -> int:
        """Load the ``__timers__`` entries (both domains) of every key group of the backend's
        key-group range from a StateSnapshot-like object; returns the number loaded. Raises
        StateMigrationError when the snapshot's timer namespace type differs,
        InvalidInputError on malformed keys; nothing is loaded then."""
        return self.apply_restore(self.stage_restore(snapshot))

    def stage_restore(self, snapshot) -> list:
        """Decode and validate the snapshot's timers without changing anything (first half of
        :meth:`restore`, so a backend can validate every state before applying any)."""
        metas = {m["name"]: m for m in snapshot.state_metas()}
        meta = metas.get(TIMERS_STATE_NAME)
        if meta is None:
            return []
        if meta.get("namespace_type", "void") != self.namespace_type:
            raise StateMigrationError(
                f"timers were snapshotted with namespace type {meta.get('namespace_type')!r}, "
                f"this backend uses {self.namespace_type!r}"
            )
        b = self._backend
        decoded = []
        kgs = b.key_group_range.intersection(snapshot.key_group_range)
        holding = getattr(snapshot, "key_groups_holding", None)
        if holding is not None and len(kgs):
            # A checkpoint reader tells from its block tables which key groups hold timers: most
            # states have none, so reading every key group's would be wasted work.
            kgs = holding(TIMERS_STATE_NAME, kgs.start, kgs.end)
        for kg in kgs:
            keys, _ = snapshot.entries(TIMERS_STATE_NAME, kg)
            for enc in keys.to_pylist():
                kg2, ts, key, ns, processing = S.decode_timer_key(
                    enc, b.max_parallelism, self._key_ser, self._ns_ser, with_domain=True)
                if kg2 != kg:
                    raise InvalidInputError(f"timer key {enc.hex()} listed under key group {kg}")
                decoded.append((kg, bytes(enc), (ts, key, ns), processing))
        return decoded

    def replace_restore(self, key_groups, staged: list) -> int:
        """Drop every timer of ``key_groups`` and insert the ones :meth:`stage_restore` returned
        (a change set's timers: complete for those key groups); returns how many were inserted."""
        for kg in key_groups:
            self._event.drop_key_group(kg)
            self._processing.drop_key_group(kg)
        n = self.apply_restore(staged)
        self._event.maybe_compact()
        self._processing.maybe_compact()
        return n

    def apply_restore(self, staged: list) -> int:
        """Insert timers returned by :meth:`stage_restore`; returns how many."""
        for kg, enc, entry, processing in staged:
            (self._processing if processing else self._event).insert(kg, enc, entry)
        return len(staged)

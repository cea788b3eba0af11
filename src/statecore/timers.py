"""Event-time timer service shared by every backend (after Flink's ``InternalTimerService``).

Timers belong to (key, namespace) and are partitioned by the key group of their key, so they
snapshot, restore and rescale exactly like keyed state. They are stored under their encoded timer
key (:func:`statecore.serializers.encode_timer_key`), which sorts by timestamp within a key group,
and appear in snapshots as the pseudo-state ``__timers__`` (kind ``timers``) with empty values
(byte layout: docs/formats.md "Values", timers).

Semantics (Flink's): registering the same (timestamp, key, namespace) twice keeps one timer;
``advance_watermark(wm)`` fires and removes every timer with ``ts <= wm`` in ascending timestamp
order, ties broken by key group and then by encoded key. The watermark never moves back: a call
with a lower ``wm`` fires the timers at or behind the current watermark (e.g. ones registered
late, after the watermark passed them), as the next advance would in Flink. Timers registered
while handling fired timers fire on a later call.
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

__all__ = ["TimerService", "TIMERS_STATE_NAME", "epoch_ms"]

TIMERS_STATE_NAME = "__timers__"
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


class TimerService:
    """Event-time timers of one keyed backend.

    ``backend`` provides ``key_type``, ``max_parallelism``, ``key_group_range`` (KeyGroupRange),
    ``current_key`` and ``current_key_group`` (the backend validates the key and raises
    InvalidInputError when none is set), and ``check_open()`` (raises StateError once the backend
    is disposed: every timer call below then raises it, before anything else).
    ``namespace_type`` is the key-serializer type of timer namespaces: ``"void"`` (namespace
    must be None), ``"int64"``, ``"int32"``, ``"string"`` or ``"binary"``. Timestamps are int64
    milliseconds.
    """

    def __init__(self, backend, namespace_type: str = "void"):
        self._backend = backend
        self.namespace_type = S.key_serializer(namespace_type).name
        if self.namespace_type == "pickle":
            raise InvalidInputError("timer namespaces cannot be pickled objects")
        self._key_ser = S.key_serializer(backend.key_type)
        self._ns_ser = S.key_serializer(self.namespace_type)
        # key group -> {encoded timer key: (ts, key, namespace)}
        self._timers: dict[int, dict[bytes, tuple[int, Any, Any]]] = {}
        # (ts, key group, encoded key); may hold entries already deleted (checked on pop)
        self._heap: list[tuple[int, int, bytes]] = []
        self._count = 0
        self.current_watermark = _INT64_MIN

    def check_open(self) -> None:
        """Raise StateError when the backend is disposed (``KeyedStateBackend.dispose``): the
        timers are part of the backend's state and go with it."""
        self._backend.check_open()

    # ------------------------------------------------------------------ per-key API
    def _encode(self, ts, namespace) -> tuple[int, bytes, int, Any]:
        self.check_open()
        b = self._backend
        key = b.current_key  # backend raises when no key is set
        kg = b.current_key_group
        if key is None:
            raise InvalidInputError("no current key: call set_current_key() first")
        ns = self._ns_ser.check(namespace)
        enc = S.encode_timer_key(kg, b.max_parallelism, ts, key, self._key_ser, ns, self._ns_ser)
        return kg, enc, key, ns

    def register_event_time_timer(self, timestamp: int, namespace=None) -> None:
        """Register a timer at ``timestamp`` (ms) for the current key and ``namespace``.
        Registering an existing timer is a no-op. Raises InvalidInputError on a bad timestamp or
        namespace, or when no current key is set."""
        kg, enc, key, ns = self._encode(timestamp, namespace)
        self._insert(kg, enc, (int(timestamp), key, ns))

    def delete_event_time_timer(self, timestamp: int, namespace=None) -> None:
        """Delete the timer at ``timestamp`` for the current key and ``namespace`` (no-op when
        absent)."""
        kg, enc, _, _ = self._encode(timestamp, namespace)
        if self._remove(kg, enc):
            self._maybe_compact()

    # ------------------------------------------------------------------ batch API
    def _batch(self, keys, timestamps, namespaces):
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
            enc = S.encode_timer_key(kg, b.max_parallelism, t, key, self._key_ser, ns, self._ns_ser)
            out.append((kg, enc, (int(t), key, ns)))
        return out

    def register_batch(self, keys, timestamps, namespaces=None) -> None:
        """Register one timer per row: ``keys`` (the backend's key type, no nulls),
        ``timestamps`` (int64 ms, or a timestamp array floored to ms; no nulls, same length),
        ``namespaces`` as the state batch API (None = the void namespace or the value for every
        row, or an array of the namespace type). Existing timers stay single. The backend's
        current key does not change. InvalidInputError before anything changes on bad input."""
        for kg, enc, entry in self._batch(keys, timestamps, namespaces):
            self._insert(kg, enc, entry)

    def delete_batch(self, keys, timestamps, namespaces=None) -> None:
        """Delete one timer per row (absent ones are ignored); arguments as
        :meth:`register_batch`."""
        for kg, enc, _ in self._batch(keys, timestamps, namespaces):
            self._remove(kg, enc)
        self._maybe_compact()

    def list_event_time_timers(self) -> list[tuple[int, Any]]:
        """``(timestamp, namespace)`` of every timer of the current key, ascending by encoded
        key."""
        self.check_open()
        b = self._backend
        key = b.current_key
        if key is None:
            raise InvalidInputError("no current key: call set_current_key() first")
        group = self._timers.get(b.current_key_group, {})
        return [(ts, ns) for enc, (ts, k, ns) in sorted(group.items()) if k == key]

    def all_timers(self) -> list[tuple[int, int, Any, Any]]:
        """``(key_group, timestamp, key, namespace)`` of every timer held, in firing order
        (timestamp, then key group and encoded key); nothing is removed. For inspection."""
        self.check_open()
        return [(kg, ts, k, ns) for kg, enc, (ts, k, ns) in
                sorted(((kg, enc, e) for kg, g in self._timers.items() for enc, e in g.items()),
                       key=lambda r: (r[2][0], r[0], r[1]))]

    def _insert(self, kg: int, enc: bytes, entry) -> None:
        group = self._timers.setdefault(kg, {})
        if enc in group:
            return
        group[enc] = entry
        self._count += 1
        heapq.heappush(self._heap, (entry[0], kg, enc))

    def _remove(self, kg: int, enc: bytes) -> bool:
        """Remove one timer; False when it was not there."""
        group = self._timers.get(kg)
        if group is None or group.pop(enc, None) is None:
            return False
        self._count -= 1
        if not group:
            del self._timers[kg]
        return True

    def _maybe_compact(self) -> None:
        # Deleted timers stay in the heap until popped; rebuild when they dominate so that
        # register/delete churn cannot grow memory without bound.
        if len(self._heap) > 64 and len(self._heap) > 2 * self._count:
            self._heap = [(e[0], kg, enc) for kg, g in self._timers.items() for enc, e in g.items()]
            heapq.heapify(self._heap)

    # ------------------------------------------------------------------ time
    def advance_watermark(self, watermark: int) -> list[tuple[int, Any, Any]]:
        """Fire (remove and return) every timer with ``ts <= max(watermark, current_watermark)``, as
        ``[(ts, key, namespace), ...]`` in ascending (ts, key group, encoded key) order.
        Raises InvalidInputError when ``watermark`` is not an int64."""
        self.check_open()
        if isinstance(watermark, (bool, np.bool_)) or not isinstance(watermark, (int, np.integer)):
            raise InvalidInputError(f"watermark must be an int (ms), got {watermark!r}")
        wm = int(watermark)
        if not _INT64_MIN <= wm <= _INT64_MAX:
            raise InvalidInputError(f"watermark {wm} does not fit in int64")
        if wm > self.current_watermark:
            self.current_watermark = wm
            observe = getattr(self._backend, "observe_watermark", None)
            if observe is not None:
                observe(wm)  # event-time TTL follows the timers' watermark
        wm = self.current_watermark
        fired = []
        heap = self._heap
        while heap and heap[0][0] <= wm:
            ts, kg, enc = heapq.heappop(heap)
            group = self._timers.get(kg)
            entry = group.pop(enc, None) if group is not None else None
            if entry is None:
                continue  # deleted earlier, or a duplicate heap entry of a re-registered timer
            if not group:
                del self._timers[kg]
            self._count -= 1
            fired.append(entry)
        return fired

    # ------------------------------------------------------------------ bookkeeping
    def num_timers(self) -> int:
        """Number of registered timers."""
        self.check_open()
        return self._count

    def num_bytes(self) -> int:
        """Bytes of all encoded timer keys (values are empty)."""
        self.check_open()
        return sum(len(enc) for g in self._timers.values() for enc in g)

    def clear(self) -> None:
        """Remove every registered timer (``KeyedStateBackend.close`` calls it)."""
        self._timers.clear()
        self._heap.clear()
        self._count = 0

    def meta(self) -> dict:
        """Snapshot meta of the ``__timers__`` pseudo-state."""
        return {"name": TIMERS_STATE_NAME, "kind": "timers", "namespace_type": self.namespace_type,
                "value_type": "binary"}

    def key_groups(self) -> list[int]:
        """Key groups holding at least one timer, ascending."""
        return sorted(self._timers)

    def snapshot_all(self) -> dict:
        """``{key_group: (keys, values)}`` (as :meth:`snapshot_entries`) for the key groups that
        hold timers: what a snapshot copies synchronously, O(timers) and not O(key groups)."""
        return {kg: self.snapshot_entries(kg) for kg in self.key_groups()}

    def snapshot_entries(self, key_group: int) -> tuple[pa.Array, pa.Array]:
        """``(keys, values)`` of one key group as pa.binary arrays sorted by key bytes; values
        are empty."""
        keys = sorted(self._timers.get(key_group, {}))
        return pa.array(keys, pa.binary()), pa.array([b""] * len(keys), pa.binary())

    def restore(self, snapshot) -> int:
        """Load the ``__timers__`` entries of every key group of the backend's key-group range
        from a StateSnapshot-like object; returns the number loaded. Raises StateMigrationError
        when the snapshot's timer namespace type differs, InvalidInputError on malformed keys;
        nothing is loaded then."""
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
                kg2, ts, key, ns = S.decode_timer_key(enc, b.max_parallelism, self._key_ser,
                                                      self._ns_ser)
                if kg2 != kg:
                    raise InvalidInputError(f"timer key {enc.hex()} listed under key group {kg}")
                decoded.append((kg, bytes(enc), (ts, key, ns)))
        return decoded

    def replace_restore(self, key_groups, staged: list) -> int:
        """Drop every timer of ``key_groups`` and insert the ones :meth:`stage_restore` returned
        (a change set's timers: complete for those key groups); returns how many were inserted."""
        for kg in key_groups:
            group = self._timers.pop(kg, None)
            if group:
                self._count -= len(group)  # their heap entries are skipped when popped
        n = self.apply_restore(staged)
        self._maybe_compact()
        return n

    def apply_restore(self, staged: list) -> int:
        """Insert timers returned by :meth:`stage_restore`; returns how many."""
        for kg, enc, entry in staged:
            self._insert(kg, enc, entry)
        return len(staged)

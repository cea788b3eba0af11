"""State classes of TTL-enabled states, shared by both backends (after Flink's ``ttl`` package:
``TtlValueState``, ``TtlListState``, ``TtlMapState``, ``TtlReducingState``,
``TtlAggregatingState``, ``AbstractTtlDecorator``).

They subclass the shared state classes (:mod:`statecore.backends.states`) and keep their table
interface; what changes is the stored form (a :class:`~statecore.backends.states.StateTable`
with ``ttl``): ``(stored, ts)`` per value, per list element and per map entry, ``ts`` the
last-access time in milliseconds (``backend.ttl_now(config)``). The rules (Flink's
``StateTtlConfig``, ``TtlUtils`` and the ``Ttl*State`` decorators):

* a write stamps what it writes with ``now`` (one list call: one timestamp for all its elements);
* a read of an expired entry removes it (cleanup on read, counted as ``read`` in
  ``backend.ttl_statistics()``) and returns nothing, or under ``ReturnExpiredIfNotCleanedUp``
  returns the stale value this once;
* ``OnReadAndWrite`` renews the timestamp of what a successful read returned;
* reducing/aggregating ``add`` on an expired aggregate starts from nothing (Flink
  ``TtlReduceFunction``/``TtlAggregateFunction``: expired = absent, whatever the visibility);
* list ``add`` appends without looking at older elements; ``get`` returns the unexpired ones (all
  under ``ReturnExpiredIfNotCleanedUp``) and removes the expired ones (each element is an entry
  of its own, wherever it is in the list);
* ``merge_namespaces`` (reducing, aggregating, list) is a write: expired source values (list
  elements) count as absent and are removed with the sources, an expired target as absent;
  the merged target is stamped with ``now`` (a list: every element); one state access;
* incremental cleanup (``cleanup_incrementally``) steps before each access, a batch call before
  each of its rows (:meth:`~statecore.backends.states.TableState._batch_rows`; the native
  kernels through their per-row hook), so row i sees the steps of rows 0..i and the writes of
  rows 0..i-1 only;
* batch calls behave as the same rows one at a time (the native backend runs value/reducing,
  list and map batch calls as C++ kernels with exactly these semantics,
  :mod:`statecore.backends.native`; tests/test_ttl_batch.py and
  statecore/testing/collection_reads.py compare the two; the Python backend runs the
  per-record methods row by row, :meth:`~statecore.backends.states.TableState._apply_rows`).
"""

from __future__ import annotations

import pyarrow as pa

from statecore.arrow_input import coerce_key_array, coerce_value_array
from statecore.backends.states import (
    TableAggregatingState,
    TableListState,
    TableMapState,
    TableReducingState,
    TableValueState,
    fold_rounds,
    from_stored,
    reducing_batch_values,
    to_stored,
)
from statecore.ttl import is_expired

__all__ = [
    "TTL_STATE_CLASSES",
    "TtlState",
    "TtlValueLike",
    "TtlValueState",
    "TtlReducingState",
    "TtlAggregatingState",
    "TtlListState",
    "TtlMapState",
]


class TtlState:
    """Mixin of every TTL state class (Flink ``AbstractTtlDecorator``): the incremental
    cleanup step before each access, the clock, and the reads that apply cleanup on read and
    renewal on read. ``ttl_config`` is the descriptor's StateTtlConfig (read by the native
    TTL states' kernels too)."""

    def __init__(self, *a):
        super().__init__(*a)
        self.ttl_config = self.descriptor.ttl_config

    def _slot(self):
        slot = super()._slot()
        if self.ttl_config.cleanup_size and self._row_slot is None:
            # Flink runs the incremental step before the access (TtlIncrementalCleanup); a batch
            # row (_row_slot) had its step as it was taken (TableState._batch_rows).
            self.backend.ttl_state_accessed(self.table, self.ttl_config)
        return slot

    def _now(self) -> int:
        return self.backend.ttl_now(self.ttl_config)

    def _expired(self, ts: int, now: int) -> bool:
        return is_expired(ts, self.ttl_config.ttl_ms, now)

    def _fresh(self, kg, k):
        """Stored value of a value-like state as a read sees it (None when absent or expired and
        not visible), applying cleanup on read and renewal on read."""
        cur = self.table.get(kg, k)
        if cur is None:
            return None
        s, ts = cur
        now = self._now()
        if self._expired(ts, now):
            self.table.remove(kg, k)
            self.backend.count_expired("read")
            return s if self.ttl_config.return_expired else None
        if self.ttl_config.update_on_read:
            self.table.put(kg, k, (s, now))
        return s

    def _unexpired(self, kg, k):
        """Stored value of a value-like state if present and unexpired (a write's view: an
        expired value counts as absent, whatever the visibility)."""
        cur = self.table.get(kg, k)
        if cur is None:
            return None
        s, ts = cur
        if self._expired(ts, self._now()):
            self.backend.count_expired("read")
            return None
        return s


class _TtlMerging(TtlState):
    """merge_namespaces hooks (:class:`~statecore.backends.states.TableMergingState`) of the
    TTL merging states: one state access per merge; an expired value is absent, the merged one
    stamped with ``now`` (:class:`TtlListState` reads and stamps per element)."""

    def _merge_slots(self, target, sources):
        slots = super()._merge_slots(target, sources)
        if self.ttl_config.cleanup_size:
            self.backend.ttl_state_accessed(self.table, self.ttl_config)
        return slots

    def _merge_read(self, slot):
        cur = self.table.get(*slot)
        if cur is None:
            return None, 0
        s, ts = cur
        if self._expired(ts, self._now()):
            return None, 1
        return s, 0

    def _merge_write(self, slot, merged) -> None:
        self.table.put(*slot, (merged, self._now()))

    def _fold_in_place(self, rows, vals, now: int, add, result, finish) -> pa.Array:
        """add_batch when the rows have incremental cleanup steps of their own
        (:meth:`_batch_rows` yields ``rows``, stepping as each row is taken): rows one at a
        time, each written before the next row's step visits the table, as the rows through
        ``add``/``get``. A row with a value folds it into the unexpired aggregate (``add(stored
        or None, value)`` -> stored) and writes it stamped ``now``; a null row reads as
        ``get()``. Returns ``finish([result(stored) or None a row])``. On an error (of the
        function, or of ``finish``) every aggregate a row wrote is restored to what it was
        before that slot's first write in the call, so the aggregates are as they were (what
        cleanup steps and null rows removed stays removed); then the error propagates."""
        before: dict = {}
        out = []
        try:
            for slot, v in zip(rows, vals):
                if v is None:
                    s = self._fresh(*slot)
                else:
                    s = add(self._unexpired(*slot), v)
                    if slot not in before:
                        before[slot] = self.table.get(*slot)
                    self.table.put(*slot, (s, now))
                out.append(None if s is None else result(s))
            return finish(out)
        except BaseException:
            for slot, old in reversed(before.items()):
                if old is None:
                    self.table.remove(*slot)
                else:
                    self.table.put(*slot, old)
            raise


class TtlValueLike(TtlState):
    """get_batch of value and reducing state: each row reads as ``value()``/``get()`` does."""

    def get_batch(self, keys, namespaces=None) -> pa.Array:
        if self.serializer.arrow_type is None:
            return super().get_batch(keys, namespaces)  # raises the same error
        slots = self._batch_rows(self.backend.batch_slots(self, keys, namespaces))
        return pa.array([self._fresh(kg, k) for kg, k in slots], self.serializer.arrow_type)


class TtlValueState(TtlValueLike, TableValueState):
    """ValueState with TTL (Flink ``TtlValueState``): the stored form is ``(stored, ts)``."""

    def value(self):
        kg, k = self._slot()
        s = self._fresh(kg, k)
        return self.descriptor.default_value() if s is None else from_stored(self.serializer, s)

    def update(self, value) -> None:
        kg, k = self._slot()
        if value is None:
            self.table.remove(kg, k)
        else:
            self.table.put(kg, k, (to_stored(self.serializer, value), self._now()))

    def put_batch(self, keys, values, namespaces=None) -> None:
        arr = coerce_key_array(keys, self.backend.key_type)
        vals = self.serializer.to_pylist(coerce_value_array(values, self.serializer.name, len(arr)))
        slots = self._batch_rows(self.backend.batch_slots(self, arr, namespaces))
        now = self._now()
        for (kg, k), v in zip(slots, vals):
            if v is None:
                self.table.remove(kg, k)
            else:
                self.table.put(kg, k, (to_stored(self.serializer, v), now))


class TtlReducingState(_TtlMerging, TtlValueLike, TableReducingState):
    """ReducingState with TTL (Flink ``TtlReducingState``): an expired aggregate is absent for
    ``add``."""

    def get(self):
        kg, k = self._slot()
        s = self._fresh(kg, k)
        return None if s is None else from_stored(self.serializer, s)

    def add(self, value) -> None:
        kg, k = self._slot()
        if value is None:
            return
        cur = self._unexpired(kg, k)
        self.table.put(kg, k, (self._reduce(cur, value), self._now()))

    def add_batch(self, keys, values, namespaces=None) -> pa.Array:
        """Rows one at a time: a row with a value is ``add`` and yields the new aggregate, a null
        row yields what ``get()`` returns. Writes are staged and applied at the end, so a reducer
        error leaves the aggregates unchanged (expired entries read meanwhile may be gone)."""
        arr = coerce_key_array(keys, self.backend.key_type)
        vals = reducing_batch_values(self, values, len(arr))
        slots = self.backend.batch_slots(self, arr, namespaces)
        rows = self._batch_rows(slots)
        now = self._now()
        if rows is not slots:
            return self._fold_in_place(rows, vals, now, self._reduce, lambda s: s,
                                       lambda out: pa.array(out, self.serializer.arrow_type))
        if self.descriptor.reducer.is_vectorized:
            staged, out = fold_rounds(
                slots, vals, self.descriptor.reducer, self.serializer,
                lambda s, null: self._fresh(*s) if null else self._unexpired(*s))
        else:
            staged, out = self._fold_rows(slots, vals)
        for (kg, k), st in staged.items():
            self.table.put(kg, k, (st, now))
        return pa.array(out, self.serializer.arrow_type)

    def _fold_rows(self, slots, vals):
        staged, out = {}, []
        for slot, v in zip(slots, vals):
            if v is None:
                out.append(staged[slot] if slot in staged else self._fresh(*slot))
                continue
            acc = staged[slot] if slot in staged else self._unexpired(*slot)
            staged[slot] = self._reduce(acc, v)
            out.append(staged[slot])
        return staged, out


class TtlAggregatingState(_TtlMerging, TableAggregatingState):
    """AggregatingState with TTL (Flink ``TtlAggregatingState``): an expired accumulator is
    absent for ``add``."""

    def get(self):
        kg, k = self._slot()
        s = self._fresh(kg, k)
        if s is None:
            return None
        return self.descriptor.aggregate_function.get_result(from_stored(self.serializer, s))

    def add(self, value) -> None:
        kg, k = self._slot()
        if value is None:
            return
        fn = self.descriptor.aggregate_function
        s = self._unexpired(kg, k)
        acc = fn.create_accumulator() if s is None else from_stored(self.serializer, s)
        self.table.put(kg, k, (to_stored(self.serializer, fn.add(value, acc)), self._now()))

    def add_batch(self, keys, values, namespaces=None) -> pa.Array:
        arr, vals = self._batch_values(keys, values)
        slots = self.backend.batch_slots(self, arr, namespaces)
        rows = self._batch_rows(slots)
        now = self._now()
        if rows is not slots:
            return self._fold_in_place(rows, vals, now, self._add_stored, self._result_of,
                                       self._results)
        staged, out = self._fold_aggregate(
            slots, vals, lambda s, null: self._fresh(*s) if null else self._unexpired(*s))
        results = self._results(out)
        for (kg, k), st in staged.items():
            self.table.put(kg, k, (st, now))
        return results

    def _result_of(self, stored):
        return self.descriptor.aggregate_function.get_result(from_stored(self.serializer, stored))


class TtlListState(_TtlMerging, TableListState):
    """ListState with TTL (Flink ``TtlListState``): one timestamp per element, so an element
    expires, is cleaned up and renewed on its own; a read rewrites the chunks in which it
    renewed or dropped elements (and removes a chunk left empty)."""

    def _merge_read(self, slot):
        cur = [e for _, es in self.table.list_chunks(*slot) for e in es]
        now = self._now()
        live = [s for s, ts in cur if not self._expired(ts, now)]
        return live, len(cur) - len(live)

    def _merge_append(self, slot, merged: list) -> int:
        # The merged target is stamped with now: its live elements renewed, expired ones gone.
        now = self._now()
        expired = 0
        for seq, es in self.table.list_chunks(*slot):
            kept = [(s, now) for s, ts in es if not self._expired(ts, now)]
            expired += len(es) - len(kept)
            if kept != es:
                self.table.list_put_chunk(*slot, seq, kept)
        self.table.list_append(*slot, [(s, now) for s in merged])
        return expired

    def get(self) -> list:
        kg, k = self._slot()
        chunks = self.table.list_chunks(kg, k)
        if not chunks:
            return []
        now = self._now()
        shown, expired = [], 0
        renew = self.ttl_config.update_on_read
        for seq, es in chunks:
            kept = []
            for s, ts in es:
                if self._expired(ts, now):
                    expired += 1
                    if self.ttl_config.return_expired:
                        shown.append(s)
                    continue
                kept.append((s, now) if renew else (s, ts))
                shown.append(s)
            # Written when an element expired, and under update_on_read always (the native
            # kernel renews a chunk in place): it counts as changed.
            if len(kept) != len(es) or renew:
                self.table.list_put_chunk(kg, k, seq, kept)
        if expired:
            self.backend.count_expired("read", expired)
        return [from_stored(self.serializer, s) for s in shown]

    def add(self, value) -> None:
        if value is None:
            # Same error as without TTL.
            return super().add(value)
        kg, k = self._slot()
        self.table.list_append(kg, k, [(to_stored(self.serializer, value), self._now())])

    def add_all(self, values) -> None:
        kg, k = self._slot()
        es = self._elements(values)
        if es:
            now = self._now()
            self.table.list_append(kg, k, [(e, now) for e in es])

    def update(self, values) -> None:
        kg, k = self._slot()
        es = self._elements(values)
        self.table.list_clear(kg, k)
        if es:
            now = self._now()
            self.table.list_append(kg, k, [(e, now) for e in es])


class TtlMapState(TtlState, TableMapState):
    """MapState with TTL (Flink ``TtlMapState``): one timestamp per user key, each user key an
    entry of its own, so an entry expires, is cleaned up and renewed as a value state's
    value."""

    def _read_one(self, kg, k, ukb: bytes):
        """The stored user value of ``ukb`` as a read sees it (None when absent or expired and
        not visible), with cleanup on read and renewal on read."""
        cur = self.table.map_get(kg, k, ukb)
        if cur is None:
            return None
        s, ts = cur
        now = self._now()
        if self._expired(ts, now):
            self.table.map_remove(kg, k, ukb)
            self.backend.count_expired("read")
            return s if self.ttl_config.return_expired else None
        if self.ttl_config.update_on_read:
            self.table.map_put(kg, k, ukb, (s, now))
        return s

    def _read_all(self) -> list:
        """``[(user key bytes, stored), ...]`` visible to a read of the whole map, in its order,
        with cleanup on read and renewal on read applied to every entry."""
        kg, k = self._slot()
        entries = self.table.map_items(kg, k)
        if not entries:
            return []
        now = self._now()
        shown, expired = [], 0
        for ukb, (s, ts) in entries:
            if self._expired(ts, now):
                self.table.map_remove(kg, k, ukb)
                expired += 1
                if not self.ttl_config.return_expired:
                    continue
            elif self.ttl_config.update_on_read:
                self.table.map_put(kg, k, ukb, (s, now))
            shown.append((ukb, s))
        if expired:
            self.backend.count_expired("read", expired)
        return shown

    def get(self, user_key):
        kg, k = self._slot()
        s = self._read_one(kg, k, self.user_key_serializer.serialize(user_key))
        return None if s is None else from_stored(self.serializer, s)

    def contains(self, user_key) -> bool:
        kg, k = self._slot()
        return self._read_one(kg, k, self.user_key_serializer.serialize(user_key)) is not None

    def put(self, user_key, user_value) -> None:
        self.put_all([(user_key, user_value)])

    def put_all(self, mapping) -> None:
        kg, k = self._slot()
        items = mapping.items() if isinstance(mapping, dict) else mapping
        now = self._now()
        uks, ser = self.user_key_serializer, self.serializer
        staged = [(uks.serialize(uk), (to_stored(ser, uv), now)) for uk, uv in items]
        for ukb, e in staged:
            self.table.map_put(kg, k, ukb, e)

    def items(self) -> list:
        uks, ser = self.user_key_serializer, self.serializer
        return [(uks.deserialize(uk), from_stored(ser, s)) for uk, s in self._read_all()]

    def is_empty(self) -> bool:
        return not self._read_all()

    def size(self) -> int:
        return len(self._read_all())


#: ``{state kind: class}`` of TTL-enabled states.
TTL_STATE_CLASSES = {"value": TtlValueState, "list": TtlListState, "map": TtlMapState,
                     "reducing": TtlReducingState, "aggregating": TtlAggregatingState}

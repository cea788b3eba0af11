"""Per-record state classes shared by both backends, and the table interface they run over.

A keyed backend (:class:`statecore.backends.table_backend.TableBackend`) keeps one
:class:`StateTable` per registered state and hands it to the state objects of this module. A state
object addresses one entry of its table by a *slot* ``(key group, k)``: ``k`` is whatever the
backend's tables take as the key of an entry (the pure-Python tables: ``(key, namespace)``; the
native tables: the encoded key bytes), and the state object gets it from the backend
(:meth:`TableState._slot` for the current key and namespace, through the backend's ``check_open()``
and ``require_current_key()``; ``backend.batch_slots(state, keys, namespaces)`` for the rows of a
batch: the seam is described in :class:`statecore.backends.table_backend.TableBackend` and
:class:`TableState`). Tables take and return *stored forms* (:func:`to_stored`): the canonical
Python value of a typed value, the pickled bytes of a ``pickle`` value. A map state stores each
user key as an entry of its own (Flink ``RocksDBMapState``'s layout): the table's map calls
(:meth:`StateTable.map_get` ...) address an entry by the slot of its (key, namespace) and the
serialized user key (user-key equality is byte equality), its stored form is the stored user value;
a list state stores a list as a sequence of chunks, each an entry of up to
``LIST_CHUNK_ELEMENTS`` elements addressed by the slot and the chunk's sequence number
(:meth:`StateTable.list_chunks` ...); with TTL every value, list element and map entry is a
``(stored, timestamp ms)`` pair (:mod:`statecore.backends.ttl_states`). So the
per-record semantics of both backends are this one code; what differs is where the entries live
(Python dicts or the C++ state map) and the batch calls the native backend runs as kernels
(:mod:`statecore.backends.native`).

The batch calls here are the generic path: each row applied as the per-record method would
apply it (:meth:`TableState._apply_rows`), every input validated before anything changes.
"""

from __future__ import annotations

import abc
import pickle

import pyarrow as pa
import pyarrow.compute as pc

from statecore import serializers as S
from statecore.arrow_input import (
    arrow_type_ok,
    as_arrow_array,
    check_arrow_type,
    coerce_key_array,
    coerce_value_array,
)
from statecore.backends import base
from statecore.descriptors import AggregateFunction
from statecore.errors import InvalidInputError
from statecore.key_groups import KeyGroupRange

__all__ = [
    "to_stored",
    "from_stored",
    "StateTable",
    "TableState",
    "TableMergingState",
    "TableValueState",
    "TableListState",
    "TableMapState",
    "TableReducingState",
    "TableAggregatingState",
    "STATE_CLASSES",
    "reducing_batch_values",
    "fold_rounds",
]


def to_stored(ser: S.ValueSerializer, v):
    """The validated, immutable stored form of value ``v`` of serializer ``ser``: the pickled
    bytes for ``pickle`` (so a caller mutating an object after a write cannot change state),
    else the canonical Python value (:meth:`ValueSerializer.check`: InvalidInputError when
    ``v`` does not fit the value type)."""
    if ser.name == "pickle":
        return ser.serialize(v)
    return ser.check(v)


def from_stored(ser: S.ValueSerializer, s):
    """The Python value of stored form ``s`` (inverse of :func:`to_stored`; a ``pickle`` value
    is unpickled, so every read returns a new object)."""
    return pickle.loads(s) if ser.name == "pickle" else s


class StateTable(abc.ABC):
    """The entries of one state, as the state objects and the backend see them.

    Holds the state's meta (``name``, ``kind``, ``namespace_type``, ``value_type``,
    ``user_key_type``, ``ttl``: the dict snapshots record) and the serializers it implies;
    subclasses store the entries. ``get(kg, k)`` returns the stored form of slot ``(kg, k)`` or
    None, ``put(kg, k, stored)`` writes one (InvalidInputError, with nothing changed, when it
    does not fit the value type), ``remove(kg, k)`` removes one (absent: no-op). The TTL
    passes (Flink's incremental and background cleanup, TTL migration) are the table's too,
    since they walk its entries.
    """

    def __init__(self, meta: dict):
        self.meta = dict(meta)
        self.name = meta["name"]
        self.kind = meta["kind"]
        self.namespace_type = meta["namespace_type"]
        self.ns_ser = S.key_serializer(self.namespace_type)
        self.value_ser = S.value_serializer(meta["value_type"])
        self.user_key_ser = S.key_serializer(meta["user_key_type"]) if self.kind == "map" else None
        # With TTL every stored value, list element and map entry is a (stored, timestamp ms)
        # pair; the bytes carry the timestamp as a suffix (docs/formats.md "TTL suffix").
        self.ttl = bool(meta.get("ttl"))

    @abc.abstractmethod
    def get(self, kg: int, k):
        """The stored form of slot ``(kg, k)``, or None when absent."""

    @abc.abstractmethod
    def put(self, kg: int, k, stored) -> None:
        """Write the stored form of slot ``(kg, k)``."""

    @abc.abstractmethod
    def remove(self, kg: int, k) -> None:
        """Remove slot ``(kg, k)`` (no-op when absent)."""

    # ---- map state: one entry per user key (docs/formats.md "Map state"). ``k`` is the slot of
    # the map's (key, namespace), ``ukb`` the serialized user key. Each table keeps an index of
    # the user keys of every map (insertion ordered, not part of snapshots: rebuilt from the
    # entries on restore), which iteration, sizes and clearing use.
    @abc.abstractmethod
    def map_get(self, kg: int, k, ukb: bytes):
        """The stored form of user key ``ukb`` of map ``(kg, k)``, or None when absent."""

    @abc.abstractmethod
    def map_put(self, kg: int, k, ukb: bytes, stored) -> None:
        """Write user key ``ukb`` of map ``(kg, k)`` (a new user key goes last in the map's
        order, a present one keeps its place)."""

    @abc.abstractmethod
    def map_remove(self, kg: int, k, ukb: bytes) -> None:
        """Remove user key ``ukb`` of map ``(kg, k)`` (no-op when absent)."""

    @abc.abstractmethod
    def map_items(self, kg: int, k) -> list:
        """``[(user key bytes, stored), ...]`` of map ``(kg, k)`` in the map's order."""

    @abc.abstractmethod
    def map_size(self, kg: int, k) -> int:
        """The number of entries of map ``(kg, k)`` (expired ones included), O(1)."""

    @abc.abstractmethod
    def map_clear(self, kg: int, k) -> None:
        """Remove every entry of map ``(kg, k)``, O(its size)."""

    # ---- list state: a sequence of chunks (docs/formats.md "List state"). ``k`` is the slot
    # of the list's (key, namespace), ``seq`` a chunk's sequence number (int, 0 <= seq < 2**64;
    # its 8 big-endian bytes end the entry key, so key order is list order), a chunk's stored
    # form the list of its elements' stored forms. Each table keeps an index of every list's
    # chunks (in order, with the last one; not part of snapshots: rebuilt from the entries on
    # restore).
    @abc.abstractmethod
    def list_chunks(self, kg: int, k) -> list:
        """``[(seq, [stored, ...]), ...]``: the chunks of list ``(kg, k)`` in list order, O(its
        size)."""

    @abc.abstractmethod
    def list_append(self, kg: int, k, stored: list) -> None:
        """Append the stored forms ``stored`` to list ``(kg, k)``: into its last chunk while
        that holds fewer than ``LIST_CHUNK_ELEMENTS`` elements, then into new chunks, each one
        past the last (chunk 0 for an empty list); O(len(stored) + one chunk)."""

    @abc.abstractmethod
    def list_put_chunk(self, kg: int, k, seq: int, stored: list) -> None:
        """Rewrite chunk ``seq`` (present) of list ``(kg, k)`` with the stored elements
        ``stored`` (a TTL read that renewed or dropped some); ``[]`` removes the chunk."""

    @abc.abstractmethod
    def list_size(self, kg: int, k) -> int:
        """The number of elements of list ``(kg, k)`` (expired ones included)."""

    @abc.abstractmethod
    def list_clear(self, kg: int, k) -> None:
        """Remove every chunk of list ``(kg, k)``, O(its chunks); the list's next chunk is
        chunk 0 again."""

    def set_ttl_meta(self, ttl_meta) -> None:
        """Switch the table's TTL setting (after a TTL migration): ``ttl_meta`` is the new TTL
        config's meta, or None for TTL off."""
        self.ttl = ttl_meta is not None
        if self.ttl:
            self.meta["ttl"] = dict(ttl_meta)
        else:
            self.meta.pop("ttl", None)

    # ---- TTL passes (statecore.ttl; after Flink's TtlIncrementalCleanup and compaction filter)
    @abc.abstractmethod
    def ttl_cleanup_step(self, kgs: KeyGroupRange, min_entries: int, ttl_ms: int, now: int,
                         steps: int = 1):
        """``steps`` steps of incremental cleanup over the key groups ``kgs``, one after the
        other (what as many single state accesses run): each visits at least ``min_entries``
        entries from where the last step stopped (or up to the end of a pass, the next step
        starting a new one), removing or trimming expired ones. Returns ``(visited, expired,
        wrapped)`` summed over the steps (``wrapped``: some step completed a pass)."""

    @abc.abstractmethod
    def ttl_restamp(self, ts_from: int, ts_to: int) -> int:
        """Rewrite every timestamp equal to ``ts_from`` to ``ts_to``; returns how many were
        rewritten."""

    @abc.abstractmethod
    def ttl_migrate(self, ttl_meta, ts: int, ttl_ms: int, now: int) -> int:
        """Convert every entry to the other TTL format (restoring with TTL switched on or off):
        with ``ttl_meta`` every value, list element and map entry gets timestamp ``ts`` (ms);
        with None, what is expired under ``ttl_ms`` at ``now`` (ms) is dropped and the rest
        loses its timestamp. All or nothing; then :meth:`set_ttl_meta`. Returns the expired
        things dropped."""

    @abc.abstractmethod
    def ttl_cleanup_key_group(self, kg: int, ttl_ms: int, now: int) -> int:
        """Background cleanup of one whole key group; returns the expired things removed."""


class TableState:
    """Base of the per-record state classes, mixed with a :mod:`statecore.backends.base` state
    interface by each kind's class.

    What other modules read on a state (the backend, the TTL and native state classes):
    ``table`` (its :class:`StateTable`), ``serializer`` (the value type's
    :class:`~statecore.serializers.ValueSerializer`), for map states ``user_key_serializer``
    (the user key type's :class:`~statecore.serializers.KeySerializer`), for TTL states
    ``ttl_config`` (:class:`statecore.backends.ttl_states.TtlState`), the attributes of
    :class:`statecore.backends.base.State` (``backend``, ``descriptor``, ``namespace_type``,
    ``namespace_serializer``, ``require_current_namespace()``) and :meth:`batch_arrow_type`.

    What a state asks of its backend: the per-record slot through ``backend.check_open()`` and
    ``backend.require_current_key()`` (:meth:`_slot`), the rows of a batch through
    ``backend.batch_slots(self, keys, namespaces)`` and ``backend.ttl_batch_accessed(table,
    config, rows)`` (every batch call, through :meth:`_batch_rows`), and with TTL
    ``backend.ttl_now(config)``, ``backend.ttl_state_accessed(table, config, n)`` and
    ``backend.count_expired("read", n)``
    (:class:`statecore.backends.table_backend.TableBackend` lists the whole seam).

    Subclasses in other modules may override :meth:`_slot` (the native states cache the encoded
    key; TTL states count an access first) and :meth:`_namespace_slot` (the native states encode
    the key), and use :meth:`_apply_rows` and ``_row_slot``.
    """

    # The slot of the batch row being applied (see _apply_rows), else None: per-record code then
    # addresses the backend's current key.
    _row_slot = None

    def __init__(self, backend: base.KeyedStateBackend, descriptor, namespace_type,
                 table: StateTable):
        base.State.__init__(self, backend, descriptor, namespace_type)
        self.table = table
        self.serializer = table.value_ser

    def _slot(self):
        """``(key group, k)`` of the current key and namespace (or of the batch row being
        applied, ``_row_slot``): StateError when the backend is closed, InvalidInputError
        without a current key or (non-void) namespace."""
        if self._row_slot is not None:
            return self._row_slot
        self.backend.check_open()
        key, kg = self.backend.require_current_key()
        return kg, (key, self.require_current_namespace())

    def _namespace_slot(self, namespace):
        """``(key group, k)`` of the current key in ``namespace`` (canonical, of the state's
        namespace type): the slot :meth:`_slot` gives while ``namespace`` is the current one,
        whatever the current namespace is. StateError when the backend is closed,
        InvalidInputError without a current key."""
        self.backend.check_open()
        key, kg = self.backend.require_current_key()
        return kg, (key, namespace)

    def _batch_rows(self, slots: list):
        """``slots`` (a batch call's rows, :meth:`backend.batch_slots`) to be applied in row
        order, with the rows' incremental TTL cleanup (``backend.ttl_batch_accessed``): the
        state's own steps of a row run as the row is taken from the result, so row ``i`` sees
        the table after the steps of rows ``0..i`` and the writes of rows ``0..i-1``, as the
        rows one at a time. ``slots`` itself when the state has no steps a row."""
        cfg = self.descriptor.ttl_config
        steps = self.backend.ttl_batch_accessed(self.table, cfg, len(slots))
        if not steps:
            return slots
        return self._stepped_rows(slots, cfg, steps)

    def _stepped_rows(self, slots, cfg, steps: int):
        b, table = self.backend, self.table
        for slot in slots:
            b.ttl_state_accessed(table, cfg, steps)
            yield slot

    def _apply_rows(self, keys, namespaces, fn, *columns) -> list:
        """``[fn(*row) for each row]``, ``row`` = the row's items of ``columns``, with the row's
        (key, namespace) as the slot of the per-record methods meanwhile: the generic batch
        path, which applies a batch exactly as the same rows one at a time (TTL included)
        without touching the backend's current key."""
        slots = self.backend.batch_slots(self, keys, namespaces)
        out = []
        try:
            for i, slot in enumerate(self._batch_rows(slots)):
                self._row_slot = slot
                out.append(fn(*(c[i] for c in columns)))
        finally:
            self._row_slot = None
        return out

    def batch_arrow_type(self, what: str) -> pa.DataType:
        """The Arrow type of the state's values for batch call ``what`` (named in the error);
        InvalidInputError for a ``pickle`` value type, which has none."""
        if self.serializer.arrow_type is None:
            raise InvalidInputError(f"{what}: the batch API needs a typed value (not pickle) state")
        return self.serializer.arrow_type

    def clear(self) -> None:
        kg, k = self._slot()
        self.table.remove(kg, k)

    def clear_batch(self, keys, namespaces=None) -> None:
        for kg, k in self._batch_rows(self.backend.batch_slots(self, keys, namespaces)):
            self.table.remove(kg, k)

    def get_batch(self, keys, namespaces=None) -> pa.Array:
        if self.table.kind not in ("value", "reducing"):
            raise InvalidInputError(f"{self.table.kind} state has no get_batch")
        if self.serializer.arrow_type is None:
            raise InvalidInputError("the batch API needs a typed value (not pickle) state")
        slots = self._batch_rows(self.backend.batch_slots(self, keys, namespaces))
        return pa.array([self.table.get(kg, k) for kg, k in slots], self.serializer.arrow_type)


class TableValueState(TableState, base.ValueState):
    """ValueState over a table: the stored form of the value per slot."""

    def contains_batch(self, keys, namespaces=None) -> pa.Array:
        """A row reads as get_batch does (TTL visibility and cleanup on read included) and is
        true where that read returns a value (bool array, no nulls)."""
        return pc.is_valid(self.get_batch(keys, namespaces))

    def value(self):
        kg, k = self._slot()
        s = self.table.get(kg, k)
        return self.descriptor.default_value() if s is None else from_stored(self.serializer, s)

    def update(self, value) -> None:
        kg, k = self._slot()
        if value is None:
            self.table.remove(kg, k)
        else:
            self.table.put(kg, k, to_stored(self.serializer, value))

    def put_batch(self, keys, values, namespaces=None) -> None:
        arr = coerce_key_array(keys, self.backend.key_type)
        vals = self.serializer.to_pylist(coerce_value_array(values, self.serializer.name, len(arr)))
        slots = self._batch_rows(self.backend.batch_slots(self, arr, namespaces))
        for (kg, k), v in zip(slots, vals):
            if v is None:
                self.table.remove(kg, k)
            else:
                self.table.put(kg, k, to_stored(self.serializer, v))


class TableMergingState:
    """``merge_namespaces`` of the merging states (reducing, aggregating, list) over a table,
    after Flink's ``AbstractHeapMergingState.mergeNamespaces``: the sources of the current key
    are read and removed, their values combined in the order of ``sources``, and the result
    combined into the target (target first). Everything is validated and combined before the
    table changes, so an error leaves the state as it was.

    Hooks of the kinds (and of their TTL variants, :mod:`statecore.backends.ttl_states`), all
    on stored forms: :meth:`_merge_check` (what the state needs before merging),
    :meth:`_merge_read` (a slot's stored form as merging sees it), :meth:`_merge_combine` (two
    present stored forms into one) and :meth:`_merge_write`.
    """

    def merge_namespaces(self, target, sources) -> None:
        """:meth:`statecore.backends.base.ReducingState.merge_namespaces` (and its list and
        aggregating forms)."""
        tslot, slots = self._merge_slots(target, sources)
        merged, found, expired = None, [], 0
        for slot in slots:
            v, n = self._merge_read(slot)
            expired += n
            if v is not None or n:
                found.append(slot)
            if v is not None:
                merged = v if merged is None else self._merge_combine(merged, v)
        if merged is not None:
            t, n = self._merge_read(tslot)
            expired += n
            if t is not None:
                merged = self._merge_combine(t, merged)
        for kg, k in found:
            self.table.remove(kg, k)
        if merged is not None:
            self._merge_write(tslot, merged)
        if expired:
            self.backend.count_expired("read", expired)

    def _merge_slots(self, target, sources):
        """``(target slot, source slots)`` of the current key: the sources in the order of
        ``sources``, without repetitions and without the target. InvalidInputError for a void
        namespace state, a ``sources`` that is no iterable of namespaces (a str or bytes
        included) and a namespace not of the namespace type; what :meth:`_merge_check` and
        :meth:`TableState._namespace_slot` raise."""
        if self.namespace_type == "void":
            raise InvalidInputError(
                f"state {self.name!r} has the void namespace: merge_namespaces needs a state "
                "with a namespace type (there is nothing to merge)")
        if (sources is None or isinstance(sources, (str, bytes, bytearray, memoryview))
                or not hasattr(sources, "__iter__")):
            raise InvalidInputError(
                "merge_namespaces: sources must be an iterable of namespaces, got "
                f"{type(sources).__name__}")
        check = self.namespace_serializer.check
        try:
            t = check(target)
            srcs = [check(ns) for ns in sources]
        except InvalidInputError as e:
            raise InvalidInputError(
                f"merge_namespaces on {self.name!r} (namespace type {self.namespace_type}): "
                f"{e}") from e
        self._merge_check()
        tslot = self._namespace_slot(t)
        slots = []
        for ns in srcs:
            slot = self._namespace_slot(ns)
            if slot != tslot and slot not in slots:
                slots.append(slot)
        return tslot, slots

    def _merge_check(self) -> None:
        """Raise when the state cannot merge (the aggregating state's function has no merge)."""

    def _merge_read(self, slot):
        """``(stored form or None, expired things found)`` of ``slot`` for merging."""
        return self.table.get(*slot), 0

    def _merge_write(self, slot, merged) -> None:
        self.table.put(*slot, merged)

    def _merge_combine(self, a, b):
        """The stored form combining the present stored forms ``a`` (merged so far, or the
        target's) and ``b``."""
        raise NotImplementedError


class TableListState(TableMergingState, TableState, base.ListState):
    """ListState over a table: a list is a sequence of chunks (:meth:`StateTable.list_chunks`
    ...), so ``add``/``add_all`` cost O(elements added + one chunk) whatever the list's size and
    an incremental snapshot after an append holds the last chunk only (Flink
    ``RocksDBListState`` appends through RocksDB's merge operator; without one, an append
    rewrites the list's last chunk)."""

    def get(self) -> list:
        kg, k = self._slot()
        ser = self.serializer
        return [from_stored(ser, e) for _, es in self.table.list_chunks(kg, k) for e in es]

    def _elements(self, values) -> list:
        if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
            raise InvalidInputError(
                f"expected an iterable of elements, got {type(values).__name__}")
        out = []
        for v in values:
            if v is None:
                raise InvalidInputError("list state elements must not be None")
            out.append(to_stored(self.serializer, v))
        return out

    def add(self, value) -> None:
        kg, k = self._slot()
        if value is None:
            raise InvalidInputError("cannot add None to a list state")
        self.table.list_append(kg, k, [to_stored(self.serializer, value)])

    def add_all(self, values) -> None:
        kg, k = self._slot()
        es = self._elements(values)
        if es:
            self.table.list_append(kg, k, es)

    def update(self, values) -> None:
        kg, k = self._slot()
        es = self._elements(values)  # all checked before the list changes
        self.table.list_clear(kg, k)
        if es:
            self.table.list_append(kg, k, es)

    def clear(self) -> None:
        kg, k = self._slot()
        self.table.list_clear(kg, k)

    def clear_batch(self, keys, namespaces=None) -> None:
        for kg, k in self._batch_rows(self.backend.batch_slots(self, keys, namespaces)):
            self.table.list_clear(kg, k)

    def append_batch(self, keys, values, namespaces=None) -> None:
        t = self.batch_arrow_type("append_batch")
        arr = coerce_key_array(keys, self.backend.key_type)
        name = self.serializer.name
        vals = as_arrow_array(values, "values", lambda t: arrow_type_ok(name, t) or (
            (pa.types.is_list(t) or pa.types.is_large_list(t))
            and arrow_type_ok(name, t.value_type)))
        if len(vals) != len(arr):
            raise InvalidInputError(f"values have {len(vals)} rows but keys have {len(arr)}")
        if pa.types.is_list(vals.type) or pa.types.is_large_list(vals.type):
            check_arrow_type(vals.values, self.serializer.name, "list elements")
            rows = [[] if r is None else r for r in self.serializer.to_pylist(vals)]
            bad = sum(e is None for r in rows for e in r)
            if bad:
                raise InvalidInputError(f"values contain {bad} null list element(s); list "
                                        "state elements must not be null")
        else:
            check_arrow_type(vals, self.serializer.name, f"values (or a list<{t}> array)")
            if vals.null_count:
                raise InvalidInputError(f"values contain {vals.null_count} null(s); list state "
                                        "elements must not be null")
            rows = [[v] for v in self.serializer.to_pylist(vals)]
        for r in rows:  # validate every element before anything changes
            for e in r:
                to_stored(self.serializer, e)
        # One row = one add_all call: its elements share one TTL timestamp.
        self._apply_rows(arr, namespaces, lambda r: r and self.add_all(r), rows)

    def get_batch(self, keys, namespaces=None) -> pa.Array:
        t = self.batch_arrow_type("get_batch")
        return pa.array(self._apply_rows(keys, namespaces, self.get), pa.list_(t))

    # merge_namespaces: the sources' elements are appended to the target's (O(sources) without
    # TTL: the target's elements are not read); the hooks work on lists of stored elements.
    def merge_namespaces(self, target, sources) -> None:
        tslot, slots = self._merge_slots(target, sources)
        merged, found, expired = [], [], 0
        for slot in slots:
            es, n = self._merge_read(slot)
            expired += n
            if es or n:
                found.append(slot)
            merged += es
        if merged:
            expired += self._merge_append(tslot, merged)
        for kg, k in found:
            self.table.list_clear(kg, k)
        if expired:
            self.backend.count_expired("read", expired)

    def _merge_read(self, slot):
        """``(stored elements, expired elements found)`` of a source list."""
        return [e for _, es in self.table.list_chunks(*slot) for e in es], 0

    def _merge_append(self, slot, merged: list) -> int:
        """Append the merged sources' elements to the target; returns expired elements found."""
        self.table.list_append(*slot, merged)
        return 0


class TableMapState(TableState, base.MapState):
    """MapState over a table: one table entry per user key (:meth:`StateTable.map_get` ...),
    iteration in the table's insertion order of the map's user keys."""

    def __init__(self, *a):
        super().__init__(*a)
        self.user_key_serializer = self.table.user_key_ser

    def get(self, user_key):
        kg, k = self._slot()
        s = self.table.map_get(kg, k, self.user_key_serializer.serialize(user_key))
        return None if s is None else from_stored(self.serializer, s)

    def put(self, user_key, user_value) -> None:
        kg, k = self._slot()
        ukb = self.user_key_serializer.serialize(user_key)
        self.table.map_put(kg, k, ukb, to_stored(self.serializer, user_value))

    def put_all(self, mapping) -> None:
        kg, k = self._slot()
        items = mapping.items() if isinstance(mapping, dict) else mapping
        uks, ser = self.user_key_serializer, self.serializer
        # Every pair is checked before the first write: all or nothing.
        staged = [(uks.serialize(uk), to_stored(ser, uv)) for uk, uv in items]
        for ukb, s in staged:
            self.table.map_put(kg, k, ukb, s)

    def contains(self, user_key) -> bool:
        kg, k = self._slot()
        return self.table.map_get(kg, k, self.user_key_serializer.serialize(user_key)) is not None

    def remove(self, user_key) -> None:
        kg, k = self._slot()
        self.table.map_remove(kg, k, self.user_key_serializer.serialize(user_key))

    def items(self) -> list:
        kg, k = self._slot()
        uks, ser = self.user_key_serializer, self.serializer
        return [(uks.deserialize(uk), from_stored(ser, s)) for uk, s in self.table.map_items(kg, k)]

    def keys(self) -> list:
        return [uk for uk, _ in self.items()]

    def values(self) -> list:
        return [uv for _, uv in self.items()]

    def is_empty(self) -> bool:
        kg, k = self._slot()
        return self.table.map_size(kg, k) == 0

    def size(self) -> int:
        kg, k = self._slot()
        return self.table.map_size(kg, k)

    def clear(self) -> None:
        kg, k = self._slot()
        self.table.map_clear(kg, k)

    def clear_batch(self, keys, namespaces=None) -> None:
        for kg, k in self._batch_rows(self.backend.batch_slots(self, keys, namespaces)):
            self.table.map_clear(kg, k)

    def _user_keys(self, user_keys, length: int) -> list:
        if self.user_key_serializer.name == "pickle":
            raise InvalidInputError("the batch API needs a typed user key (not pickle) map state")
        arr = as_arrow_array(user_keys, "user_keys",
                             lambda t: arrow_type_ok(self.user_key_serializer.name, t))
        if len(arr) != length:
            raise InvalidInputError(f"user_keys have {len(arr)} rows but keys have {length}")
        check_arrow_type(arr, self.user_key_serializer.name, "user_keys")
        if arr.null_count:
            raise InvalidInputError(f"user_keys contain {arr.null_count} null(s); map user keys "
                                    "must not be null")
        return arr.to_pylist()

    def put_batch(self, keys, user_keys, values, namespaces=None) -> None:
        self.batch_arrow_type("put_batch")
        arr = coerce_key_array(keys, self.backend.key_type)
        uks = self._user_keys(user_keys, len(arr))
        vals = coerce_value_array(values, self.serializer.name, len(arr))
        if vals.null_count:
            raise InvalidInputError(f"values contain {vals.null_count} null(s); use remove_batch "
                                    "to remove user keys")
        vals = self.serializer.to_pylist(vals)
        for v in vals:  # validate every value before anything changes
            to_stored(self.serializer, v)
        self._apply_rows(arr, namespaces, self.put, uks, vals)

    def get_batch(self, keys, user_keys, namespaces=None) -> pa.Array:
        t = self.batch_arrow_type("get_batch")
        arr = coerce_key_array(keys, self.backend.key_type)
        uks = self._user_keys(user_keys, len(arr))
        return pa.array(self._apply_rows(arr, namespaces, self.get, uks), t)

    def contains_batch(self, keys, user_keys, namespaces=None) -> pa.Array:
        arr = coerce_key_array(keys, self.backend.key_type)
        uks = self._user_keys(user_keys, len(arr))
        return pa.array(self._apply_rows(arr, namespaces, self.contains, uks), pa.bool_())

    def remove_batch(self, keys, user_keys, namespaces=None) -> None:
        arr = coerce_key_array(keys, self.backend.key_type)
        uks = self._user_keys(user_keys, len(arr))
        self._apply_rows(arr, namespaces, self.remove, uks)


class TableReducingState(TableMergingState, TableState, base.ReducingState):
    """ReducingState over a table: the stored aggregate per slot, folded with the descriptor's
    :class:`statecore.descriptors.Reducer`."""

    def get(self):
        kg, k = self._slot()
        s = self.table.get(kg, k)
        return None if s is None else from_stored(self.serializer, s)

    def _reduce(self, cur_stored, v):
        r = self.descriptor.reducer
        if r.name != "count":
            v = self.serializer.check(v)
        acc = None if cur_stored is None else from_stored(self.serializer, cur_stored)
        try:
            new = r.add(acc, v)
        except InvalidInputError:
            raise
        except Exception as e:
            raise InvalidInputError(f"reducer {r.name!r} failed on {v!r}: {e}") from e
        return to_stored(self.serializer, new)

    def _merge_combine(self, a, b):
        # Two aggregates: count adds its counts; every other reducer folds b into a as a value.
        r = self.descriptor.reducer
        x, y = from_stored(self.serializer, a), from_stored(self.serializer, b)
        try:
            new = x + y if r.name == "count" else r.add(x, y)
        except InvalidInputError:
            raise
        except Exception as e:
            raise InvalidInputError(
                f"reducer {r.name!r} failed merging {x!r} and {y!r}: {e}") from e
        return to_stored(self.serializer, new)

    def add(self, value) -> None:
        kg, k = self._slot()
        if value is None:
            return
        self.table.put(kg, k, self._reduce(self.table.get(kg, k), value))

    def add_batch(self, keys, values, namespaces=None) -> pa.Array:
        arr = coerce_key_array(keys, self.backend.key_type)
        vals = reducing_batch_values(self, values, len(arr))
        slots = self.backend.batch_slots(self, arr, namespaces)
        self._batch_rows(slots)  # without TTL: no steps of this table's own
        if self.descriptor.reducer.is_vectorized:
            staged, out = fold_rounds(slots, vals, self.descriptor.reducer, self.serializer,
                                      lambda s, _null: self.table.get(*s))
            for (kg, k), st in staged.items():
                self.table.put(kg, k, st)
            return pa.array(out, self.serializer.arrow_type)
        staged, out = {}, []
        for (kg, k), v in zip(slots, vals):
            cur = staged[(kg, k)] if (kg, k) in staged else self.table.get(kg, k)
            if v is not None:
                cur = self._reduce(cur, v)
                staged[(kg, k)] = cur
            out.append(cur)
        for (kg, k), s in staged.items():
            self.table.put(kg, k, s)
        return pa.array(out, self.serializer.arrow_type)


def reducing_batch_values(state, values, length: int) -> list:
    """Per-row Python values of a reducing state's ``add_batch`` (None for null rows): of the
    value type, or for ``count`` of any Arrow type, where only validity matters (1 per value,
    so no value needs a Python form: an extreme timestamp has no datetime)."""
    is_count = state.descriptor.reducer.name == "count"
    arr = coerce_value_array(values, state.serializer.name, length, any_type=is_count)
    if is_count:
        return [1 if ok else None for ok in arr.is_valid().to_pylist()]
    return state.serializer.to_pylist(arr)


def fold_rounds(slots: list, vals: list, reducer, ser, acc_of):
    """add_batch with a vectorized reducer (``Reducer.vectorized``): the rows of each slot fold
    in row order, but round ``r`` (the ``r``-th row of every slot) goes to the reduce function
    as one pair of arrays. ``acc_of(slot, null_row)`` reads a slot's aggregate from the table
    (stored form or None) while the batch has not staged one. Returns ``(staged, out)``: the
    new aggregate per slot and the output per row; nothing is written here, so an error of the
    reduce function leaves the table as it was."""
    rounds: list = []
    seen: dict = {}
    for i, s in enumerate(slots):
        r = seen.get(s, 0)
        seen[s] = r + 1
        if r == len(rounds):
            rounds.append([])
        rounds[r].append(i)
    staged: dict = {}
    out = [None] * len(slots)
    for rows in rounds:
        pending, accs, values = [], [], []
        for i in rows:
            s, v = slots[i], vals[i]
            acc = staged[s] if s in staged else acc_of(s, v is None)
            if v is None:
                out[i] = acc
            elif acc is None:
                staged[s] = out[i] = ser.check(v)
            else:
                pending.append(i)
                accs.append(acc)
                values.append(ser.check(v))
        if pending:
            for i, x in zip(pending, reducer.fold_arrays(accs, values)):
                staged[slots[i]] = out[i] = ser.check(x)
    return staged, out


class TableAggregatingState(TableMergingState, TableState, base.AggregatingState):
    """AggregatingState over a table: the stored accumulator of the descriptor's
    AggregateFunction per slot; reads return ``get_result`` of it."""

    def _add_stored(self, cur, value):
        """The stored accumulator after ``add(value)`` on stored accumulator ``cur`` (None:
        ``create_accumulator``); InvalidInputError when the function fails."""
        fn = self.descriptor.aggregate_function
        acc = fn.create_accumulator() if cur is None else from_stored(self.serializer, cur)
        try:
            acc = fn.add(value, acc)
        except InvalidInputError:
            raise
        except Exception as e:
            raise InvalidInputError(
                f"aggregate function of {self.name!r} failed on {value!r}: {e}") from e
        return to_stored(self.serializer, acc)

    def get(self):
        kg, k = self._slot()
        s = self.table.get(kg, k)
        if s is None:
            return None
        return self.descriptor.aggregate_function.get_result(from_stored(self.serializer, s))

    def add(self, value) -> None:
        kg, k = self._slot()
        if value is None:
            return
        self.table.put(kg, k, self._add_stored(self.table.get(kg, k), value))

    def _merge_check(self) -> None:
        fn = self.descriptor.aggregate_function
        if (not callable(getattr(fn, "merge", None))
                or getattr(type(fn), "merge", None) is AggregateFunction.merge):
            raise InvalidInputError(
                f"aggregating state {self.name!r}: merge_namespaces needs the aggregate "
                f"function's merge(a, b) (AggregateFunction.merge), which "
                f"{type(fn).__qualname__} does not implement")

    def _merge_combine(self, a, b):
        fn = self.descriptor.aggregate_function
        try:
            acc = fn.merge(from_stored(self.serializer, a), from_stored(self.serializer, b))
        except InvalidInputError:
            raise
        except Exception as e:
            raise InvalidInputError(
                f"aggregate function of {self.name!r} failed in merge: {e}") from e
        return to_stored(self.serializer, acc)

    def _results(self, out: list) -> pa.Array:
        t = self.descriptor.result_type
        try:
            return pa.array(out, t)
        except (pa.ArrowException, TypeError, ValueError) as e:
            raise InvalidInputError(
                f"aggregating state {self.name!r}: results do not form an Arrow array"
                + (f" of {t} (the descriptor's result_type)" if t is not None
                   else " (set result_type on the descriptor)")
                + f": {e}") from e

    def _fold_aggregate(self, slots: list, vals: list, acc_of):
        """Rows in order: a value row adds (``create_accumulator`` when there is none) and
        yields ``get_result``; a null row yields what ``get()`` returns. ``acc_of(slot,
        null_row)`` reads the stored accumulator while the batch has not staged one. Returns
        ``(staged stored accumulators, results)``; nothing is written, so a failing function
        leaves the table unchanged (InvalidInputError)."""
        fn = self.descriptor.aggregate_function
        staged, out = {}, []
        for s, v in zip(slots, vals):
            cur = staged[s] if s in staged else acc_of(s, v is None)
            if v is not None:
                # Accumulators go through their stored form row by row, so a function that
                # mutates its accumulator cannot change a result already produced.
                cur = staged[s] = self._add_stored(cur, v)
            out.append(None if cur is None else fn.get_result(from_stored(self.serializer, cur)))
        return staged, out

    def _batch_values(self, keys, values):
        arr = coerce_key_array(keys, self.backend.key_type)
        vals = as_arrow_array(values, "values")
        if len(vals) != len(arr):
            raise InvalidInputError(f"values have {len(vals)} rows but keys have {len(arr)}")
        return arr, vals.to_pylist()

    def add_batch(self, keys, values, namespaces=None) -> pa.Array:
        """``add`` per row (values of any Arrow type, handed to the function as Python values;
        a null row adds nothing) returning ``get_result`` after each row (null where there is
        no accumulator), as an array of the descriptor's ``result_type`` (else inferred).
        Rows of one key apply in row order; an error leaves the state unchanged."""
        arr, vals = self._batch_values(keys, values)
        slots = self.backend.batch_slots(self, arr, namespaces)
        self._batch_rows(slots)  # without TTL: no steps of this table's own
        staged, out = self._fold_aggregate(slots, vals, lambda s, _null: self.table.get(*s))
        results = self._results(out)
        for (kg, k), st in staged.items():
            self.table.put(kg, k, st)
        return results

    def get_batch(self, keys, namespaces=None) -> pa.Array:
        """``get()`` per row, as :meth:`add_batch` returns results."""
        return self._results(self._apply_rows(keys, namespaces, self.get))

    def clear_batch(self, keys, namespaces=None):
        for kg, k in self._batch_rows(self.backend.batch_slots(self, keys, namespaces)):
            self.table.remove(kg, k)


#: ``{state kind: class}`` of states without TTL.
STATE_CLASSES = {"value": TableValueState, "list": TableListState, "map": TableMapState,
                 "reducing": TableReducingState, "aggregating": TableAggregatingState}

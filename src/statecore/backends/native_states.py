"""State classes of the native backend: the shared per-record classes with batch calls run as
C++ kernels.

Each class here is a class of :mod:`statecore.backends.states` (or, with TTL, of
:mod:`statecore.backends.ttl_states`) running over a
:class:`statecore.backends.native.NativeTable`, so the per-record semantics are that shared
code. Two things are added. Per record, :class:`NativeState` caches the slot ``(key group,
encoded key)`` for the backend's current key (``backend.encoded_current_key``, built by
``set_current_key`` in one native call) and the state's current namespace, so repeated accesses
for one record encode nothing. Per batch, the calls below run as native kernels; every other
batch call takes the per-row path of the shared classes and behaves identically.

What runs as a kernel: ``get_batch``/``put_batch`` (and ``contains_batch``) on value state and
``get_batch``/``add_batch`` on reducing state with built-in reducers (:class:`NativeValueState`,
:class:`NativeReducingState`), for every namespace type (void; int32, int64, string, binary
namespaces, one per row or one for the whole batch, go to the kernels as {key, namespace} struct
chunks, ``_keyed_chunks``) and every value type but pickle (int64, uint64, float64, int32, bool,
timestamp[unit], fixed_size_binary[N], string, binary; large_string/large_binary input accepted;
``sum`` on int64/uint64/float64/int32, ``min``/``max`` on every fixed-width type but bool
(fixed_size_binary by bytes), ``first``/``last`` on any fixed-width type, ``count`` of values of
any flat type), and every key type, multi-column keys included (the kernels hash and encode the key
arrays themselves, native/include/statecore/key_columns.h). The kernels read the Arrow buffers
through the C Data Interface (no Python object per row) with the GIL released. ListState
``append_batch`` and MapState ``put_batch`` (:class:`NativeListState`, :class:`NativeMapState`; any
namespace, typed elements / typed user keys and values, TTL or not) run the collection kernels
(native/include/statecore/batch_collections.h): each row's element is written as an entry of its
own and listed in the table's list index (docs/formats.md "List state"), each map row writes its
own entry ("Map state") and lists its user key in the table's map index. ListState ``get_batch``,
MapState ``get_batch``/``contains_batch``/``remove_batch`` (same scope; removals also with pickle
values) and ``clear_batch`` of every state kind and value type run the read / removal kernels
(native/include/statecore/batch_reads.h), their Arrow results built from the kernels' buffers.

What falls back to the per-row path: pickle values or user keys, custom reducers, aggregating
``add_batch``/``get_batch`` (:class:`NativeAggregatingState` runs only ``clear_batch`` as a
kernel), namespaces given to a void state (the per-row path raises its error), and ``count``
over an Arrow type the count kernel does not parse.

Chunked input (a ChunkedArray, an ``__arrow_c_stream__`` object;
:func:`statecore.arrow_input.import_arrow`): the kernels read the chunks in place, one kernel
call per chunk (keys and values sliced -- views, no copy -- where their chunk boundaries
differ, ``_kernel_chunks``), all inside one GIL release; every later chunk is validated
(``validate_batch``) before the first is applied (the first chunk's kernel validates it before
touching anything; a get without TTL changes nothing and needs no pass ahead), so bad input
anywhere leaves the state unchanged. That pass hashes the keys of the later chunks once more
(for the key-group check), which costs about what combining them would copy. Copies remain
where they are cheaper or needed: chunks averaging fewer than ``_MIN_ROWS_PER_CHUNK`` rows are
combined first (per-call costs would exceed a copy); an integer (int64, uint64, int32) ``sum``
batch is combined into one kernel call (its overflow rollback covers one call); a multi-column
key given as a list of chunked columns is combined per column; outputs are one new array. The
per-row paths combine chunks too (they build Python objects anyway).

TTL-enabled states (``NativeTtl*State``) use the same kernels with TTL on (batch.h "TTL",
batch_reads.h: the value bytes, list elements and map values carry the timestamp suffix; reads
remove expired entries, list elements and map entries and renew, writes stamp the batch's one
clock reading); their semantics are ttl_states.py's, row for row.

The backend is reached only through the seam documented on
:class:`statecore.backends.table_backend.TableBackend` (this module does not import
:mod:`statecore.backends.native`, which imports it).
"""

from __future__ import annotations

from threading import get_ident

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statecore import _native
from statecore import serializers as S
from statecore.arrow_input import (
    arrow_type_ok,
    batch_namespace_array,
    check_arrow_type,
    check_in_full,
    coerce_key_array,
    coerce_value_array,
    combined,
    import_arrow,
    is_arrow_input,
)
from statecore.backends import states, ttl_states
from statecore.errors import InvalidInputError

__all__ = [
    "NativeState",
    "NativeValueState",
    "NativeReducingState",
    "NativeListState",
    "NativeMapState",
    "NativeAggregatingState",
    "NativeTtlValueState",
    "NativeTtlReducingState",
    "NativeTtlListState",
    "NativeTtlMapState",
    "NativeTtlAggregatingState",
    "STATE_CLASSES",
    "TTL_STATE_CLASSES",
]


_COUNT_KERNEL_TYPES = (pa.int64(), pa.float64(), pa.int32(), pa.uint64(), pa.bool_(), pa.string(),
                       pa.large_string(), pa.binary(), pa.large_binary())


def _count_kernel_ok(t: pa.DataType) -> bool:
    # The Count kernel reads only validity, of any flat type the native ArrayView parses.
    return t in _COUNT_KERNEL_TYPES or pa.types.is_timestamp(t) or pa.types.is_fixed_size_binary(t)


def _kernel_ok(state, namespaces) -> bool:
    # namespaces on a void state: the per-row path raises its error.
    return (state.serializer.kind in _native.BATCH_VALUE_KINDS
            and (namespaces is None or state.namespace_type != "void"))


def _kernel_cleanup(state, rows: int):
    """The kernels' ``cleanup`` argument for a batch call of ``rows`` rows on ``state``, after
    the batch's cleanup steps of other states (``backend.ttl_batch_accessed``): None, or the
    state's own steps a row (incremental cleanup, one more with run_cleanup_for_every_record),
    which the kernels run before each row from the table's cursor (ttl.h IncrementalCleanup),
    as TableState._batch_rows does on the per-row path; their removals count as
    ``incremental``."""
    b = state.backend
    cfg = state.descriptor.ttl_config
    steps = b.ttl_batch_accessed(state.table, cfg, rows)
    if not steps:
        return None
    return state.table.kernel_cleanup(b.key_group_range, cfg.cleanup_size, steps, cfg.ttl_ms,
                                      b.ttl_now(cfg), lambda n: b.count_expired("incremental", n))


def _ns_column(state, namespaces, length: int):
    """The namespace of each of ``length`` rows as an Arrow array of the state's namespace type
    (pa.Array or pa.ChunkedArray, not copied when given as one), or None for a void state.
    The rules and errors of the per-row path (base.resolve_batch_namespaces): None -> the
    state's current namespace (InvalidInputError when unset), an Arrow input -> one namespace a
    row (batch_namespace_array), anything else -> that one namespace for every row."""
    ns_type = state.namespace_type
    if ns_type == "void":
        return None
    if namespaces is not None and is_arrow_input(namespaces):
        return batch_namespace_array(namespaces, ns_type, length, native_checks=True)
    ns = (state.require_current_namespace() if namespaces is None
          else S.key_serializer(ns_type).check(namespaces))
    return pa.repeat(pa.scalar(ns, state.namespace_serializer.key_type.arrow_type), length)


def _keyed_chunks(keys, ns, *columns, single: bool = False) -> list:
    """_kernel_chunks of ``keys`` and ``columns`` with the rows' namespaces ``ns`` (None for a
    void state) folded into the key chunks: each a struct {key, namespace} of offset 0 (batch.h
    BatchKeySpec::has_namespace; the children keep their offsets, nothing is copied), as the
    kernels take a namespaced state's keys. Returns [key chunks, chunks of each column...]."""
    if ns is None:
        return _kernel_chunks(keys, *columns, single=single)
    kc, *cc, nc = _kernel_chunks(keys, *columns, ns, single=single)
    return [[pa.StructArray.from_arrays([k, n], names=["key", "namespace"])
             for k, n in zip(kc, nc)], *cc]


def _key_array(state, keys):
    """Validated keys as imported: a pa.Array, or a pa.ChunkedArray whose chunks the kernels
    read in place (see _kernel_chunks). String and binary columns are left to the kernels'
    own checks (import_arrow ``native_checks``): nothing may read their rows before a kernel
    (or check_in_full) has."""
    return coerce_key_array(keys, state.backend.key_type, combine=False, native_checks=True)


#: Below this many rows per chunk on average a chunked batch is combined into one array (a copy)
#: before the kernels: every chunk costs a kernel call (export, validation, setup), which a copy
#: of a small chunk undercuts; large chunks are read in place.
_MIN_ROWS_PER_CHUNK = 4096


def _kernel_chunks(*columns, single: bool = False) -> list:
    """The columns (pa.Array or pa.ChunkedArray, equal lengths) as lists of equally long
    chunks, one kernel call per chunk: the chunk boundaries are the union of every column's, a
    chunk of one column that spans a boundary of another is sliced (a view, no copy). Combined
    into one chunk per column (a copy) when ``single`` (a kernel call must see the whole batch)
    or when the chunks are small (_MIN_ROWS_PER_CHUNK)."""
    if not any(isinstance(c, pa.ChunkedArray) for c in columns):
        return [[c] for c in columns]  # the common case, without the boundary arithmetic
    chunk_lists = [c.chunks if isinstance(c, pa.ChunkedArray) else [c] for c in columns]
    total = len(columns[0])
    bounds = sorted({0, total}.union(*(
        np.cumsum([len(ch) for ch in chunks]).tolist() for chunks in chunk_lists)))
    parts = len(bounds) - 1
    if parts <= 1 or single or total < _MIN_ROWS_PER_CHUNK * parts:
        return [[combined(c)] for c in columns]
    out = []
    for chunks in chunk_lists:
        sliced, ci, start = [], 0, 0
        for a, b in zip(bounds, bounds[1:]):
            while start + len(chunks[ci]) <= a:  # skips empty chunks too
                start += len(chunks[ci])
                ci += 1
            sliced.append(chunks[ci].slice(a - start, b - a))
        out.append(sliced)
    return out


def _cast_out(arr: pa.Array, ser) -> pa.Array:
    return arr if arr.type == ser.arrow_type else arr.cast(ser.arrow_type)


class _KernelGet:
    """get_batch through the native kernel when it applies (see _kernel_ok)."""

    def _kernel_ttl(self, rows: int):
        """The kernels' ``(ttl, cleanup)`` arguments for ``rows`` rows: no TTL here (TTL states
        override it, _TtlKernel); the batch's cleanup steps of other states run
        (_kernel_cleanup)."""
        return None, _kernel_cleanup(self, rows)

    def get_batch(self, keys, namespaces=None) -> pa.Array:
        if not _kernel_ok(self, namespaces):
            return super().get_batch(keys, namespaces)
        b = self.backend
        b.check_open()
        arr = _key_array(self, keys)
        ns = _ns_column(self, namespaces, len(arr))
        ttl, cleanup = self._kernel_ttl(len(arr))
        (kc,) = _keyed_chunks(arr, ns)
        out = self.table.native.get_batch(kc, b.key_type, b.assigner, b.max_parallelism,
                                          self.serializer.name, ttl=ttl,
                                          count_expired=_count_read(b) if ttl else None,
                                          namespace_type=self.namespace_type, cleanup=cleanup)
        return _cast_out(out, self.serializer)


class _KernelClear:
    """clear_batch through the clear kernel (batch_reads.h), any namespace: it only removes
    entries, so every state kind and value type (pickle included) is served. The rows'
    incremental TTL cleanup as the per-row path's: a step before each row (_kernel_cleanup)."""

    def clear_batch(self, keys, namespaces=None) -> None:
        if namespaces is not None and self.namespace_type == "void":
            return super().clear_batch(keys, namespaces)  # its error
        b = self.backend
        b.check_open()
        arr = _key_array(self, keys)
        ns = _ns_column(self, namespaces, len(arr))
        cleanup = _kernel_cleanup(self, len(arr))
        (kc,) = _keyed_chunks(arr, ns)
        self.table.native.clear_batch(kc, b.key_type,
                                      b.assigner, b.max_parallelism,
                                      namespace_type=self.namespace_type, cleanup=cleanup)


_STALE = object()  # a NativeState cache that matches no current key


class NativeState(states.TableState):
    """Per-record slots of native states: ``(key group, encoded key)``, cached per state object
    for the backend's current key (``backend.encoded_current_key``, compared by identity) and
    the state's current namespace, so that repeated accesses for one record encode nothing.
    set_current_key, set_current_namespace and close invalidate it; the encoded key depends on
    nothing else (restore, clear and snapshots leave it valid)."""

    _ck = _STALE  # the backend's encoded_current_key the cached slot was built for
    _cslot = None
    _ns_part = b"\x00"  # ser(namespace) [| len bytes] of the current namespace (void: 00)

    def __init__(self, *a):
        super().__init__(*a)
        # Encoded keys carry length bytes when both key and namespace are variable-width.
        self._ambiguous = (self.backend.key_serializer.fixed_width is None
                           and self.namespace_serializer.fixed_width is None)

    def set_current_namespace(self, namespace) -> None:
        old = self._namespace
        super().set_current_namespace(namespace)
        if type(self._namespace) is type(old) and self._namespace == old:
            # Equal canonical namespaces of one type serialize alike: the cached slot holds
            # (operators often set the same namespace for every record).
            return
        self._ns_part = self._encoded_namespace(self._namespace)
        self._ck = _STALE

    def _encoded_namespace(self, namespace) -> bytes:
        """The part of the encoded key after the key for ``namespace`` (canonical): ser(namespace)
        [| len bytes] (void: 00)."""
        kt = self.namespace_serializer.key_type  # None for void
        ns = b"\x00" if kt is None else kt.serialize_checked(namespace)
        if self._ambiguous:
            ns += S.len_bytes(len(ns))
        return ns

    def _encoded_key(self, ck: bytes, ns_part: bytes) -> bytes:
        """The encoded key of the backend's encoded current key ``ck`` in the namespace of
        ``ns_part`` (:meth:`_encoded_namespace`); docs/formats.md "Encoded key"."""
        if self._ambiguous:
            return ck + S.len_bytes(len(ck) - self.backend.key_prefix_width) + ns_part
        return ck + ns_part

    def _namespace_slot(self, namespace):
        b = self.backend
        b.check_open()
        _, kg = b.require_current_key()
        return kg, self._encoded_key(b.encoded_current_key, self._encoded_namespace(namespace))

    def _slot(self):
        if self._row_slot is not None:
            return self._row_slot
        b = self.backend
        if self._ck is b.encoded_current_key and b.current_key_thread == get_ident():
            return self._cslot
        b.check_open()
        _, kg = b.require_current_key()
        self.require_current_namespace()
        ck = b.encoded_current_key
        self._cslot = (kg, self._encoded_key(ck, self._ns_part))
        self._ck = ck
        return self._cslot


class NativeValueState(_KernelClear, _KernelGet, states.TableValueState, NativeState):
    def put_batch(self, keys, values, namespaces=None) -> None:
        if not _kernel_ok(self, namespaces):
            return super().put_batch(keys, values, namespaces)
        b = self.backend
        b.check_open()
        arr = _key_array(self, keys)
        vals = coerce_value_array(values, self.serializer.name, len(arr), combine=False,
                                  native_checks=True)
        ns = _ns_column(self, namespaces, len(arr))
        kc, vc = _keyed_chunks(arr, ns, vals)
        ttl, cleanup = self._kernel_ttl(len(arr))
        self.table.native.put_batch(kc, vc, b.key_type, b.assigner, b.max_parallelism,
                                    self.serializer.name, ttl=ttl,
                                    namespace_type=self.namespace_type, cleanup=cleanup)


def _reducer_kernel_ok(state, namespaces) -> bool:
    # Every fixed-width type has kernels for the reducers its descriptor allows.
    return (_kernel_ok(state, namespaces)
            and state.descriptor.reducer.name in _native.BATCH_REDUCERS
            and state.serializer.fixed_width is not None)


class NativeReducingState(_KernelClear, _KernelGet, states.TableReducingState, NativeState):
    def add_batch(self, keys, values, namespaces=None) -> pa.Array:
        if not _reducer_kernel_ok(self, namespaces):
            return super().add_batch(keys, values, namespaces)
        b = self.backend
        b.check_open()
        arr = _key_array(self, keys)
        is_count = self.descriptor.reducer.name == "count"
        vals = coerce_value_array(values, self.serializer.name, len(arr), any_type=is_count,
                                  combine=False, native_checks=True)
        if is_count and not _count_kernel_ok(vals.type):
            return super().add_batch(arr, vals, namespaces)
        ns = _ns_column(self, namespaces, len(arr))
        ttl, cleanup = self._kernel_ttl(len(arr))
        # An integer sum's overflow rollback covers one kernel call: its batch is one chunk.
        kc, vc = _keyed_chunks(arr, ns, vals, single=self.descriptor.reducer.name == "sum"
                               and self.serializer.name in ("int64", "int32", "uint64"))
        out = self.table.native.add_batch(kc, vc, b.key_type, b.assigner, b.max_parallelism,
                                          self.serializer.name, self.descriptor.reducer.name,
                                          ttl=ttl, count_expired=_count_read(b) if ttl else None,
                                          namespace_type=self.namespace_type, cleanup=cleanup)
        return _cast_out(out, self.serializer)


def _list_values(state, values, length: int):
    """append_batch values checked as the per-row path checks them
    (``TableListState.append_batch``: the element type's Arrow type or a list of it, ``length``
    rows, no null element), as
    ``(elements, parents, values)``: a flat array of one element a row with ``parents`` None,
    or a list array's elements (null rows hold none) with ``parents`` the row of each element;
    ``values`` as imported (read once). InvalidInputError otherwise."""
    t = state.batch_arrow_type("append_batch")
    name = state.serializer.name

    def is_list(typ):
        return pa.types.is_list(typ) or pa.types.is_large_list(typ)

    vals = import_arrow(values, "values", lambda typ: arrow_type_ok(name, typ) or (
        is_list(typ) and arrow_type_ok(name, typ.value_type)), native_checks=True)
    if len(vals) != length:
        raise InvalidInputError(f"values have {len(vals)} rows but keys have {length}")
    if is_list(vals.type):
        vals = combined(vals)
        check_arrow_type(vals.values, name, "list elements")
        elements = pc.list_flatten(vals)
        if elements.null_count:
            raise InvalidInputError(f"values contain {elements.null_count} null list element(s); "
                                    "list state elements must not be null")
        # Not pc.list_parent_indices: it also counts elements a null row's range spans, which
        # list_flatten leaves out.
        lengths = pc.list_value_length(vals).fill_null(0).to_numpy()
        return elements, pa.array(np.repeat(np.arange(len(vals)), lengths)), vals
    check_arrow_type(vals, name, f"values (or a list<{t}> array)")
    if vals.null_count:
        raise InvalidInputError(f"values contain {vals.null_count} null(s); list state elements "
                                "must not be null")
    return vals, None, vals


class NativeListState(_KernelClear, states.TableListState, NativeState):
    """List state over the native table: a list is chunks of up to 32 elements (NativeTable's
    list calls, docs/formats.md "List state"); the batch calls as kernels that append to a
    list's last chunk or read its chunks and keep the table's list index; ``clear_batch``
    removes every chunk of a row's (key, namespace)."""

    def _kernel_ttl(self, rows: int):
        return None, _kernel_cleanup(self, rows)  # TTL lists override it (_TtlKernel)

    def append_batch(self, keys, values, namespaces=None) -> None:
        """The list kernel (batch_collections.h) for the void namespace and every typed element
        type; a list<T> array is flattened first (its elements in row order, each row's
        elements after the previous row's: appending them one by one gives what one add_all per
        row gives, all rows sharing the batch's one clock reading under TTL). Else the
        per-row path."""
        if not _kernel_ok(self, namespaces):
            return super().append_batch(keys, values, namespaces)
        b = self.backend
        b.check_open()
        arr = _key_array(self, keys)
        rows = len(arr)
        elements, parents, values = _list_values(self, values, rows)
        if parents is not None and self._row_steps():
            # A kernel row is an element here: rows with steps of their own go row by row.
            return super().append_batch(arr, values, namespaces)
        ns = _ns_column(self, namespaces, rows)
        if parents is not None:  # take() reads every row: the keys are checked in full first
            arr = check_in_full(combined(arr), "keys").take(parents)
            ns = None if ns is None else check_in_full(combined(ns), "namespaces").take(parents)
        kc, vc = _keyed_chunks(arr, ns, elements)
        ttl, cleanup = self._kernel_ttl(rows)
        self.table.native.append_batch(kc, vc, b.key_type, b.assigner, b.max_parallelism,
                                       self.serializer.name, ttl=ttl,
                                       namespace_type=self.namespace_type, cleanup=cleanup)

    def _row_steps(self) -> bool:
        """Whether the batch rows have incremental cleanup steps of this state's own."""
        cfg = self.descriptor.ttl_config
        return cfg is not None and bool(cfg.cleanup_size)

    def get_batch(self, keys, namespaces=None) -> pa.Array:
        """The list read kernel (batch_reads.h) for any namespace and every typed element
        type: a ``list<T>`` array, one row per key, ``[]`` for an absent key (as ``get()``);
        under TTL expired elements are dropped, removed and counted as ``TtlListState.get``.
        Else the per-row path."""
        if not _kernel_ok(self, namespaces):
            return super().get_batch(keys, namespaces)
        b = self.backend
        b.check_open()
        arr = _key_array(self, keys)
        ns = _ns_column(self, namespaces, len(arr))
        ttl, cleanup = self._kernel_ttl(len(arr))
        (kc,) = _keyed_chunks(arr, ns)
        return self.table.native.list_get_batch(
            kc, b.key_type, b.assigner, b.max_parallelism, self.serializer.name, ttl=ttl,
            count_expired=_count_read(b) if ttl else None, namespace_type=self.namespace_type,
            cleanup=cleanup)


def _map_kernel_ok(state, namespaces) -> bool:
    return _kernel_ok(state, namespaces) and state.user_key_serializer.name != "pickle"


def _map_user_keys(state, user_keys, length: int):
    """The user keys of a map batch checked as the per-row path checks them
    (``TableMapState._user_keys``: the user key type's Arrow type, ``length`` rows, no nulls), as
    imported (pa.Array or pa.ChunkedArray); InvalidInputError otherwise."""
    uk_name = state.user_key_serializer.name
    uks = import_arrow(user_keys, "user_keys", lambda t: arrow_type_ok(uk_name, t),
                       native_checks=True)
    if len(uks) != length:
        raise InvalidInputError(f"user_keys have {len(uks)} rows but keys have {length}")
    check_arrow_type(uks, uk_name, "user_keys")
    if uks.null_count:
        raise InvalidInputError(f"user_keys contain {uks.null_count} null(s); map user keys "
                                "must not be null")
    return uks


class NativeMapState(_KernelClear, states.TableMapState, NativeState):
    """Map state over the native table: one entry per user key (NativeTable's map calls), the
    batch calls as kernels that touch one entry per row and keep the table's map index;
    ``clear_batch`` removes every entry the index lists for a row's (key, namespace)."""

    def _kernel_ttl(self, rows: int):
        return None, _kernel_cleanup(self, rows)  # TTL maps override it (_TtlKernel)

    def put_batch(self, keys, user_keys, values, namespaces=None) -> None:
        """The map kernel (batch_collections.h: one entry per row, listed in the table's map
        index) for any namespace, typed user keys and typed values; else the per-row path.
        Checks as ``TableMapState.put_batch``: user keys of the user key type's Arrow type, no
        null user key or value, equal lengths."""
        if not _map_kernel_ok(self, namespaces):
            return super().put_batch(keys, user_keys, values, namespaces)
        b = self.backend
        b.check_open()
        self.batch_arrow_type("put_batch")
        arr = _key_array(self, keys)
        uk_name = self.user_key_serializer.name
        uks = _map_user_keys(self, user_keys, len(arr))
        vals = coerce_value_array(values, self.serializer.name, len(arr), combine=False,
                                  native_checks=True)
        if vals.null_count:
            raise InvalidInputError(f"values contain {vals.null_count} null(s); use remove_batch "
                                    "to remove user keys")
        ns = _ns_column(self, namespaces, len(arr))
        kc, uc, vc = _keyed_chunks(arr, ns, uks, vals)
        ttl, cleanup = self._kernel_ttl(len(arr))
        self.table.native.map_put_batch(kc, uc, vc, b.key_type, b.assigner, b.max_parallelism,
                                        uk_name, self.serializer.name, ttl=ttl,
                                        namespace_type=self.namespace_type, cleanup=cleanup)

    def _read_kernel(self, method: str, keys, user_keys, namespaces):
        # get_batch / contains_batch through the map read kernels (see get_batch).
        b = self.backend
        b.check_open()
        self.batch_arrow_type(method)
        arr = _key_array(self, keys)
        uks = _map_user_keys(self, user_keys, len(arr))
        ns = _ns_column(self, namespaces, len(arr))
        ttl, cleanup = self._kernel_ttl(len(arr))
        kc, uc = _keyed_chunks(arr, ns, uks)
        fn = getattr(self.table.native, "map_" + method)
        return fn(kc, uc, b.key_type, b.assigner,
                  b.max_parallelism, self.user_key_serializer.name, self.serializer.name, ttl=ttl,
                  count_expired=_count_read(b) if ttl else None, namespace_type=self.namespace_type,
                  cleanup=cleanup)

    def get_batch(self, keys, user_keys, namespaces=None) -> pa.Array:
        """The map read kernel (batch_reads.h) for any namespace, typed user keys and
        values: the value of each (key, user key), null where absent; under TTL as
        ``TtlMapState.get`` (an expired pair removed and counted, shown once under
        return_expired, renewed under update_on_read). Else the per-row path."""
        if not _map_kernel_ok(self, namespaces):
            return super().get_batch(keys, user_keys, namespaces)
        out = self._read_kernel("get_batch", keys, user_keys, namespaces)
        return _cast_out(out, self.serializer)

    def contains_batch(self, keys, user_keys, namespaces=None) -> pa.Array:
        """As get_batch (the same reads, TTL effects included), a bool array: true where a
        value is shown."""
        if not _map_kernel_ok(self, namespaces):
            return super().contains_batch(keys, user_keys, namespaces)
        return self._read_kernel("contains_batch", keys, user_keys, namespaces)

    def remove_batch(self, keys, user_keys, namespaces=None) -> None:
        """The map removal kernel (batch_reads.h): removes the entry of each (key, user key) in
        row order and unlists it; with TTL nothing is read or counted (as ``remove``)."""
        # Value bytes are skipped, not decoded: any value type, pickle included.
        if ((namespaces is not None and self.namespace_type == "void")
                or self.user_key_serializer.name == "pickle"):
            return super().remove_batch(keys, user_keys, namespaces)
        b = self.backend
        b.check_open()
        arr = _key_array(self, keys)
        uks = _map_user_keys(self, user_keys, len(arr))
        ns = _ns_column(self, namespaces, len(arr))
        _, cleanup = self._kernel_ttl(len(arr))  # the kernel reads no timestamp
        kc, uc = _keyed_chunks(arr, ns, uks)
        self.table.native.map_remove_batch(kc, uc, b.key_type, b.assigner, b.max_parallelism,
                                           self.user_key_serializer.name,
                                           namespace_type=self.namespace_type, cleanup=cleanup)


class NativeAggregatingState(_KernelClear, states.TableAggregatingState, NativeState):
    pass


#: ``{state kind: class}`` of native states without TTL (``NativeBackend.state_classes``).
STATE_CLASSES = {"value": NativeValueState, "list": NativeListState, "map": NativeMapState,
                 "reducing": NativeReducingState, "aggregating": NativeAggregatingState}


# TTL-enabled states: ttl_states.py's classes (per-record calls and the batch calls
# the kernels do not serve) with the batch calls the kernels serve run natively, TTL on. The
# clock is read once per batch (ttl_now, ms): the Python path stamps its writes with one reading
# too, and re-reads it per present row for expiry decisions, which is the same reading unless the
# clock moves during the call.

class _TtlKernel:
    """The kernels run with TTL on: ``cleanup`` the incremental cleanup steps before each row
    (_kernel_cleanup; None without ``cleanup_incrementally``), then ``ttl = (ttl_ms, now,
    update_on_read, return_expired)``; expired entries the kernels' reads remove are counted
    as ``read``, the steps' as ``incremental``. On an int64 sum overflow the aggregates are
    unchanged while what the steps and earlier null rows removed stays removed (and counted),
    as in ``TtlReducingState.add_batch``."""

    def _kernel_ttl(self, rows: int):
        cleanup = _kernel_cleanup(self, rows)
        return _ttl_kernel_args(self), cleanup


def _ttl_kernel_args(state) -> tuple:
    cfg = state.ttl_config
    return (cfg.ttl_ms, state.backend.ttl_now(cfg), cfg.update_on_read, cfg.return_expired)


def _count_read(backend):
    return lambda n: backend.count_expired("read", n)


# MRO: the kernel methods first; their fallbacks (super()) reach ttl_states' Python TTL paths.
class NativeTtlValueState(_TtlKernel, NativeValueState, ttl_states.TtlValueState):
    pass


class NativeTtlReducingState(_TtlKernel, NativeReducingState, ttl_states.TtlReducingState):
    pass


class NativeTtlListState(_TtlKernel, NativeListState, ttl_states.TtlListState):
    pass


class NativeTtlMapState(_TtlKernel, NativeMapState, ttl_states.TtlMapState):
    pass


class NativeTtlAggregatingState(_KernelClear, ttl_states.TtlAggregatingState, NativeState):
    pass


#: ``{state kind: class}`` of TTL-enabled native states (``NativeBackend.ttl_state_classes``).
TTL_STATE_CLASSES = {"value": NativeTtlValueState, "list": NativeTtlListState,
                     "map": NativeTtlMapState, "reducing": NativeTtlReducingState,
                     "aggregating": NativeTtlAggregatingState}

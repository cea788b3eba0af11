"""Bootstrap a checkpoint from data: version 0 of a new checkpoint root holding initial state.

Flink's State Processor API writes a savepoint from a batch computation (``SavepointWriter``
with a ``KeyedStateBootstrapFunction``) and Spark hands ``transformWithState`` /
``flatMapGroupsWithState`` an ``initialState``; both let a new streaming job start from state a
batch query computed. :func:`bootstrap_checkpoint` is statecore's counterpart: it takes Arrow
data per state (:class:`StateInput`: a descriptor, its rows and its namespace type) and
optionally event- and processing-time timers, assigns every key its key group (Flink's
``KeyGroupRangeAssignment`` with Spark's or Flink's hash, as the rest of statecore), encodes
the entries exactly as the backends store them (docs/formats.md "Encoded key", "Values", "List
state", "Map state", timers) and writes them as full runs of version 0, which both backends
restore, :func:`statecore.offline.read_state` reads and ``statecore inspect`` shows.

The rows' columns are those :func:`statecore.offline.read_state` yields, so its output
bootstraps a checkpoint as it is (``key_group`` is recomputed, not read):

* ``key``: the key type's Arrow type (a struct for a multi-column key), no nulls;
* ``namespace``: the namespace type's Arrow type, no nulls; absent (or of null type) for the
  void namespace;
* ``user_key``: a map state's user key (int32, int64, string or binary user key types), no
  nulls; for a list state optionally the element's position in its list (an unsigned or signed
  integer: the elements of a list are stored in position order, positions unique per list);
  absent (or of null type) otherwise;
* ``value``: a value state's value, a reducing or aggregating state's accumulator (the stored
  form: what the reduce or aggregate function would have produced), a map's user value, a list
  element (one row per element, in list order unless positions say otherwise) or a whole list
  (``list<element type>``: one row per list; rows of the same key and namespace append). The
  value type's Arrow type; a ``pickle`` value type takes binary holding the pickle bytes,
  stored as they are (no code runs). No nulls;
* ``ttl_timestamp_ms``: for a state with TTL, the last-access timestamp to store (int64 ms or a
  timestamp); a null, or no such column, stores the TTL clock's reading, as a write would:
  ``now_ms`` (default: the wall clock at the call) for processing-time TTL, ``watermark_ms``
  (the watermark the job continues from; required then) for event-time TTL. A state without
  TTL takes none.

Timers (``timers=``): ``key``, ``timestamp_ms`` (int64 ms or a timestamp), optionally
``namespace`` (of ``timer_namespace_type``) and ``processing_time`` (bool; default event time).
A timer given twice is one timer.

Errors: InvalidInputError naming the state, column and row for a missing or unknown column, a
wrong Arrow type, a null key, namespace, user key or value, a key or namespace given twice for
a value, reducing or aggregating state, a user key given twice in one map, a list position
given twice, a TTL timestamp for a state without TTL; nothing is committed then.

Memory: the input of every state is read once per pass; a pass holds the encoded entries of a
contiguous range of key groups. The first pass covers all key groups; a pass whose entries
outgrow ``memory_bytes`` stops and its range is split in two, so each range written holds at
most about ``memory_bytes`` of keys and values (a single key group more, when it alone is
larger). Each range becomes one data file of the version.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import pyarrow as pa
import pyarrow.compute as pc

from statecore import key_types as KT
from statecore import serializers as S
from statecore.checkpoint import CheckpointStore
from statecore.descriptors import StateDescriptor
from statecore.errors import InvalidInputError, StateError
from statecore.key_groups import assign_key_group, check_max_parallelism
from statecore.offline.entry_snapshot import EntrySnapshot
from statecore.timers import TIMERS_STATE_NAME

__all__ = ["StateInput", "BootstrapPlan", "bootstrap_checkpoint", "check_empty",
           "native_key_encoder", "state_input", "DEFAULT_MEMORY_BYTES"]

#: Default bound of the encoded entries one pass holds (bytes of keys and values).
DEFAULT_MEMORY_BYTES = 256 * 1024 * 1024

_BATCH_ROWS = 65_536
_KINDS = ("value", "reducing", "aggregating", "list", "map")
_INT_DTYPES = {"int32": "<i4", "int64": "<i8", "uint64": "<u8", "timestamp": "<i8"}
_STATE_COLUMNS = {"key_group", "key", "namespace", "user_key", "value", "ttl_timestamp_ms"}
_TIMER_COLUMNS = {"key_group", "key", "namespace", "timestamp_ms", "processing_time"}


@dataclass
class StateInput:
    """One state to bootstrap: ``descriptor`` (a :class:`statecore.descriptors.StateDescriptor`:
    name, kind, value type, TTL), ``data`` (its rows, module docstring: a ``pa.Table``, a
    ``pa.RecordBatch``, a ``pyarrow.dataset.Dataset`` or a function returning an iterable of
    record batches, called once per pass) and ``namespace_type`` (``"void"``, ``"int32"``,
    ``"int64"``, ``"string"`` or ``"binary"``, as the job's ``get_state`` registers it)."""

    descriptor: StateDescriptor
    data: Any
    namespace_type: str = "void"


class _PassTooLarge(Exception):
    """A pass's entries outgrew its memory bound."""


def _batches(data, what: str) -> Iterator[pa.RecordBatch]:
    """The record batches of ``data`` (module docstring), read anew at each call."""
    if isinstance(data, pa.Table):
        yield from data.to_batches(max_chunksize=_BATCH_ROWS)
        return
    if isinstance(data, pa.RecordBatch):
        yield data
        return
    try:
        import pyarrow.dataset as pads

        if isinstance(data, pads.Dataset):
            yield from data.to_batches(batch_size=_BATCH_ROWS)
            return
    except ImportError:  # pragma: no cover - pyarrow without its dataset module
        pass
    if callable(data):
        for b in data():
            if isinstance(b, pa.Table):
                yield from b.to_batches(max_chunksize=_BATCH_ROWS)
            elif isinstance(b, pa.RecordBatch):
                yield b
            else:
                raise InvalidInputError(f"{what}: the data function yielded a "
                                        f"{type(b).__name__}, not a pyarrow RecordBatch or Table")
        return
    raise InvalidInputError(
        f"{what}: data must be a pyarrow Table, RecordBatch, pyarrow.dataset.Dataset or a "
        f"function returning record batches (read once per pass), got {type(data).__name__}")


def _is_null_type(batch: pa.RecordBatch, name: str) -> bool:
    """True when ``name`` is absent or of null type (read_state's column of a void namespace or
    a state without user keys)."""
    i = batch.schema.get_field_index(name)
    return i < 0 or pa.types.is_null(batch.schema.field(i).type)


def _first_null(arr: pa.Array) -> int:
    return int(pc.index(pc.is_null(arr), True).as_py())


def _no_nulls(arr: pa.Array, what: str) -> None:
    if arr.null_count:
        raise InvalidInputError(f"{what} has {arr.null_count} null(s) (first at row "
                                f"{_first_null(arr)})")


def _timestamps_ms(arr: pa.Array, what: str) -> list:
    """ms since the epoch (Python ints, None for nulls) of an int64 or timestamp column."""
    t = arr.type
    if pa.types.is_timestamp(t):
        unit = {"s": 1000, "ms": 1, "us": 1_000, "ns": 1_000_000}[t.unit]
        raw = arr.cast(pa.int64()).to_pylist()
        if t.unit == "s":
            return [None if v is None else v * unit for v in raw]
        return [None if v is None else v // unit for v in raw]
    if pa.types.is_integer(t):
        return arr.cast(pa.int64()).to_pylist()
    raise InvalidInputError(f"{what} must be int64 (ms) or a timestamp, got {t}")


def _key_column(batch: pa.RecordBatch, kt: KT.KeyType, what: str) -> list:
    if batch.schema.get_field_index("key") < 0:
        raise InvalidInputError(f"{what}: no 'key' column (columns: {batch.schema.names})")
    arr = batch.column("key")
    if not kt.accepts(arr.type):
        raise InvalidInputError(f"{what}: column 'key' must have Arrow type "
                                f"{kt.describe_arrow()} (key type {kt.name}), got {arr.type}")
    _no_nulls(arr, f"{what}: column 'key'")
    if kt.is_struct:
        for i in range(len(kt.fields)):
            _no_nulls(arr.field(i), f"{what}: field {i} of column 'key'")
    return kt.to_pylist(arr)


def _typed_column(batch: pa.RecordBatch, name: str, type_name: str, what: str) -> list:
    """Python values of column ``name`` of a key type ``type_name`` (namespaces, user keys)."""
    kt = KT.key_type(type_name)
    arr = batch.column(name)
    if not kt.accepts(arr.type):
        raise InvalidInputError(f"{what}: column {name!r} must have Arrow type "
                                f"{kt.describe_arrow()} ({type_name}), got {arr.type}")
    _no_nulls(arr, f"{what}: column {name!r}")
    return kt.to_pylist(arr)


def _check_columns(batch: pa.RecordBatch, allowed: set, what: str) -> None:
    extra = [c for c in batch.schema.names if c not in allowed]
    if extra:
        raise InvalidInputError(f"{what}: unknown column(s) {extra}; expected some of "
                                f"{sorted(allowed)}")


def state_input(s) -> StateInput:
    """``s`` as a :class:`StateInput` (from a ``(descriptor, data[, namespace_type])`` tuple);
    InvalidInputError for anything else."""
    if isinstance(s, StateInput):
        return s
    if isinstance(s, tuple) and len(s) in (2, 3):
        return StateInput(*s)
    raise InvalidInputError(f"a state to bootstrap must be a StateInput or a (descriptor, data[, "
                            f"namespace_type]) tuple, got {type(s).__name__}")


def native_key_encoder(key_type: str, assigner: str, max_parallelism: int):
    """The native extension's ``KeyEncoder(...).encode`` over all key groups (``key -> (canonical
    key, key group, prefix | ser(key))``), or None when the extension does not import."""
    try:
        from statecore import _native
    except ImportError:
        return None
    mp = max_parallelism
    return _native.KeyEncoder(key_type, assigner, mp, 0, mp - 1, f"0..{mp - 1}").encode


class _State:
    """One :class:`StateInput`, checked: its meta and serializers."""

    def __init__(self, inp: StateInput, key_type: str):
        d = inp.descriptor
        if not isinstance(d, StateDescriptor) or d.kind not in _KINDS:
            raise InvalidInputError(
                f"StateInput.descriptor must be a value, list, map, reducing or aggregating "
                f"state descriptor, got {d!r}")
        if inp.namespace_type not in S.NAMESPACE_TYPES:
            raise InvalidInputError(
                f"state {d.name!r}: namespace_type must be one of {S.NAMESPACE_TYPES}, got "
                f"{inp.namespace_type!r}")
        self.name = d.name
        self.what = f"state {d.name!r}"
        self.kind = d.kind
        self.data = inp.data
        self.meta = dict(d.meta(), namespace_type=inp.namespace_type)
        self.ns_type = inp.namespace_type
        self.ns_ser = S.key_serializer(inp.namespace_type)
        self.void_ns = self.ns_ser.serialize(None) if inp.namespace_type == "void" else None
        self.vser = S.value_serializer(self.meta["value_type"])
        self.ttl = d.ttl_config
        self.uk_ser = None
        if self.kind == "map":
            if self.meta["user_key_type"] == "pickle":
                raise InvalidInputError(
                    f"{self.what}: a map with pickle user keys cannot be bootstrapped from Arrow "
                    "data; use an int32, int64, string or binary user key type")
            self.uk_ser = S.key_serializer(self.meta["user_key_type"])

    def value_bytes(self, arr: pa.Array, what: str) -> list:
        """Stored bytes (without TTL suffix) of every value of ``arr`` (no nulls)."""
        vser = self.vser
        if vser.name == "pickle":
            if arr.type not in (pa.binary(), pa.large_binary()):
                raise InvalidInputError(f"{what} must be binary holding pickle bytes (value "
                                        f"type pickle), got {arr.type}")
            _no_nulls(arr, what)
            return arr.to_pylist()
        if not vser.accepts(arr.type):
            raise InvalidInputError(f"{what} must have Arrow type {vser.describe_arrow()} "
                                    f"({vser.name}), got {arr.type}")
        _no_nulls(arr, what)
        dtype = _INT_DTYPES.get(vser.kind)
        if dtype is not None:
            # Little-endian fixed-width integers (docs/formats.md "Values"): the column's
            # values as they are, cut per row.
            if vser.kind == "timestamp":
                arr = arr.cast(pa.int64())
            buf = arr.to_numpy(zero_copy_only=False).astype(dtype, copy=False).tobytes()
            w = vser.fixed_width
            return [buf[i:i + w] for i in range(0, len(buf), w)]
        ser = vser.serialize
        return [ser(v) for v in vser.to_pylist(arr)]


class BootstrapPlan:
    """Checked inputs of a bootstrap, picklable (the Spark entry point ships it to its tasks):
    ``states`` (:class:`StateInput` list), ``key_type``, ``max_parallelism``, ``timers`` (timer
    rows, module docstring, or None), ``timer_namespace_type``, ``assigner`` ("spark" or
    "flink"), ``now_ms`` and ``watermark_ms`` (the TTL clocks' readings for rows without a TTL
    timestamp: processing time, default the wall clock at construction; event time, the
    watermark). :meth:`write_runs` writes the data files of a range of key groups;
    :attr:`metas` are the version's state metas. InvalidInputError for bad arguments (module
    docstring)."""

    def __init__(self, states: Sequence[StateInput], *, key_type, max_parallelism: int,
                 timers: Any = None, timer_namespace_type: str = "void", assigner: str = "spark",
                 now_ms: Optional[int] = None, watermark_ms: Optional[int] = None):
        self.max_parallelism = check_max_parallelism(max_parallelism)
        self.key_type = KT.key_type(key_type).name
        self.kt = KT.key_type(self.key_type)
        self.key_ser = S.key_serializer(self.key_type)
        if assigner not in ("spark", "flink"):
            raise InvalidInputError(f"assigner must be 'spark' or 'flink', got {assigner!r}")
        self.assigner = assigner
        if timer_namespace_type not in S.NAMESPACE_TYPES:
            raise InvalidInputError(f"timer_namespace_type must be one of {S.NAMESPACE_TYPES}, "
                                    f"got {timer_namespace_type!r}")
        self.timer_ns_type = timer_namespace_type
        for name, v in (("now_ms", now_ms), ("watermark_ms", watermark_ms)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise InvalidInputError(f"{name} must be an int (ms) or None, got {v!r}")
        self.now_ms = now_ms
        self.watermark_ms = watermark_ms
        self.wall_ms = time.time_ns() // 1_000_000
        if isinstance(states, StateInput):
            states = [states]
        #: the states as StateInput
        self.inputs = [state_input(s) for s in states]
        self.states = [_State(s, self.key_type) for s in self.inputs]
        names = [s.name for s in self.states]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise InvalidInputError(f"states {dup} are given more than once")
        self.timers = timers
        self.metas = [s.meta for s in self.states] + [
            {"name": TIMERS_STATE_NAME, "kind": "timers", "namespace_type": timer_namespace_type,
             "value_type": "binary"}]

    # ------------------------------------------------------------------------ encoding

    def _ttl_now(self, st: _State) -> int:
        if st.ttl.event_time:
            if self.watermark_ms is None:
                raise InvalidInputError(
                    f"{st.what} has event-time TTL: rows without ttl_timestamp_ms need "
                    "watermark_ms (the watermark the state is stamped with)")
            return self.watermark_ms
        return self.wall_ms if self.now_ms is None else self.now_ms

    def _suffixes(self, st: _State, batch: pa.RecordBatch, rows: List[int]) -> list:
        """Per row of ``rows``: the 8-byte TTL suffix, or b"" for a state without TTL."""
        has = not _is_null_type(batch, "ttl_timestamp_ms")
        if st.ttl is None:
            if has and batch.column("ttl_timestamp_ms").null_count < batch.num_rows:
                raise InvalidInputError(f"{st.what} has no TTL but column 'ttl_timestamp_ms' "
                                        "holds timestamps")
            return [b""] * len(rows)
        ts = (_timestamps_ms(batch.column("ttl_timestamp_ms"), f"{st.what}: column "
                             "'ttl_timestamp_ms'") if has else None)
        out = []
        now = None
        for r in rows:
            t = ts[r] if ts is not None else None
            if t is None:
                if now is None:
                    now = self._ttl_now(st)
                t = now
            if not -(1 << 63) <= t < (1 << 63):
                raise InvalidInputError(f"{st.what}: TTL timestamp {t} ms does not fit in int64")
            out.append(t.to_bytes(8, "big", signed=True))
        return out

    def _key_parts(self, keys: list) -> Tuple[list, Optional[list]]:
        """``(key groups, key parts)`` of ``keys``: the key part is ``prefix | ser(key)`` of
        each key (docs/formats.md "Encoded key"), from the native extension's key encoder
        (one call a key); without the extension the key groups alone (key parts None)."""
        mp, kt, assigner = self.max_parallelism, self.key_type, self.assigner
        enc = native_key_encoder(kt, assigner, mp)
        if enc is None:
            return [assign_key_group(k, kt, mp, assigner) for k in keys], None
        kgs, parts = [], []
        for k in keys:
            _, kg, part = enc(k)
            kgs.append(kg)
            parts.append(part)
        return kgs, parts

    def _encoded_key(self, st: "_State", kg: int, key, part: Optional[bytes], ns) -> bytes:
        """The encoded key of ``(kg, key, ns)`` for state ``st``: :func:`S.encode_key`, or
        from the key part :meth:`_key_parts` gave."""
        if part is None:
            return S.encode_key(kg, self.max_parallelism, key, self.key_ser, ns, st.ns_ser)
        nb = st.void_ns if ns is None else st.ns_ser.serialize(ns)
        if self.key_ser.fixed_width is None and st.ns_ser.fixed_width is None:
            pw = 1 if self.max_parallelism <= 128 else 2
            return b"".join((part, S.len_bytes(len(part) - pw), nb, S.len_bytes(len(nb))))
        return part + nb

    def _rows_in(self, kgs: list, lo: int, hi: int, bounds: Tuple[int, int], what: str) -> list:
        if bounds[0] > 0 or bounds[1] < self.max_parallelism - 1:
            for r, kg in enumerate(kgs):
                if not bounds[0] <= kg <= bounds[1]:
                    raise StateError(f"{what}: row {r} has a key of key group {kg}, outside "
                                     f"this task's key groups {bounds[0]}..{bounds[1]} (the "
                                     "rows were routed by another key type or hash)")
        return [r for r, kg in enumerate(kgs) if lo <= kg <= hi]

    def _collect_state(self, st: _State, lo: int, hi: int, bounds, budget: List[int]) -> dict:
        """``{kg: [(key bytes, value bytes)]}`` of state ``st`` in key groups ``[lo, hi]``."""
        out: Dict[int, Dict[bytes, bytes]] = {}
        lists: Dict[int, Dict[bytes, tuple]] = {}
        allowed = set(_STATE_COLUMNS)
        for batch in _batches(st.data, st.what):
            _check_columns(batch, allowed, st.what)
            keys = _key_column(batch, self.kt, st.what)
            kgs, parts = self._key_parts(keys)
            rows = self._rows_in(kgs, lo, hi, bounds, st.what)
            if st.ns_type == "void":
                if not _is_null_type(batch, "namespace"):
                    raise InvalidInputError(f"{st.what} has the void namespace: column "
                                            "'namespace' must be absent or of null type")
                nss = None
            else:
                if batch.schema.get_field_index("namespace") < 0:
                    raise InvalidInputError(f"{st.what}: no 'namespace' column (namespace type "
                                            f"{st.ns_type})")
                nss = _typed_column(batch, "namespace", st.ns_type, st.what)
            if batch.schema.get_field_index("value") < 0:
                raise InvalidInputError(f"{st.what}: no 'value' column")
            values = batch.column("value")
            positions = None
            if st.kind == "map":
                if _is_null_type(batch, "user_key"):
                    raise InvalidInputError(f"{st.what} is a map state: it needs a 'user_key' "
                                            "column")
                uks = _typed_column(batch, "user_key", st.meta["user_key_type"], st.what)
            elif st.kind == "list":
                if not _is_null_type(batch, "user_key"):
                    pos = batch.column("user_key")
                    if not pa.types.is_integer(pos.type):
                        raise InvalidInputError(f"{st.what}: column 'user_key' (list positions) "
                                                f"must be integers, got {pos.type}")
                    _no_nulls(pos, f"{st.what}: column 'user_key'")
                    positions = pos.cast(pa.int64()).to_pylist()
            elif not _is_null_type(batch, "user_key"):
                raise InvalidInputError(f"{st.what} is a {st.kind} state: column 'user_key' must "
                                        "be absent or of null type")
            whole_lists = st.kind == "list" and (pa.types.is_list(values.type)
                                                 or pa.types.is_large_list(values.type))
            if whole_lists:
                if positions is not None:
                    raise InvalidInputError(f"{st.what}: list positions ('user_key') go with one "
                                            "row per element, not with a list column")
                _no_nulls(values, f"{st.what}: column 'value'")
            # Validate every row's value, in the pass's range or not, so that a bad row fails
            # the first pass.
            if whole_lists:
                flat = values.flatten()
                elems = st.value_bytes(flat, f"{st.what}: the elements of column 'value'")
                offs = values.offsets.to_pylist()
                base = offs[0]
                vbytes = [elems[offs[r] - base:offs[r + 1] - base] for r in range(len(values))]
            else:
                vbytes = st.value_bytes(values, f"{st.what}: column 'value'")
            sfx = self._suffixes(st, batch, rows)
            for i, r in enumerate(rows):
                kg = kgs[r]
                kb = self._encoded_key(st, kg, keys[r], None if parts is None else parts[r],
                                       None if nss is None else nss[r])
                if st.kind == "list":
                    # Per list: its elements in arrival order and their positions, if given.
                    per = lists.setdefault(kg, {}).get(kb)
                    if per is None:
                        per = lists[kg][kb] = ([], [])
                    items = vbytes[r] if whole_lists else [vbytes[r]]
                    if sfx[i]:
                        items = [e + sfx[i] for e in items]
                    per[0].extend(items)
                    if positions is not None:
                        per[1].append(positions[r])
                    budget[0] += (len(kb) + 16) * len(items) + sum(map(len, items))
                else:
                    if st.kind == "map":
                        kb += st.uk_ser.serialize(uks[r])
                    group = out.setdefault(kg, {})
                    if kb in group:
                        what = ("user key " + repr(uks[r]) + " of key " if st.kind == "map"
                                else "key ")
                        ns = "" if nss is None else f" (namespace {nss[r]!r})"
                        raise InvalidInputError(f"{st.what}: {what}{keys[r]!r}{ns} is given "
                                                "more than once")
                    group[kb] = vbytes[r] + sfx[i]
                    budget[0] += len(kb) + len(group[kb])
                if budget[0] > budget[1] and hi > lo:
                    raise _PassTooLarge()
        result = {kg: list(g.items()) for kg, g in out.items()}
        for kg, per_prefix in lists.items():
            ks_, vs_ = [], []
            for prefix, (elems, pos) in sorted(per_prefix.items()):
                if pos:
                    if len(pos) != len(elems):
                        raise InvalidInputError(f"{st.what}: a list has positions ('user_key') "
                                                "for some of its elements only")
                    order = sorted(range(len(elems)), key=pos.__getitem__)
                    for a, b in zip(order, order[1:]):
                        if pos[a] == pos[b]:
                            raise InvalidInputError(f"{st.what}: position {pos[a]} is given "
                                                    f"more than once in one list")
                    elems = [elems[j] for j in order]
                ks_ += [prefix + j.to_bytes(S.LIST_SEQ_BYTES, "big") for j in range(len(elems))]
                vs_ += elems
            ck, cv = S.chunk_list_entries(ks_, vs_, st.vser.fixed_width, st.ttl is not None)
            result[kg] = list(zip(ck, cv))
        return result

    def _collect_timers(self, lo: int, hi: int, bounds, budget: List[int]) -> dict:
        mp, ks = self.max_parallelism, self.key_ser
        ns_ser = S.key_serializer(self.timer_ns_type)
        out: Dict[int, set] = {}
        what = "timers"
        for batch in _batches(self.timers, what):
            _check_columns(batch, _TIMER_COLUMNS, what)
            keys = _key_column(batch, self.kt, what)
            kgs, _ = self._key_parts(keys)
            rows = self._rows_in(kgs, lo, hi, bounds, what)
            if batch.schema.get_field_index("timestamp_ms") < 0:
                raise InvalidInputError("timers: no 'timestamp_ms' column")
            ts_arr = batch.column("timestamp_ms")
            _no_nulls(ts_arr, "timers: column 'timestamp_ms'")
            ts = _timestamps_ms(ts_arr, "timers: column 'timestamp_ms'")
            if self.timer_ns_type == "void":
                if not _is_null_type(batch, "namespace"):
                    raise InvalidInputError("timers have the void namespace: column "
                                            "'namespace' must be absent or of null type")
                nss = None
            else:
                nss = _typed_column(batch, "namespace", self.timer_ns_type, what)
            proc = None
            if batch.schema.get_field_index("processing_time") >= 0:
                p = batch.column("processing_time")
                if not pa.types.is_boolean(p.type):
                    raise InvalidInputError(f"timers: column 'processing_time' must be bool, got "
                                            f"{p.type}")
                _no_nulls(p, "timers: column 'processing_time'")
                proc = p.to_pylist()
            for r in rows:
                kb = S.encode_timer_key(kgs[r], mp, ts[r], keys[r], ks,
                                        None if nss is None else nss[r], ns_ser,
                                        processing_time=bool(proc[r]) if proc else False)
                out.setdefault(kgs[r], set()).add(kb)
                budget[0] += len(kb)
                if budget[0] > budget[1] and hi > lo:
                    raise _PassTooLarge()
        return {kg: [(k, b"") for k in keys_] for kg, keys_ in out.items()}

    def collect(self, lo: int, hi: int, memory_bytes: int,
                bounds: Optional[Tuple[int, int]] = None) -> dict:
        """``{state name: {kg: [(key bytes, value bytes)]}}`` of key groups ``[lo, hi]``, every
        state and the timers; raises _PassTooLarge past ``memory_bytes`` (when ``lo < hi``).
        ``bounds``: the key groups every row must fall into (StateError otherwise)."""
        bounds = bounds if bounds is not None else (0, self.max_parallelism - 1)
        budget = [0, memory_bytes]
        data = {st.name: self._collect_state(st, lo, hi, bounds, budget) for st in self.states}
        data[TIMERS_STATE_NAME] = ({} if self.timers is None
                                   else self._collect_timers(lo, hi, bounds, budget))
        return data

    def write_runs(self, store: CheckpointStore, lo: int, hi: int, writer: str, *,
                   version: int = 0, memory_bytes: int = DEFAULT_MEMORY_BYTES,
                   strict: bool = False) -> List[dict]:
        """Write the entries of key groups ``[lo, hi]`` as full runs of ``version`` in
        ``store``, one data file per range of a pass (writers ``<writer>-0``, ``-1``, ...);
        returns their descriptors (for ``CheckpointStore.commit``), ascending by key group.
        ``strict``: every row must have a key of ``[lo, hi]`` (a task of routed rows), else
        StateError. Errors: module docstring."""
        if isinstance(memory_bytes, bool) or not isinstance(memory_bytes, int) \
                or memory_bytes < 1:
            raise InvalidInputError(f"memory_bytes must be a positive int, got {memory_bytes!r}")
        bounds = (lo, hi) if strict else None
        todo = [(lo, hi)]
        out: List[dict] = []
        while todo:
            a, b = todo.pop()
            try:
                data = self.collect(a, b, memory_bytes, bounds)
            except _PassTooLarge:
                m = (a + b) // 2
                todo += [(m + 1, b), (a, m)]
                continue
            snap = EntrySnapshot(self.max_parallelism, a, b, self.key_type, self.assigner,
                                 self.metas, data)
            try:
                out.append(store.write_snapshot(snap, version, f"{writer}-{len(out)}"))
            finally:
                snap.release()
        return out

    def metadata(self, descriptors: List[dict], extra: Optional[Dict[str, Any]] = None) -> dict:
        """The committed metadata of a bootstrapped version: a non-final flush without a query
        id (``flush`` True, ``final`` False, ``batch_id`` None, ``batch_offset`` 0: the next
        micro-batch of any Spark query opens a new stream at version 1,
        :mod:`statecore.spark.versions`), ``bootstrap`` True, ``max_parallelism``,
        ``key_type``, ``assigner``, ``state_entries`` (entries written, timers included),
        ``writers``, ``watermark_ms`` when given; then ``extra``."""
        meta = {"bootstrap": True, "flush": True, "final": False, "batch_id": None,
                "batch_offset": 0, "max_parallelism": self.max_parallelism,
                "key_type": self.key_type, "assigner": self.assigner,
                "state_entries": sum(int(n) for d in descriptors
                                     for n in (d.get("entries") or {}).values()),
                "writers": [d["writer"] for d in descriptors]}
        if self.watermark_ms is not None:
            meta["watermark_ms"] = self.watermark_ms
        meta.update(extra or {})
        return meta


def check_empty(store: CheckpointStore, what: str) -> None:
    """StateError when ``store`` holds a committed version: a bootstrap writes version 0 of a
    new checkpoint only."""
    versions = store.versions()
    if versions:
        raise StateError(f"{what}: checkpoint {store.uri} already holds versions "
                         f"{versions[-5:]}; a bootstrap writes version 0 of an empty checkpoint")


def bootstrap_checkpoint(store, states: Sequence[StateInput], *, key_type,
                         max_parallelism: int = 128, timers: Any = None,
                         timer_namespace_type: str = "void", assigner: str = "spark",
                         now_ms: Optional[int] = None, watermark_ms: Optional[int] = None,
                         metadata: Optional[Dict[str, Any]] = None,
                         memory_bytes: int = DEFAULT_MEMORY_BYTES) -> dict:
    """Write ``states`` (:class:`StateInput` list, or ``(descriptor, data[, namespace_type])``
    tuples) and ``timers`` as version 0 of the empty checkpoint root ``store`` (a
    :class:`~statecore.checkpoint.CheckpointStore`, a directory or a ``pyarrow.fs`` URI) with
    keys of ``key_type`` (a key type name, e.g. "string", "int64", "struct<string,int64>")
    in ``max_parallelism`` key groups; returns the committed manifest (dict).

    Rows and columns, TTL timestamps, timers and memory: module docstring. ``assigner``: the
    key-group hash ("spark", the Spark operator's, or "flink"). ``now_ms``, ``watermark_ms``:
    the TTL clocks (module docstring); ``watermark_ms`` is also committed as the version's
    watermark, which a Spark operator continuing from it hands to its next micro-batch.
    ``metadata``: JSON-able fields added to the version's metadata
    (:meth:`BootstrapPlan.metadata`).

    Raises StateError when ``store`` already holds a committed version, InvalidInputError for
    bad arguments or rows (module docstring). A failure commits nothing (data files already
    written stay unreferenced)."""
    plan = BootstrapPlan(states, key_type=key_type, max_parallelism=max_parallelism,
                         timers=timers, timer_namespace_type=timer_namespace_type,
                         assigner=assigner, now_ms=now_ms, watermark_ms=watermark_ms)
    if not isinstance(store, CheckpointStore):
        store = CheckpointStore(store)
    check_empty(store, "bootstrap")
    descriptors = plan.write_runs(store, 0, plan.max_parallelism - 1, "bootstrap",
                                  memory_bytes=memory_bytes)
    return store.commit(0, descriptors, plan.metadata(descriptors, metadata))


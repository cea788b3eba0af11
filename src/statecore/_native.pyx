# cython: language_level=3, boundscheck=False, wraparound=False
"""Thin wrappers over the native core (declarations in _native.pxd).

Errors are translated once, here: C++ std::invalid_argument / std::out_of_range (and BatchError,
a std::invalid_argument) become :class:`statecore.errors.InvalidInputError`. Batch kernels read
Arrow arrays through the Arrow C Data Interface (``__arrow_c_array__`` PyCapsules, zero copy) and
run with the GIL released.

Thread contract: a StateTable is owned by one Python thread at a time (the task's). Snapshots may
be read from another thread. Calls without the GIL mark their table busy; another thread's call
on it raises StateError meanwhile (NativeStateTable). Kernels on different tables share no
mutable state and may run in parallel.
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.pycapsule cimport PyCapsule_GetPointer
from cpython.unicode cimport PyUnicode_AsUTF8String, PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memchr, memcpy
from libcpp.memory cimport shared_ptr
from libcpp.pair cimport pair
from libcpp.string cimport string
from libcpp.vector cimport vector

import numpy as np
import pyarrow as pa

from statecore import key_types as KT
from statecore import value_types as VT
from statecore.errors import InvalidInputError, StateError

cimport _native_core as c

_KEY_KINDS = {"int32": c.KeyType.Int32, "int64": c.KeyType.Int64, "string": c.KeyType.String,
              "binary": c.KeyType.Binary, "uint64": c.KeyType.UInt64,
              "float64": c.KeyType.Float64, "bool": c.KeyType.Bool,
              "timestamp": c.KeyType.Timestamp, "fixed_size_binary": c.KeyType.FixedSizeBinary}
_TIME_UNITS = {"s": c.TimeUnit.Second, "ms": c.TimeUnit.Milli, "us": c.TimeUnit.Micro,
               "ns": c.TimeUnit.Nano}
# Value type kinds (statecore.value_types) the batch kernels serve, and their ValueType.
_VALUE_KINDS = {"int64": c.ValueType.Int64, "float64": c.ValueType.Float64,
                "int32": c.ValueType.Int32, "bool": c.ValueType.Bool,
                "string": c.ValueType.String, "binary": c.ValueType.Binary,
                "uint64": c.ValueType.UInt64, "timestamp": c.ValueType.Timestamp,
                "fixed_size_binary": c.ValueType.FixedSizeBinary}
_UNIT_LETTERS = {"s": b"s", "ms": b"m", "us": b"u", "ns": b"n"}  # ArrowKind time units
_REDUCERS = {"sum": c.Reducer.Sum, "min": c.Reducer.Min, "max": c.Reducer.Max,
             "count": c.Reducer.Count, "first": c.Reducer.First, "last": c.Reducer.Last}

#: Value type kinds the batch kernels serve natively (others go through the per-row path).
BATCH_VALUE_KINDS = frozenset(_VALUE_KINDS)
#: Built-in reducers the add_batch kernel serves natively.
BATCH_REDUCERS = frozenset(_REDUCERS)


cdef c.Assigner _assigner(str name) except *:
    if name == "spark":
        return c.Assigner.Spark
    if name == "flink":
        return c.Assigner.Flink
    raise InvalidInputError(f"unknown assigner {name!r}; expected 'spark' or 'flink'")


cdef c.ValueSpec _value_spec(str value_type) except *:
    """The kernels' ValueSpec of a value type name; InvalidInputError for one they do not
    serve (pickle)."""
    cdef c.ValueSpec v
    ser = VT.value_serializer(value_type)
    if ser.kind not in _VALUE_KINDS:
        raise InvalidInputError(f"value type {value_type!r} has no batch kernel")
    v.type = _VALUE_KINDS[ser.kind]
    v.unit = 0
    v.width = 0
    if ser.kind == "timestamp":
        v.unit = _UNIT_LETTERS[ser.unit][0]
    elif ser.kind == "fixed_size_binary":
        v.width = ser.width
    return v


cdef _fixed_out_array(str value_type, vals, uint8_t[::1] valid, int64_t n, size_t width):
    """The Arrow array of a fixed-width kernel output: ``vals`` holds ``width`` bytes per row
    (bool: a 0/1 byte per row, bit-packed here), ``valid`` a 0/1 byte per row."""
    typ = VT.value_serializer(value_type).arrow_type
    if typ == pa.bool_():
        buf = pa.py_buffer(np.packbits(vals[:n], bitorder="little"))
    else:
        buf = pa.py_buffer(vals[:n * width])
    return pa.Array.from_buffers(typ, n, [_bitmap(valid[:n], n), buf])


cdef c.TtlBatchSpec _ttl_spec(ttl) except *:
    """TtlBatchSpec from ``None`` (no TTL) or ``(ttl_ms, now_ms, update_on_read,
    return_expired)``; InvalidInputError for a malformed tuple or values outside int64."""
    cdef c.TtlBatchSpec t
    if ttl is None:
        return t
    try:
        ttl_ms, now, update_on_read, return_expired = ttl
        t.ttl_ms = ttl_ms
        t.now = now
    except (TypeError, ValueError, OverflowError) as e:
        raise InvalidInputError(f"ttl must be (ttl_ms, now_ms, update_on_read, return_expired) "
                                f"with int64 times, got {ttl!r}: {e}") from None
    t.enabled = True
    t.update_on_read = bool(update_on_read)
    t.return_expired = bool(return_expired)
    return t


# ----------------------------------------------------------------------------- hashes, key groups

def xxh64(data, uint64_t seed=0):
    """XXH64 (XXH64 spec) of ``data`` (any contiguous bytes-like object) with the GIL released
    while hashing; unsigned 64-bit int, equal to ``xxhash.xxh64_intdigest``."""
    cdef const uint8_t[::1] v = memoryview(data).cast("B")
    cdef size_t n = v.shape[0]
    cdef const uint8_t* p = &v[0] if n else NULL
    cdef uint64_t h
    with nogil:
        h = c.xxh64(p, n, seed)
    return h


def murmur3_32(data, uint32_t seed=0):
    """Murmur3_x86_32 (public spec) of ``data``; signed 32-bit int (as ``mmh3.hash``)."""
    cdef const uint8_t[::1] v = memoryview(data).cast("B")
    cdef uint32_t h = c.murmur3_32(&v[0] if v.shape[0] else NULL, v.shape[0], seed)
    return <int32_t>h


def flink_murmur_hash(int32_t code):
    """Flink MathUtils.murmurHash(int): non-negative int."""
    return c.flink_murmur_hash(code)


cdef c.KeySchema _key_schema(str key_type) except *:
    """The native KeySchema of a statecore key type name (statecore.key_types)."""
    cdef c.KeySchema schema
    cdef c.KeyColumn col
    kt = KT.key_type(key_type)
    schema.columns.clear()
    for f in (kt.fields if kt.is_struct else (kt,)):
        col.type = _KEY_KINDS[f.kind]
        col.width = f.width or 0
        col.unit = _TIME_UNITS[f.unit or "us"]
        schema.columns.push_back(col)
    schema.is_struct = kt.is_struct
    return schema


cdef void _add_column(c.KeyHasher* h, f, v) except *:
    """Feeds one canonical column value (KeyType.check) of field type ``f`` to the hasher."""
    cdef bytes b
    k = f.kind
    if k == "int32":
        h.add_int32(v)
    elif k in ("int64", "timestamp"):
        h.add_int64(v)
    elif k == "uint64":
        h.add_uint64(v)
    elif k == "float64":
        h.add_float64(v)
    elif k == "bool":
        h.add_bool(v)
    elif k == "string":
        b = v.encode("utf-8")
        h.add_string(b, len(b))
    else:
        b = v
        h.add_binary(<const char*>b, len(b))


cdef int32_t _key_group(key, str key_type, int32_t max_parallelism, c.Assigner a,
                        bint canonical=False) except -1:
    """Key group of ``key``; ``canonical``: ``key`` is KeyType.check's result already."""
    cdef bytes b
    cdef c.KeyHasher* h
    try:
        if key_type == "int64":
            return c.key_group_for_int64(a, key, max_parallelism)
        if key_type == "int32":
            return c.key_group_for_int32(a, key, max_parallelism)
        if key_type == "string":
            b = key.encode("utf-8")
            return c.key_group_for_string(a, b, len(b), max_parallelism)
        if key_type == "binary":
            b = bytes(key)
            return c.key_group_for_binary(a, <const char*>b, len(b), max_parallelism)
    except (ValueError, OverflowError, TypeError, AttributeError) as e:
        raise InvalidInputError(f"key {key!r} of type {key_type}: {e}") from None
    # Every other key type (and multi-column keys): validated to its canonical form first, then
    # hashed column by column.
    kt = KT.key_type(key_type)
    v = key if canonical else kt.check(key)
    h = new c.KeyHasher(a)
    try:
        if kt.is_struct:
            for f, x in zip(kt.fields, v):
                _add_column(h, f, x)
        else:
            _add_column(h, kt, v)
        return h.key_group(max_parallelism)
    except ValueError as e:
        raise InvalidInputError(f"key {key!r} of type {key_type}: {e}") from None
    finally:
        del h


def spark_key_group(key, str key_type, int32_t max_parallelism):
    """pmod(xxhash64(key, seed 42), max_parallelism) with Spark SQL's encodings
    (key_groups.h); ``key_type`` a canonical key type name (statecore.key_types)."""
    return _key_group(key, key_type, max_parallelism, c.Assigner.Spark)


def flink_key_group(key, str key_type, int32_t max_parallelism):
    """murmurHash(javaHashCode(key)) % max_parallelism (Flink KeyGroupRangeAssignment)."""
    return _key_group(key, key_type, max_parallelism, c.Assigner.Flink)


# ----------------------------------------------------------------------------- per-record keys

cdef enum _KeyFast:
    _KEY_GENERIC = 0
    _KEY_INT64 = 1
    _KEY_INT32 = 2
    _KEY_STRING = 3


cdef inline void _put_be(uint8_t* p, uint64_t v, int n):
    cdef int i
    for i in range(n):
        p[i] = <uint8_t>(v >> (8 * (n - 1 - i)))


cdef class KeyEncoder:
    """The current-key step of a backend's per-record path in one call (``encode``): the key is
    validated once (statecore.key_types ``KeyType.check``, same errors), its key group computed
    once and range-checked, and ``prefix | ser(key)`` built (docs/architecture.md "Keys"), the
    part of every encoded state key that depends on the key only.

    ``key_type``: canonical key type name; ``assigner``: "spark" | "flink"; ``[kg_start,
    kg_end]`` the backend's key-group range (inclusive; empty when kg_start > kg_end) and
    ``range_repr`` its text for the error message.
    """
    cdef object kt
    cdef str key_type
    cdef int fast
    cdef c.Assigner assigner
    cdef int32_t max_p, kg_start, kg_end
    cdef int pw
    cdef str range_repr

    def __cinit__(self, str key_type, str assigner, int32_t max_parallelism, int32_t kg_start,
                  int32_t kg_end, str range_repr):
        self.kt = KT.key_type(key_type)
        self.key_type = key_type
        self.fast = {"int64": _KEY_INT64, "int32": _KEY_INT32, "string": _KEY_STRING}.get(
            key_type, _KEY_GENERIC)
        self.assigner = _assigner(assigner)
        if not 0 < max_parallelism <= 32768:
            raise InvalidInputError(f"max_parallelism must be in [1, 32768], got {max_parallelism}")
        self.max_p = max_parallelism
        self.kg_start = kg_start
        self.kg_end = kg_end
        self.pw = 1 if max_parallelism <= 128 else 2
        self.range_repr = range_repr

    @property
    def prefix_width(self):
        """Bytes of the key-group prefix (1 up to max_parallelism 128, else 2)."""
        return self.pw

    def encode(self, key):
        """``(canonical key, key group, prefix | ser(key) as bytes)`` of a per-record key.
        InvalidInputError, as ``KeyType.check``, for a key the key type rejects, and for a key
        whose key group is outside the range."""
        cdef int64_t x
        cdef int32_t kg
        cdef bytes raw, out
        cdef uint8_t* p
        cdef Py_ssize_t n, vl
        cdef int pw = self.pw
        # The common key types take a path without Python-level validation; anything unusual
        # (numpy scalars, bools, lone surrogates, out-of-range ints) falls to KeyType.check,
        # which canonicalizes or raises its own message.
        if self.fast == _KEY_INT64 and type(key) is int:
            try:
                x = key
            except OverflowError:
                raise InvalidInputError(f"key {key} is out of range for key type int64") from None
            kg = self._kg(key, c.key_group_for_int64(self.assigner, x, self.max_p))
            out = PyBytes_FromStringAndSize(NULL, pw + 8)
            p = <uint8_t*>PyBytes_AS_STRING(out)
            _put_be(p, <uint64_t>kg, pw)
            _put_be(p + pw, <uint64_t>x, 8)
            return key, kg, out
        if self.fast == _KEY_INT32 and type(key) is int and -2**31 <= key < 2**31:
            x = key
            kg = self._kg(key, c.key_group_for_int32(self.assigner, <int32_t>x, self.max_p))
            out = PyBytes_FromStringAndSize(NULL, pw + 4)
            p = <uint8_t*>PyBytes_AS_STRING(out)
            _put_be(p, <uint64_t>kg, pw)
            _put_be(p + pw, <uint64_t>x, 4)
            return key, kg, out
        if self.fast == _KEY_STRING and type(key) is str:
            try:
                raw = PyUnicode_AsUTF8String(key)
            except UnicodeEncodeError:
                raw = None
            if raw is not None:
                n = PyBytes_GET_SIZE(raw)
                kg = self._kg(key, c.key_group_for_string(self.assigner, PyBytes_AS_STRING(raw),
                                                           n, self.max_p))
                vl = _varlen_size(n + 1)
                out = PyBytes_FromStringAndSize(NULL, pw + vl + n)
                p = <uint8_t*>PyBytes_AS_STRING(out)
                _put_be(p, <uint64_t>kg, pw)
                _write_varlen(p + pw, n + 1)
                memcpy(p + pw + vl, PyBytes_AS_STRING(raw), n)
                return key, kg, out
        v = self.kt.check(key)
        kg = self._kg(key, _key_group(v, self.key_type, self.max_p, self.assigner, True))
        return v, kg, int(kg).to_bytes(pw, "big") + self.kt.serialize_checked(v)

    cdef int32_t _kg(self, key, int32_t kg) except -1:
        if kg < self.kg_start or kg > self.kg_end:
            raise InvalidInputError(
                f"key {key!r} belongs to key group {kg}, outside this backend's key-group range "
                f"{self.range_repr}")
        return kg


cdef inline Py_ssize_t _varlen_size(uint64_t n):
    cdef Py_ssize_t k = 1
    while n >= 0x80:
        n >>= 7
        k += 1
    return k


cdef inline void _write_varlen(uint8_t* p, uint64_t n):
    # serializers.write_varlen: 7-bit groups, low group first, high bit = more follows.
    while n >= 0x80:
        p[0] = <uint8_t>((n & 0x7F) | 0x80)
        p += 1
        n >>= 7
    p[0] = <uint8_t>n


def default_max_parallelism(int32_t parallelism):
    """Flink computeDefaultMaxParallelism."""
    try:
        return c.default_max_parallelism(parallelism)
    except ValueError as e:
        raise InvalidInputError(str(e)) from None


def key_group_range_for_operator(int32_t max_parallelism, int32_t parallelism, int32_t index):
    """Flink computeKeyGroupRangeForOperatorIndex -> (start, end), inclusive."""
    try:
        r = c.key_group_range_for_operator(max_parallelism, parallelism, index)
    except ValueError as e:
        raise InvalidInputError(str(e)) from None
    return (r.start, r.end)


def operator_index_for_key_group(int32_t max_parallelism, int32_t parallelism, int32_t key_group):
    """Flink computeOperatorIndexForKeyGroup."""
    try:
        return c.operator_index_for_key_group(max_parallelism, parallelism, key_group)
    except ValueError as e:
        raise InvalidInputError(str(e)) from None


# ----------------------------------------------------------------------------- Arrow import

cdef class _Imported:
    """Keeps the PyCapsules of one exported Arrow array alive while a kernel reads it."""
    cdef object capsules
    cdef c.ArrowInput input

    def __cinit__(self, obj):
        try:
            schema_capsule, array_capsule = obj.__arrow_c_array__()
        except AttributeError:
            raise InvalidInputError(
                f"expected an Arrow array (__arrow_c_array__), got {type(obj).__name__}") from None
        self.capsules = (schema_capsule, array_capsule)
        self.input.schema = <c.ArrowSchema*>PyCapsule_GetPointer(schema_capsule, "arrow_schema")
        self.input.array = <c.ArrowArray*>PyCapsule_GetPointer(array_capsule, "arrow_array")

    cdef int64_t length(self):
        return self.input.array.length


cdef class _Chunks:
    """The chunks of one batch column, each imported as an Arrow array (``_Imported``): one
    object with ``__arrow_c_array__``, or a list/tuple of them. Nothing is copied; ``starts[j]``
    is the row of the whole batch where chunk j begins."""
    cdef list held
    cdef vector[c.ArrowInput] inputs
    cdef vector[int64_t] starts
    cdef int64_t total

    def __cinit__(self, obj):
        cdef _Imported imp
        self.held = []
        self.total = 0
        for part in (obj if isinstance(obj, (list, tuple)) else (obj,)):
            imp = _Imported(part)
            self.held.append(imp)
            self.inputs.push_back(imp.input)
            self.starts.push_back(self.total)
            self.total += imp.length()

    cdef size_t count(self):
        return self.inputs.size()

    cdef check_aligned(self, _Chunks other):
        """InvalidInputError unless ``other`` has the same chunk lengths (the kernels take one
        keys chunk with one values chunk of equal length)."""
        cdef size_t j
        if other.total != self.total:
            raise InvalidInputError(f"values have {other.total} rows but keys have {self.total}")
        if other.count() != self.count():
            raise InvalidInputError("keys and values must be split into chunks of equal lengths")
        for j in range(self.count()):
            if other.starts[j] != self.starts[j]:
                raise InvalidInputError("keys and values must be split into chunks of equal lengths")


cdef object _bitmap(uint8_t[::1] valid, int64_t n):
    """Arrow validity bitmap (LSB bit order) from a byte map; None when all valid (found by
    memchr: numpy's all() was ~4 us of a 64k-row add_batch call's ~20 us outside the kernel)."""
    if n == 0 or memchr(&valid[0], 0, <size_t>n) == NULL:
        return None
    return pa.py_buffer(np.packbits(np.asarray(valid), bitorder="little"))


# ----------------------------------------------------------------------------- state table

cdef _run_to_arrow(c.SortedRun& run, int32_t kg):
    """(keys, values) ``pa.binary()`` arrays of a SortedRun (a tombstone = NULL value). Raises
    InvalidInputError when the key group holds more than 2 GiB of keys or values (int32 offsets
    of ``pa.binary()``)."""
    cdef size_t i, n = run.size()
    cdef uint64_t kbytes = run.key_data.size(), vbytes = run.value_data.size()
    if kbytes > 2**31 - 1 or vbytes > 2**31 - 1:
        raise InvalidInputError(f"key group {kg} holds more than 2 GiB of keys or values")
    ko = np.empty(n + 1, np.int32); vo = np.empty(n + 1, np.int32)
    kd = np.empty(kbytes, np.uint8); vd = np.empty(vbytes, np.uint8)
    cdef int32_t[::1] koff = ko
    cdef int32_t[::1] voff = vo
    cdef uint8_t[::1] kdata = kd
    cdef uint8_t[::1] vdata = vd
    cdef uint8_t[::1] vmap
    with nogil:
        for i in range(n + 1):
            koff[i] = <int32_t>run.key_offsets[i]
            voff[i] = <int32_t>run.value_offsets[i]
        if kbytes:
            memcpy(&kdata[0], run.key_data.data(), kbytes)
        if vbytes:
            memcpy(&vdata[0], run.value_data.data(), vbytes)
    keys = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(ko), pa.py_buffer(kd)])
    bitmap = None
    tombstones = 0
    if n and run.valid.size():
        va = np.empty(n, np.uint8)
        vmap = va
        memcpy(&vmap[0], run.valid.data(), n)
        tombstones = n - int(np.count_nonzero(va))
        if tombstones:
            bitmap = _bitmap(va, n)
    values = pa.Array.from_buffers(pa.binary(), n, [bitmap, pa.py_buffer(vo), pa.py_buffer(vd)],
                                   null_count=tombstones)
    return keys, values


cdef c.FilterSpec _ttl_filter_spec(str kind, fixed_width, int64_t ttl_ms) except *:
    """ttl.h FilterSpec of a state kind (statecore.ttl.filter_expired's arguments)."""
    cdef c.FilterSpec spec
    if ttl_ms <= 0:
        raise InvalidInputError(f"TTL must be > 0 ms, got {ttl_ms}")
    if kind in ("value", "reducing", "aggregating"):
        spec.layout = c.Layout.Value
    elif kind == "list":
        spec.layout = c.Layout.List
        spec.fixed_width = fixed_width or 0
    elif kind == "map":
        spec.layout = c.Layout.Map
    else:
        raise InvalidInputError(f"no TTL filter for state kind {kind!r}")
    spec.ttl_ms = ttl_ms
    return spec


_ZERO_BYTE = np.zeros(1, np.uint8)  # a valid address for an empty data buffer


cdef _binary_run(keys, values, int idx, c.ArrowBinaryRun* r, list hold):
    """Fill ``r`` with views of one run's Arrow buffers (kept alive through ``hold``)."""
    cdef const int32_t[::1] ko
    cdef const int32_t[::1] vo
    cdef const uint8_t[::1] kd
    cdef const uint8_t[::1] vd
    cdef const uint8_t[::1] valid
    cdef int64_t n = len(keys)
    if len(values) != n:
        raise InvalidInputError(f"run {idx}: {n} keys but {len(values)} values")
    if keys.null_count:
        raise InvalidInputError(f"run {idx}: a null key")
    kb = keys.buffers()
    vb = values.buffers()
    ko = np.frombuffer(kb[1], np.int32)[keys.offset:keys.offset + n + 1]
    vo = np.frombuffer(vb[1], np.int32)[values.offset:values.offset + n + 1]
    if ko.shape[0] != n + 1 or vo.shape[0] != n + 1:
        raise InvalidInputError(f"run {idx}: the offsets buffer is too short for {n} entries")
    kd = np.frombuffer(kb[2], np.uint8) if kb[2] is not None and kb[2].size else _ZERO_BYTE
    vd = np.frombuffer(vb[2], np.uint8) if vb[2] is not None and vb[2].size else _ZERO_BYTE
    hold.extend((ko, vo, kd, vd))
    r.key_offsets = &ko[0]
    r.key_data = &kd[0]
    r.key_data_size = kb[2].size if kb[2] is not None else 0
    r.value_offsets = &vo[0]
    r.value_data = &vd[0]
    r.value_data_size = vb[2].size if vb[2] is not None else 0
    r.validity = NULL
    r.validity_bit = values.offset
    r.size = n
    if values.null_count:
        valid = np.frombuffer(vb[0], np.uint8)
        if valid.shape[0] * 8 < values.offset + n:
            raise InvalidInputError(f"run {idx}: the validity bitmap is too short")
        hold.append(valid)
        r.validity = &valid[0]


def merge_newest_wins(parts, bint keep_tombstones=False):
    """Newest-wins merge of sorted runs of one key group (sorted_run.h ``merge_newest_wins``):
    ``parts`` = ``[(keys, values), ...]`` newest first, ``pa.binary()`` arrays (sliced ones too),
    each run's keys strictly ascending in byte order, a NULL value = tombstone. Returns
    ``(keys, values)``, new ``pa.binary()`` arrays without NULLs, sorted by key: per key the
    newest entry, keys whose newest entry is a tombstone left out (with ``keep_tombstones``:
    kept as a NULL value, a change set's deletion) -- what
    ``statecore.checkpoint.store._merge_newest_wins`` computes by sorting, in one k-way pass with
    the GIL released. Raises InvalidInputError for another array type, mismatched lengths, a
    NULL key, offsets outside the data, keys not strictly ascending within a run, or a result
    beyond 2 GiB of keys or values (int32 offsets)."""
    cdef vector[c.ArrowBinaryRun] runs
    cdef vector[c.RunPick] picks
    cdef c.ArrowBinaryRun r
    cdef size_t i, n_out
    cdef int64_t kbytes = 0, vbytes = 0, klen, vlen
    cdef const c.ArrowBinaryRun* src
    cdef int32_t[::1] out_ko
    cdef int32_t[::1] out_vo
    cdef uint8_t[::1] out_kd
    cdef uint8_t[::1] out_vd
    hold = []
    for idx, (keys, values) in enumerate(parts):
        for a in (keys, values):
            if not isinstance(a, pa.Array) or a.type != pa.binary():
                raise InvalidInputError(
                    f"run {idx}: keys and values must be pa.binary() arrays, got "
                    f"{getattr(a, 'type', type(a).__name__)}")
        if len(keys) == 0 and len(values) == 0:
            continue  # an empty run neither adds nor shadows a key
        _binary_run(keys, values, idx, &r, hold)
        runs.push_back(r)
    try:
        with nogil:
            c.merge_newest_wins(runs, &picks, keep_tombstones)
    except ValueError as e:
        raise InvalidInputError(str(e)) from None
    n_out = picks.size()
    cdef size_t tombs = 0
    cdef int64_t bit
    cdef uint8_t[::1] valid
    validity = None
    # One pass over the picks, without the GIL: the output's byte counts and, keeping
    # tombstones, which picks are NULLs (a byte per row, packed into the bitmap below).
    valid_np = np.ones(n_out if keep_tombstones else 1, np.uint8)
    valid = valid_np
    with nogil:
        for i in range(n_out):
            src = &runs[picks[i].run]
            kbytes += src.key_offsets[picks[i].row + 1] - src.key_offsets[picks[i].row]
            vbytes += src.value_offsets[picks[i].row + 1] - src.value_offsets[picks[i].row]
            if keep_tombstones and src.validity != NULL:
                bit = src.validity_bit + picks[i].row
                if not (src.validity[bit >> 3] >> (bit & 7)) & 1:
                    valid[i] = 0
                    tombs += 1
    if tombs:
        validity = pa.py_buffer(np.packbits(valid_np, bitorder="little"))
    if kbytes > 2**31 - 1 or vbytes > 2**31 - 1:
        raise InvalidInputError("merged run exceeds 2 GiB of keys or values (int32 offsets)")
    ko_np = np.empty(n_out + 1, np.int32)
    vo_np = np.empty(n_out + 1, np.int32)
    kd_np = np.empty(max(kbytes, 1), np.uint8)
    vd_np = np.empty(max(vbytes, 1), np.uint8)
    out_ko = ko_np
    out_vo = vo_np
    out_kd = kd_np
    out_vd = vd_np
    kbytes = 0
    vbytes = 0
    with nogil:
        out_ko[0] = 0
        out_vo[0] = 0
        for i in range(n_out):
            src = &runs[picks[i].run]
            klen = src.key_offsets[picks[i].row + 1] - src.key_offsets[picks[i].row]
            vlen = src.value_offsets[picks[i].row + 1] - src.value_offsets[picks[i].row]
            if klen:
                memcpy(&out_kd[kbytes], src.key_data + src.key_offsets[picks[i].row], klen)
            if vlen:
                memcpy(&out_vd[vbytes], src.value_data + src.value_offsets[picks[i].row], vlen)
            kbytes += klen
            vbytes += vlen
            out_ko[i + 1] = <int32_t>kbytes
            out_vo[i + 1] = <int32_t>vbytes
    keys = pa.Array.from_buffers(pa.binary(), n_out,
                                 [None, pa.py_buffer(ko_np), pa.py_buffer(kd_np[:kbytes])])
    values = pa.Array.from_buffers(pa.binary(), n_out,
                                   [validity, pa.py_buffer(vo_np), pa.py_buffer(vd_np[:vbytes])],
                                   null_count=tombs)
    return keys, values


def ttl_filter_entries(str kind, fixed_width, int64_t ttl_ms, now_ms, keys, values):
    """:func:`statecore.ttl.filter_entries` in C++ (ttl.h ``filter_values``, the frocksdb
    ``FlinkCompactionFilter`` rule of ``filter_value``) over one chunk of a key group: ``keys``
    and ``values`` are ``pa.binary()`` or ``pa.large_binary()`` arrays of equal length (sliced
    ones too), ``now_ms`` the time (int, ms) of the whole chunk, the other arguments as
    :func:`statecore.ttl.filter_expired`. The values are read from the Arrow buffers in place
    with the GIL released; no Python object is made per value.

    Returns what ``filter_entries`` returns: ``(keys, values, expired)`` -- the same array
    objects and 0 when nothing changed, otherwise new ``pa.binary()`` arrays without the dropped
    entries and with trimmed values (an empty list or map value holds nothing alive and is
    dropped, with nothing counted).
    ``expired`` counts the values, list elements and map entries removed. Raises
    InvalidInputError naming the value for a list or map value whose layout is broken, and for
    mismatched lengths, another value type, a NULL value (tombstone) or offsets outside the data
    buffer."""
    cdef c.FilterSpec spec = _ttl_filter_spec(kind, fixed_width, ttl_ms)
    # Exact for any int: beyond INT64_MAX only entries whose ts + ttl overflows are unexpired,
    # as at INT64_MAX; below INT64_MIN nothing is expired, as at INT64_MIN.
    cdef int64_t now = max(-2**63, min(now_ms, 2**63 - 1))
    cdef int64_t n = len(values)
    cdef int64_t start
    cdef bint large
    cdef const uint8_t[::1] data
    cdef size_t data_size
    cdef const int32_t[::1] off32
    cdef const int64_t[::1] off64
    cdef int32_t[::1] out32
    cdef int64_t[::1] out64
    cdef uint8_t[::1] keep
    cdef uint8_t[::1] out_data
    cdef c.ValuesFiltered r
    if len(keys) != n:
        raise InvalidInputError(f"{len(keys)} keys but {n} values")
    if n == 0:
        return keys, values, 0
    if values.type == pa.binary():
        large = False
    elif values.type == pa.large_binary():
        large = True
    else:
        raise InvalidInputError(f"TTL values must be binary or large_binary, got {values.type}")
    if values.null_count:
        raise InvalidInputError("a NULL value (tombstone) among the values to filter")
    bufs = values.buffers()
    start = values.offset
    if bufs[2] is not None and bufs[2].size:
        data = np.frombuffer(bufs[2], np.uint8)
        data_size = data.shape[0]
    else:
        data = _ZERO_BYTE
        data_size = 0
    offsets = np.frombuffer(bufs[1], np.int64 if large else np.int32)[start:start + n + 1]
    if offsets.shape[0] != n + 1:
        raise InvalidInputError(f"the offsets buffer is too short for {n} values")
    # Filtering never makes a value longer: the chunk's byte span bounds the output.
    span = max(int(offsets[n]) - int(offsets[0]), 0)
    keep_np = np.empty(n, np.uint8)
    data_np = np.empty(max(span, 1), np.uint8)
    keep = keep_np
    out_data = data_np
    try:
        if large:
            off64 = offsets
            out_np = np.empty(n + 1, np.int64)
            out64 = out_np
            with nogil:
                r = c.filter_values(spec, now, &data[0], data_size, &off64[0], n, &keep[0],
                                    &out64[0], &out_data[0])
        else:
            off32 = offsets
            out_np = np.empty(n + 1, np.int32)
            out32 = out_np
            with nogil:
                r = c.filter_values(spec, now, &data[0], data_size, &off32[0], n, &keep[0],
                                    &out32[0], &out_data[0])
    except ValueError as e:
        raise InvalidInputError(str(e)) from None
    if r.expired == 0 and r.kept == <size_t>n:  # trims only come with expiries
        return keys, values, 0
    out_keys = keys.filter(pa.array(keep_np.view(np.bool_)))
    if out_keys.type != pa.binary():
        out_keys = out_keys.cast(pa.binary())
    out_values = pa.Array.from_buffers(
        pa.large_binary() if large else pa.binary(), r.kept,
        [None, pa.py_buffer(out_np[:r.kept + 1]), pa.py_buffer(data_np[:r.data_bytes])])
    if large:
        out_values = out_values.cast(pa.binary())
    return out_keys, out_values, r.expired


# ----------------------------------------------------------------------------- stored values

cdef enum _StoredCode:
    _STORED_BYTES = 0   # binary and pickle: the bytes themselves
    _STORED_INT64 = 1
    _STORED_FLOAT64 = 2
    _STORED_INT32 = 3
    _STORED_BOOL = 4
    _STORED_STRING = 5
    _STORED_UINT64 = 6
    _STORED_FIXED_BYTES = 7  # fixed_size_binary[N]: exactly N bytes
    # timestamp[u]: int64 bytes and an int form, as int64; one code per unit for the error texts
    _STORED_TS_S = 8
    _STORED_TS_MS = 9
    _STORED_TS_US = 10
    _STORED_TS_NS = 11

_STORED_CODES = {"binary": _STORED_BYTES, "pickle": _STORED_BYTES, "int64": _STORED_INT64,
                 "float64": _STORED_FLOAT64, "int32": _STORED_INT32, "bool": _STORED_BOOL,
                 "string": _STORED_STRING, "uint64": _STORED_UINT64,
                 "fixed_size_binary": _STORED_FIXED_BYTES, "timestamp[s]": _STORED_TS_S,
                 "timestamp[ms]": _STORED_TS_MS, "timestamp[us]": _STORED_TS_US,
                 "timestamp[ns]": _STORED_TS_NS}
_STORED_NAMES = {_STORED_INT64: "int64", _STORED_FLOAT64: "float64", _STORED_INT32: "int32",
                 _STORED_BOOL: "bool", _STORED_UINT64: "uint64", _STORED_TS_S: "timestamp[s]",
                 _STORED_TS_MS: "timestamp[ms]", _STORED_TS_US: "timestamp[us]",
                 _STORED_TS_NS: "timestamp[ns]"}


# A value type's stored form: the code and, for a fixed-width type, its width (0 = variable).
# A struct passed by value keeps the per-record path free of Python objects.
cdef struct _Fmt:
    int code
    Py_ssize_t width


cdef _Fmt _fmt_of(str value_type) except *:
    """The stored form of a value type name (statecore.value_types); InvalidInputError for an
    unknown one."""
    cdef _Fmt f
    ser = VT.value_serializer(value_type)
    code = _STORED_CODES.get(ser.name if ser.kind == "timestamp" else ser.kind)
    if code is None:
        raise InvalidInputError(f"no stored-value format for value type {value_type!r}")
    f.code = code
    f.width = ser.fixed_width or 0
    return f


cdef inline bint _int64_like(int code):
    return code == _STORED_INT64 or _STORED_TS_S <= code <= _STORED_TS_NS


cdef str _stored_name(_Fmt f):
    if f.code == _STORED_FIXED_BYTES:
        return f"fixed_size_binary[{f.width}]"
    return _STORED_NAMES[f.code]


cdef inline void _put_le(uint8_t* p, uint64_t v, int n):
    cdef int i
    for i in range(n):
        p[i] = <uint8_t>(v >> (8 * i))


cdef inline uint64_t _get_le(const uint8_t* p, int n):
    cdef uint64_t v = 0
    cdef int i
    for i in range(n):
        v |= (<uint64_t>p[i]) << (8 * i)
    return v


cdef inline uint64_t _get_be(const uint8_t* p, int n):
    cdef uint64_t v = 0
    cdef int i
    for i in range(n):
        v = (v << 8) | p[i]
    return v


cdef object _decode_stored(const uint8_t* p, size_t n, _Fmt f):
    """serializers.ValueSerializer.deserialize (same errors) of ``n`` bytes at ``p``."""
    cdef int code = f.code
    cdef uint64_t u
    cdef double d
    if f.width and n != <size_t>f.width:
        raise InvalidInputError(f"{_stored_name(f)} value must be {f.width} bytes, got {n}")
    if _int64_like(code):
        return <int64_t>_get_le(p, 8)
    if code == _STORED_UINT64:
        return _get_le(p, 8)
    if code == _STORED_FLOAT64:
        u = _get_le(p, 8)
        memcpy(&d, &u, 8)
        return d
    if code == _STORED_INT32:
        return <int32_t><uint32_t>_get_le(p, 4)
    if code == _STORED_BOOL:
        return p[0] != 0
    if code == _STORED_STRING:
        try:
            return PyUnicode_DecodeUTF8(<const char*>p, n, NULL)
        except UnicodeDecodeError as e:
            raise InvalidInputError(f"malformed UTF-8 string value: {e}") from None
    return PyBytes_FromStringAndSize(<const char*>p, n)


cdef enum _Layout:
    _LAYOUT_VALUE = 0
    _LAYOUT_LIST = 1
    _LAYOUT_MAP = 2

_LAYOUTS = {"value": _LAYOUT_VALUE, "reducing": _LAYOUT_VALUE, "aggregating": _LAYOUT_VALUE,
            "list": _LAYOUT_LIST, "map": _LAYOUT_MAP}


cdef Py_ssize_t _fixed_into(object s, _Fmt f, uint8_t* dst) except -2:
    """Writes a fixed-width stored value's f.width bytes to ``dst`` and returns their number;
    -1 for a variable-width type (nothing written). ValueError/TypeError/OverflowError for a
    stored form that does not fit."""
    cdef int code = f.code
    cdef uint64_t u
    cdef double d
    cdef bytes b
    if _int64_like(code):
        _put_le(dst, <uint64_t><int64_t>s, 8)
        return 8
    if code == _STORED_UINT64:
        _put_le(dst, <uint64_t>s, 8)
        return 8
    if code == _STORED_FLOAT64:
        d = s
        memcpy(&u, &d, 8)
        _put_le(dst, u, 8)
        return 8
    if code == _STORED_INT32:
        _put_le(dst, <uint64_t><uint32_t><int32_t>s, 4)
        return 4
    if code == _STORED_BOOL:
        dst[0] = 1 if s else 0
        return 1
    if code == _STORED_FIXED_BYTES:
        b = _var_bytes(s, f)
        memcpy(dst, PyBytes_AS_STRING(b), f.width)
        return f.width
    return -1


cdef inline bytes _var_bytes(object s, _Fmt f):
    """The bytes of a string/binary/pickle (or fixed_size_binary) stored value."""
    if f.code == _STORED_STRING:
        return PyUnicode_AsUTF8String(s)
    cdef bytes b = <bytes?>s
    if f.code == _STORED_FIXED_BYTES and PyBytes_GET_SIZE(b) != f.width:
        raise ValueError(f"{_stored_name(f)} value of {PyBytes_GET_SIZE(b)} bytes")
    return b


cdef inline bytes _be_bytes(object ts):
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 8)
    _put_be(<uint8_t*>PyBytes_AS_STRING(out), <uint64_t><int64_t>ts, 8)
    return out


cdef int _read_varlen(const uint8_t* p, size_t size, size_t* pos, uint64_t* out) except -1:
    """serializers.read_varlen at ``pos[0]`` (same errors); a number beyond 64 bits reads as
    UINT64_MAX, which no blob can hold (Python's unbounded int fails the same length checks)."""
    cdef uint64_t n = 0, b
    cdef int shift = 0
    cdef bint over = False
    while True:
        if pos[0] >= size:
            raise InvalidInputError("truncated varlen")
        b = p[pos[0]]
        pos[0] += 1
        if shift == 63 and (b & 0x7F) > 1:
            over = True
        n |= (b & 0x7F) << shift
        if b < 0x80:
            out[0] = <uint64_t>-1 if over else n
            return 0
        shift += 7
        if shift > 63:
            raise InvalidInputError("varlen longer than 64 bits")


cdef object _decode_value(const uint8_t* p, size_t n, _Fmt f, bint ttl):
    if not ttl:
        return _decode_stored(p, n, f)
    if n < 8:
        raise InvalidInputError(f"TTL value of {n} bytes lacks its 8-byte timestamp")
    return (_decode_stored(p, n - 8, f), <int64_t>_get_be(p + n - 8, 8))


cdef list _decode_list(const uint8_t* p, size_t size, _Fmt f, bint ttl):
    cdef size_t w = f.width, pos = 0, n, need
    cdef uint64_t vn
    cdef list out = []
    if w and not ttl:
        if size % w:
            raise InvalidInputError(f"list blob of {size} bytes is not a multiple of {w}")
        while pos < size:
            out.append(_decode_stored(p + pos, w, f))
            pos += w
        return out
    while pos < size:
        if w:
            n = w
        else:
            _read_varlen(p, size, &pos, &vn)
            if vn > size - pos:
                raise InvalidInputError("truncated list element")
            n = vn
        need = n + (8 if ttl else 0)
        if need > size - pos:
            raise InvalidInputError("truncated list element")
        e = _decode_stored(p + pos, n, f)
        out.append((e, <int64_t>_get_be(p + pos + n, 8)) if ttl else e)
        pos += need
    return out


cdef dict _decode_map(const uint8_t* p, size_t size, _Fmt f, bint ttl):
    cdef size_t pos = 0, koff, voff
    cdef uint64_t kn, vn
    cdef list spans = []
    # The blob's layout is checked whole before any value is decoded, so a malformed blob
    # raises what serializers.decode_map raises.
    while pos < size:
        _read_varlen(p, size, &pos, &kn)
        if kn > size - pos:
            raise InvalidInputError("truncated map blob")
        koff = pos
        pos += kn
        _read_varlen(p, size, &pos, &vn)
        if vn > size - pos:
            raise InvalidInputError("truncated map blob")
        voff = pos
        pos += vn
        spans.append((koff, kn, voff, vn))
    cdef dict out = {}
    for koff, kn, voff, vn in spans:
        out[PyBytes_FromStringAndSize(<const char*>p + koff, kn)] = _decode_value(p + voff, vn, f, ttl)
    return out


cdef bytes _encode_list(object stored, _Fmt f, bint ttl):
    cdef Py_ssize_t w = f.width, total = 0, cnt, i
    cdef int64_t check_ts
    cdef bytes out
    cdef uint8_t* q
    cdef list items = list(stored), raws
    cnt = len(items)
    if w:
        out = PyBytes_FromStringAndSize(NULL, cnt * (w + (8 if ttl else 0)))
        q = <uint8_t*>PyBytes_AS_STRING(out)
        for e in items:
            if ttl:
                v, ts = e
                q += _fixed_into(v, f, q)
                _put_be(q, <uint64_t><int64_t>ts, 8)
                q += 8
            else:
                q += _fixed_into(e, f, q)
        return out
    raws = []
    for e in items:
        if ttl:
            v, ts = e
            check_ts = ts  # a timestamp outside int64 fails before the blob is built
            r = _var_bytes(v, f)
        else:
            r = _var_bytes(e, f)
        raws.append(r)
        total += _varlen_size(PyBytes_GET_SIZE(r)) + PyBytes_GET_SIZE(r) + (8 if ttl else 0)
    out = PyBytes_FromStringAndSize(NULL, total)
    q = <uint8_t*>PyBytes_AS_STRING(out)
    for i in range(cnt):
        r = raws[i]
        _write_varlen(q, PyBytes_GET_SIZE(r))
        q += _varlen_size(PyBytes_GET_SIZE(r))
        memcpy(q, PyBytes_AS_STRING(r), PyBytes_GET_SIZE(r))
        q += PyBytes_GET_SIZE(r)
        if ttl:
            _put_be(q, <uint64_t><int64_t>items[i][1], 8)
            q += 8
    return out


cdef bytes _encode_map(object stored, _Fmt f, bint ttl):
    cdef uint8_t buf[8]
    cdef Py_ssize_t n, total = 0
    cdef bytes out, kb, vb
    cdef uint8_t* q
    cdef list pairs = []
    for uk in sorted(stored):
        kb = <bytes?>uk
        if ttl:
            v, ts = stored[uk]
        else:
            v = stored[uk]
        # buf holds the numeric types; wider fixed_size_binary values take the bytes path
        n = _fixed_into(v, f, buf) if f.width <= 8 else -1
        vb = PyBytes_FromStringAndSize(<const char*>buf, n) if n >= 0 else _var_bytes(v, f)
        if ttl:
            vb += _be_bytes(ts)
        pairs.append((kb, vb))
        total += (_varlen_size(PyBytes_GET_SIZE(kb)) + PyBytes_GET_SIZE(kb)
                  + _varlen_size(PyBytes_GET_SIZE(vb)) + PyBytes_GET_SIZE(vb))
    out = PyBytes_FromStringAndSize(NULL, total)
    q = <uint8_t*>PyBytes_AS_STRING(out)
    for kb, vb in pairs:
        for r in (kb, vb):
            _write_varlen(q, PyBytes_GET_SIZE(r))
            q += _varlen_size(PyBytes_GET_SIZE(r))
            memcpy(q, PyBytes_AS_STRING(r), PyBytes_GET_SIZE(r))
            q += PyBytes_GET_SIZE(r)
    return out


cdef class NativeTableSnapshot:
    """One StateTable's snapshot: one O(1) map snapshot per key group (taken in O(key groups)).

    ``entries(kg)`` -> (keys, values) as ``pa.binary()`` arrays sorted by key bytes, as of snapshot
    time, whatever the owner writes meanwhile. ``release()`` is idempotent; after it entries()
    raises InvalidInputError.
    """
    cdef c.TableSnapshot* snap
    cdef bint released

    def __dealloc__(self):
        if self.snap != NULL:
            self.snap.release()
            del self.snap

    @property
    def kg_start(self):
        return self.snap.kg_start()

    @property
    def kg_end(self):
        return self.snap.kg_end()

    def __len__(self):
        return 0 if self.released else self.snap.size()

    def entries(self, int32_t kg):
        """Entries of key group ``kg`` as (keys, values) ``pa.binary()`` arrays sorted by key
        bytes. InvalidInputError after release or for ``kg`` outside the range."""
        cdef c.SortedRun run
        self._check_group(kg)
        with nogil:
            run = self.snap.map(kg).get().sorted_entries()
        return _run_to_arrow(run, kg)

    def entries_ttl_filtered(self, int32_t kg, str kind, fixed_width, int64_t ttl_ms, int64_t now):
        """:meth:`entries` through the TTL filter (ttl.h ``filter_run``, the filter the
        asynchronous serializer applies): ``(keys, values, expired)``, ``expired`` = values,
        list elements and map entries left out. ``kind``/``fixed_width``/``ttl_ms``/``now`` as
        :func:`statecore.ttl.filter_expired`. InvalidInputError as :meth:`entries`, or for a
        stored value whose TTL layout is broken."""
        cdef c.SortedRun run, out
        cdef c.FilterSpec spec = _ttl_filter_spec(kind, fixed_width, ttl_ms)
        cdef size_t expired
        self._check_group(kg)
        try:
            with nogil:
                run = self.snap.map(kg).get().sorted_entries()
                expired = c.filter_run(spec, now, run, out)
        except ValueError as e:
            raise InvalidInputError(f"key group {kg}: {e}") from None
        keys, values = _run_to_arrow(out, kg)
        return keys, values, expired

    cdef _check_group(self, int32_t kg):
        if self.released:
            raise InvalidInputError("the snapshot was released")
        if kg < self.snap.kg_start() or kg > self.snap.kg_end():
            raise InvalidInputError(
                f"key group {kg} outside the snapshot's range "
                f"[{self.snap.kg_start()}, {self.snap.kg_end()}]")

    @property
    def version(self):
        """Table version of this snapshot (change tracking, StateMap "Change tracking")."""
        return self.snap.version()

    @property
    def base_version(self):
        """The table's change-tracking base when the snapshot was taken: the oldest ``base``
        that :meth:`changes` accepts."""
        return self.snap.base_version()

    def changes(self, int32_t kg, uint64_t base):
        """Changes of key group ``kg`` since table version ``base`` as (keys, values)
        ``pa.binary()`` arrays sorted by key bytes: a present key written since ``base`` with its
        value, or a key removed since ``base`` and absent now with a NULL value (tombstone).
        InvalidInputError after release, for ``kg`` outside the range, or unless
        ``base_version <= base <= version``."""
        cdef c.SortedRun run
        self._check_group(kg)
        try:
            with nogil:
                run = self.snap.map(kg).get().sorted_changes(base)
        except ValueError as e:
            raise InvalidInputError(str(e)) from None
        return _run_to_arrow(run, kg)

    def release(self):
        if not self.released:
            self.released = True
            self.snap.release()


cdef class _Entries:
    """Raw views of a (keys, values) pair of pa.binary arrays (any offset; keys without NULLs)
    for the bulk paths, which read Arrow buffers without the GIL."""
    cdef object keys, values  # keep the buffers alive
    cdef int64_t n
    cdef const int32_t* ko
    cdef const int32_t* vo
    cdef const uint8_t* kd
    cdef const uint8_t* vd
    cdef const uint8_t* vbits  # NULL: no NULL values
    cdef int64_t voff  # bit offset of the values' validity
    cdef int64_t kd_size, vd_size  # bytes of the data buffers

    def __cinit__(self, keys, values):
        keys = keys.cast(pa.binary()) if keys.type != pa.binary() else keys
        values = values.cast(pa.binary()) if values.type != pa.binary() else values
        self.n = len(keys)
        if len(values) != self.n:
            raise InvalidInputError(f"{self.n} keys but {len(values)} values")
        if keys.null_count:
            raise InvalidInputError("keys to load must not be null")
        self.keys, self.values = keys, values
        self.ko = self.vo = NULL
        self.kd = self.vd = self.vbits = NULL
        self.voff = values.offset
        if self.n == 0:
            return
        cdef const int32_t[::1] ko
        cdef const int32_t[::1] vo
        cdef const uint8_t[::1] kd
        cdef const uint8_t[::1] vd
        cdef const uint8_t[::1] vb
        kb, vbuf = keys.buffers(), values.buffers()
        ko = np.frombuffer(kb[1], np.int32)[keys.offset:keys.offset + self.n + 1]
        vo = np.frombuffer(vbuf[1], np.int32)[values.offset:values.offset + self.n + 1]
        if ko.shape[0] != self.n + 1 or vo.shape[0] != self.n + 1:
            raise InvalidInputError("keys/values: the offsets buffer is shorter than the array")
        self.ko, self.vo = &ko[0], &vo[0]
        self.kd_size = self.vd_size = 0
        if kb[2] is not None and kb[2].size:
            kd = np.frombuffer(kb[2], np.uint8)
            self.kd, self.kd_size = &kd[0], kd.shape[0]
        if vbuf[2] is not None and vbuf[2].size:
            vd = np.frombuffer(vbuf[2], np.uint8)
            self.vd, self.vd_size = &vd[0], vd.shape[0]
        if values.null_count:
            vb = np.frombuffer(vbuf[0], np.uint8)
            if vb.shape[0] * 8 < self.voff + self.n:
                raise InvalidInputError("values: the validity bitmap is shorter than the array")
            self.vbits = &vb[0]
        # Arrays built from raw buffers are not validated by pyarrow: the bulk paths read
        # through these offsets without bounds checks, so they must be sane.
        cdef int64_t bad_k, bad_v
        with nogil:
            bad_k = c.first_bad_offset(self.ko, self.n, self.kd_size)
            bad_v = c.first_bad_offset(self.vo, self.n, self.vd_size)
        if bad_k >= 0 or bad_v >= 0:
            raise InvalidInputError(
                f"{'keys' if bad_k >= 0 else 'values'}: offset {bad_k if bad_k >= 0 else bad_v} "
                "is negative, below the one before it or past the data buffer")

    cdef c.ArrowBinaryRun run(self):
        cdef c.ArrowBinaryRun r
        r.key_offsets = self.ko
        r.key_data = self.kd
        r.key_data_size = self.kd_size
        r.value_offsets = self.vo
        r.value_data = self.vd
        r.value_data_size = self.vd_size
        r.validity = self.vbits
        r.validity_bit = self.voff
        r.size = self.n
        return r


cdef str _check_entries(_Entries e, int32_t kg_lo, int32_t kg_hi, int prefix_width,
                        int64_t value_width, bint tombstones):
    """check_entries (bulk_load.h) over ``e``, GIL released: None or the first problem."""
    cdef string bad
    cdef c.ArrowBinaryRun run = e.run()
    if prefix_width not in (1, 2):
        raise InvalidInputError(f"prefix_width must be 1 or 2, got {prefix_width}")
    with nogil:
        bad = c.check_entries(run, kg_lo, kg_hi, prefix_width, value_width, tombstones)
    return bad.decode("utf-8", "replace") if bad.size() else None


def check_entry_range(keys, values, int32_t kg_lo, int32_t kg_hi, int prefix_width,
                      int64_t value_width, bint tombstones):
    """Check entries about to be bulk-loaded as bytes (restore, a change set; see
    :meth:`NativeStateTable.load_range`) without decoding them: ``keys``/``values`` pa.binary
    arrays of equal length (any offset), every key non-NULL and longer than its big-endian
    ``prefix_width``-byte key-group prefix (1 or 2 bytes), the prefixes non-decreasing and in
    ``[kg_lo, kg_hi]``, a NULL value only with ``tombstones`` (a removal), every other value
    exactly ``value_width`` bytes unless ``value_width`` < 0. Returns None, or the first
    problem as a message naming the entry. Raises InvalidInputError for unequal lengths or a
    NULL key. GIL released for the scan."""
    return _check_entries(_Entries(keys, values), kg_lo, kg_hi, prefix_width, value_width,
                          tombstones)


cdef class NativeStateTable:
    """One keyed state's entries: a copy-on-write StateMap per key group of [kg_start, kg_end].

    Keys are encoded keys (docs/architecture.md), values serialized bytes. Raises
    InvalidInputError for a key group outside the range.

    Threads: one thread uses a table at a time (the backend's thread contract). Calls that run
    without the GIL (batch kernels, TTL cleanup and migration, bulk load) mark the table busy
    meanwhile; any call touching the table from another thread then raises StateError instead
    of racing with it. The mark is set and tested under the GIL: a guard against misuse, not a
    lock (two threads taking turns without overlapping calls are not detected).
    """
    cdef c.StateTable* table
    cdef readonly int32_t kg_start, kg_end
    cdef _Fmt vfmt  # set_value_format
    cdef int vlayout
    cdef bint vttl
    cdef int busy  # a call without the GIL is running on the table

    def __cinit__(self, int32_t kg_start, int32_t kg_end):
        try:
            self.table = new c.StateTable(kg_start, kg_end)
        except ValueError as e:
            raise InvalidInputError(str(e)) from None
        self.kg_start = kg_start
        self.kg_end = kg_end

    def __dealloc__(self):
        del self.table

    cdef int _idle(self) except -1:
        if self.busy:
            raise StateError("this state's table is in use by a native call running in another "
                             "thread; a backend must be used by one thread at a time")
        return 0

    cdef int _claim(self) except -1:
        self._idle()
        self.busy = 1
        return 0

    def _debug_set_busy(self, bint busy):
        """Tests only: mark the table as if a call without the GIL were running on it."""
        self.busy = busy

    cdef c.StateMap* _map(self, int32_t kg) except NULL:
        if self.busy:
            self._idle()
        if kg < self.kg_start or kg > self.kg_end:
            raise InvalidInputError(
                f"key group {kg} outside the table's range [{self.kg_start}, {self.kg_end}]")
        return &self.table.map(kg)

    def get(self, int32_t kg, const uint8_t[::1] key):
        """Value bytes of ``key`` in key group ``kg``, or None."""
        cdef c.ByteView out
        cdef c.StateMap* m = self._map(kg)
        if not m.get(&key[0] if key.shape[0] else NULL, key.shape[0], &out):
            return None
        return (<const char*>out.data)[:out.size] if out.size else b""

    def put(self, int32_t kg, const uint8_t[::1] key, const uint8_t[::1] value):
        """Insert or overwrite."""
        cdef c.StateMap* m = self._map(kg)
        cdef uint8_t* dst = m.put(&key[0] if key.shape[0] else NULL, key.shape[0], value.shape[0])
        if value.shape[0]:
            memcpy(dst, &value[0], value.shape[0])

    def remove(self, int32_t kg, const uint8_t[::1] key):
        """True when the key was present."""
        cdef c.StateMap* m = self._map(kg)
        return m.remove(&key[0] if key.shape[0] else NULL, key.shape[0])

    # ---------------------------------------------------------------- per-record stored values
    # The reference backend's stored forms (backends/python.py ``_Table.encode_value`` /
    # ``decode_value``) converted here instead of through serializers.py: an access of the
    # per-record path then costs one call into this class.

    def set_value_format(self, str kind, str value_type, bint ttl):
        """State kind (value, reducing and aggregating share a layout; list; map), value type
        (a statecore.value_types name; ``pickle`` stores its bytes as they are) and whether
        values, list elements and map user values carry the 8-byte TTL timestamp suffix, for
        :meth:`get_stored` / :meth:`put_stored`. InvalidInputError for an unknown kind or
        value type."""
        layout = _LAYOUTS.get(kind)
        if layout is None:
            raise InvalidInputError(f"no stored-value format for a {kind!r} state of {value_type!r}")
        self.vfmt = _fmt_of(value_type)
        self.vlayout = layout
        self.vttl = ttl

    def get_stored(self, int32_t kg, bytes key not None):
        """Stored form of ``key``'s value, or None when absent: the value (``(value, ts)`` with
        TTL), a list of elements (each ``(element, ts)`` with TTL) or a dict ``{serialized user
        key: user value (or (user value, ts))}``. InvalidInputError for malformed bytes, with
        python._Table.decode_value's messages."""
        cdef c.ByteView out
        cdef c.StateMap* m = self._map(kg)
        if not m.get(<const uint8_t*>PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), &out):
            return None
        if self.vlayout == _LAYOUT_LIST:
            return _decode_list(out.data, out.size, self.vfmt, self.vttl)
        if self.vlayout == _LAYOUT_MAP:
            return _decode_map(out.data, out.size, self.vfmt, self.vttl)
        return _decode_value(out.data, out.size, self.vfmt, self.vttl)

    def put_stored(self, int32_t kg, bytes key not None, stored):
        """Insert or overwrite ``key`` with a stored form (as :meth:`get_stored` returns). The
        bytes are built before the map is touched, so a stored form that does not fit the
        format (InvalidInputError) changes nothing."""
        cdef uint8_t buf[16]  # a value of up to 8 bytes and its TTL timestamp
        cdef const uint8_t* src = buf
        cdef Py_ssize_t n
        cdef bytes raw = None
        cdef c.StateMap* m = self._map(kg)
        cdef uint8_t* dst
        try:
            if self.vlayout == _LAYOUT_LIST:
                raw = _encode_list(stored, self.vfmt, self.vttl)
            elif self.vlayout == _LAYOUT_MAP:
                raw = _encode_map(stored, self.vfmt, self.vttl)
            elif self.vttl:
                v, ts = stored
                n = _fixed_into(v, self.vfmt, buf) if self.vfmt.width <= 8 else -1
                if n < 0:
                    raw = _var_bytes(v, self.vfmt) + _be_bytes(ts)
                else:
                    _put_be(buf + n, <uint64_t><int64_t>ts, 8)
                    n += 8
            else:
                n = _fixed_into(stored, self.vfmt, buf) if self.vfmt.width <= 8 else -1
                if n < 0:
                    raw = _var_bytes(stored, self.vfmt)
        except (TypeError, ValueError, OverflowError) as e:
            raise InvalidInputError(f"stored value {stored!r} does not fit the state's format: "
                                    f"{e}") from None
        if raw is not None:
            src = <const uint8_t*>PyBytes_AS_STRING(raw)
            n = PyBytes_GET_SIZE(raw)
        dst = m.put(<const uint8_t*>PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), n)
        if n:
            memcpy(dst, src, n)

    def remove_key(self, int32_t kg, bytes key not None):
        """Remove ``key`` if present (:meth:`remove` for bytes keys, returning nothing)."""
        self._map(kg).remove(<const uint8_t*>PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key))

    def ttl_cleanup_step(self, int32_t kg, uint64_t cursor, size_t min_entries, str kind,
                         fixed_width, int64_t ttl_ms, int64_t now):
        """One step of incremental TTL cleanup in key group ``kg`` (ttl.h ``cleanup_step``):
        visits whole buckets from bucket ``cursor`` until at least ``min_entries`` entries were
        seen or the map ended, removing expired values and trimming lists/maps through the
        copy-on-write map operations. Returns ``(visited, expired, next_cursor, wrapped)``;
        ``wrapped`` = the end of the map was reached (next_cursor is 0). InvalidInputError for a
        key group outside the range or a stored value whose TTL layout is broken (the entries
        handled before it stay handled)."""
        cdef c.StateMap* m = self._map(kg)
        cdef c.FilterSpec spec = _ttl_filter_spec(kind, fixed_width, ttl_ms)
        cdef c.CleanupStep step
        cdef c.SortedRun scratch
        self._claim()
        try:
            with nogil:
                step = c.cleanup_step(m[0], &cursor, min_entries, spec, now, &scratch)
        except ValueError as e:
            raise InvalidInputError(f"key group {kg}: {e}") from None
        finally:
            self.busy = 0
        return step.visited, step.expired, cursor, step.wrapped

    def ttl_restamp(self, str kind, fixed_width, int64_t ts_from, int64_t ts_to):
        """Rewrite every TTL timestamp equal to ``ts_from`` to ``ts_to`` in every key group
        (ttl.h ``restamp``; copy-on-write aware). Returns how many were rewritten.
        InvalidInputError for a stored value whose TTL layout is broken."""
        cdef c.FilterSpec spec = _ttl_filter_spec(kind, fixed_width, 1)
        cdef size_t n = 0
        cdef int32_t kg
        self._claim()
        try:
            for kg in range(self.kg_start, self.kg_end + 1):
                with nogil:
                    n += c.restamp(self.table.map(kg), spec, ts_from, ts_to)
        except ValueError as e:
            raise InvalidInputError(str(e)) from None
        finally:
            self.busy = 0
        return n

    def ttl_migrate(self, str kind, fixed_width, bint add_timestamps, int64_t ts, int64_t ttl_ms,
                    int64_t now):
        """Convert every entry between the layouts with and without the TTL suffix (ttl.h
        ``migrate``; restoring with TTL switched on or off). ``add_timestamps``: every value,
        list element and map entry gets timestamp ``ts`` (ms); otherwise those expired under
        ``ttl_ms`` at ``now`` (ms) are dropped and the rest lose their suffix. ``fixed_width``:
        a list's element width without the suffix (None = variable length). All or nothing:
        InvalidInputError naming the key group for a value whose layout is broken, and then
        the table is unchanged. Copy-on-write aware (live snapshots keep the old bytes).
        Returns ``(rewritten, removed, expired)`` (entries rewritten, entries removed, expired
        values/elements/entries dropped)."""
        cdef c.FilterSpec layout = _ttl_filter_spec(kind, fixed_width, ttl_ms if ttl_ms > 0 else 1)
        cdef c.MigrationSpec spec
        cdef c.MigrationResult r
        if not add_timestamps and ttl_ms <= 0:
            raise InvalidInputError(f"TTL must be > 0 ms, got {ttl_ms}")
        spec.layout = layout.layout
        spec.fixed_width = layout.fixed_width
        spec.add_timestamps = add_timestamps
        spec.ts = ts
        spec.ttl_ms = ttl_ms if ttl_ms > 0 else 1
        spec.now = now
        self._claim()
        try:
            with nogil:
                r = c.migrate(self.table[0], spec)
        except ValueError as e:
            raise InvalidInputError(str(e)) from None
        finally:
            self.busy = 0
        return r.rewritten, r.removed, r.expired

    def ttl_cleanup_table_step(self, int32_t kg, uint64_t bucket, size_t min_entries, str kind,
                               fixed_width, int64_t ttl_ms, int64_t now):
        """Incremental TTL cleanup over the whole table (ttl.h ``cleanup_step`` with a
        ``TableCursor``): from key group ``kg``, bucket ``bucket`` on, key group after key
        group, until at least ``min_entries`` entries were visited or the last key group ended.
        Returns ``(visited, expired, next_kg, next_bucket, wrapped)``; ``wrapped`` = a pass over
        the table completed (the cursor is back at the first key group). A ``kg`` outside the
        range restarts at the first one. InvalidInputError for a stored value whose TTL layout
        is broken."""
        cdef c.FilterSpec spec = _ttl_filter_spec(kind, fixed_width, ttl_ms)
        cdef c.CleanupStep step
        cdef c.SortedRun scratch
        cdef c.TableCursor cur
        cur.key_group = kg
        cur.bucket = bucket
        self._claim()
        try:
            with nogil:
                step = c.cleanup_table_step(self.table[0], &cur, min_entries, spec, now, &scratch)
        except ValueError as e:
            raise InvalidInputError(str(e)) from None
        finally:
            self.busy = 0
        return step.visited, step.expired, cur.key_group, cur.bucket, step.wrapped

    def load(self, int32_t kg, keys, values, int prefix_width):
        """Bulk insert of one key group's entries (restore): ``keys``/``values`` pa.binary arrays
        of equal length, no nulls, every key carrying key group ``kg``'s big-endian
        ``prefix_width``-byte prefix (1 or 2). :meth:`load_range` over ``[kg, kg]`` after
        :func:`check_entry_range`; InvalidInputError (table unchanged) otherwise."""
        self._map(kg)  # a key group outside the table raises here
        cdef _Entries e = _Entries(keys, values)
        err = _check_entries(e, kg, kg, prefix_width, -1, False)
        if err is not None:
            raise InvalidInputError(f"key group {kg}: {err}")
        self._load(e, prefix_width)

    def load_range(self, keys, values, int prefix_width):
        """Bulk upsert of the entries of several key groups at once (restore, a change set):
        ``keys``/``values`` pa.binary arrays of equal length (any offset), sorted by key group
        (the big-endian ``prefix_width``-byte key-group prefix, 1 or 2, of every key), NULL
        values tombstones whose keys are removed; native ``load_entries`` (bulk_load.h): empty
        maps pre-sized, slots prefetched ahead, flat maps written through the batch lanes,
        first writes not logged (the caller rebases: the loaded entries are the base; listings
        over the epoch walk). Raises InvalidInputError, before touching the table, for a NULL
        key, unequal lengths, a key not longer than its prefix, or prefixes outside the table's
        range or not sorted (callers check value widths first with :func:`check_entry_range`).
        GIL released."""
        self._load(_Entries(keys, values), prefix_width)

    cdef _load(self, _Entries e, int prefix_width):
        cdef c.ArrowBinaryRun run = e.run()
        self._claim()
        try:
            with nogil:
                c.load_entries(self.table[0], run, prefix_width)
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from None
        finally:
            self.busy = 0

    def remove_keys(self, int32_t kg, keys):
        """Bulk removal (a change set's tombstones): ``keys`` a pa.binary array without nulls;
        absent keys are skipped. Returns how many were present. Reads the Arrow buffers
        directly, GIL released."""
        cdef c.StateMap* m = self._map(kg)
        cdef int64_t i, removed = 0
        cdef uint8_t empty = 0
        keys = keys.cast(pa.binary()) if keys.type != pa.binary() else keys
        if keys.null_count:
            raise InvalidInputError("keys to remove must not be null")
        cdef _Entries e = _Entries(keys, keys)  # offsets checked: the loop reads through them
        cdef const uint8_t* kd = e.kd if e.kd != NULL else &empty
        if e.n == 0:
            return 0
        self._claim()
        try:
            with nogil:
                for i in range(e.n):
                    removed += m.remove(kd + e.ko[i], e.ko[i + 1] - e.ko[i])
        finally:
            self.busy = 0
        return removed

    def key_group_size(self, int32_t kg):
        return self._map(kg).size()

    def __len__(self):
        return self.table.size()

    @property
    def nbytes(self):
        """Bytes of encoded keys + values of live entries."""
        return self.table.bytes()

    def stats(self):
        """Copy-on-write counters summed over key groups (for tests and metrics)."""
        cdef int32_t kg
        cdef c.MapStats st
        out = {"entry_copies": 0, "page_copies": 0, "directory_copies": 0, "retired_entries": 0,
               "rehashing_maps": 0}
        for kg in range(self.kg_start, self.kg_end + 1):
            st = self.table.map(kg).stats()
            out["entry_copies"] += st.entry_copies
            out["page_copies"] += st.page_copies
            out["directory_copies"] += st.directory_copies
            out["retired_entries"] += self.table.map(kg).retired_entries()
            out["rehashing_maps"] += self.table.map(kg).is_rehashing()
        return out

    @property
    def version(self):
        """Table version: +1 per snapshot() and per rebase() (StateMap "Change tracking")."""
        return self.table.version()

    @property
    def base_version(self):
        """Change-tracking base: entries written at a version >= it are changes."""
        return self.table.base_version()

    def mark_base(self, uint64_t version):
        """The snapshot of table version ``version`` was checkpointed: stop tracking older changes
        (no-op when not newer than the base; InvalidInputError when newer than ``version``)."""
        self._idle()
        try:
            self.table.mark_base(version)
        except ValueError as e:
            raise InvalidInputError(str(e)) from None

    def rebase(self, bint applied_changes=False):
        """Make the current contents the base (after a restore's bulk load, or with
        ``applied_changes`` a catch-up's change set, whose size predicts the next micro-batch's:
        StateMap::rebase); returns it."""
        self._idle()
        return self.table.rebase(applied_changes)

    @property
    def removal_log_size(self):
        """Removal-log records held over all key groups (memory accounting, tests)."""
        return self.table.removal_log_size()

    def snapshot(self):
        """A NativeTableSnapshot; O(key groups), independent of the number of entries."""
        cdef NativeTableSnapshot s = NativeTableSnapshot.__new__(NativeTableSnapshot)
        self._idle()
        s.snap = c.new_table_snapshot(self.table[0])
        return s

    # -------------------------------------------------------------------- batch kernels
    cdef c.BatchKeySpec _spec(self, str key_type, str assigner, int32_t max_parallelism,
                              str namespace_type=None) except *:
        """The kernels' BatchKeySpec. ``namespace_type`` None or "void": the VoidNamespace and
        plain keys; else the state's namespace type (int32, int64, string, binary), and every
        keys chunk is a struct array {key, namespace} (batch.h BatchKeySpec::has_namespace)."""
        cdef c.BatchKeySpec spec
        spec.key = _key_schema(key_type)
        if namespace_type is not None and namespace_type != "void":
            spec.has_namespace = True
            spec.ns = _key_schema(namespace_type)
        spec.assigner = _assigner(assigner)
        spec.max_parallelism = max_parallelism
        spec.kg_start = self.kg_start
        spec.kg_end = self.kg_end
        return spec

    def get_batch(self, keys, str key_type, str assigner, int32_t max_parallelism, str value_type,
                  ttl=None, count_expired=None, namespace_type=None):
        """Values of ``keys`` as an Arrow array of ``value_type`` (a statecore.value_types name;
        the fixed-width ones -> their Arrow type, timestamps without a time zone; string ->
        large_string, binary -> large_binary); null where absent.

        ``keys``: one object with ``__arrow_c_array__`` or a list of them (the chunks of one
        batch, read in place, in order; the result is one array over all of them). For a state
        with namespaces (``namespace_type`` int32/int64/string/binary; None or "void": none) every
        keys chunk is a struct array {key, namespace} with offset 0 (batch.h), in every kernel
        call of this class. With TTL
        (where reads remove and renew) every chunk is validated before the first is read, so
        bad input in any chunk raises with nothing changed.

        ``ttl``: None, or ``(ttl_ms, now_ms, update_on_read, return_expired)`` for a TTL state
        (stored values end with an 8-byte timestamp; batch.h "TTL"): expired entries are then
        removed (null, or their stale value once under return_expired) and read ones renewed
        under update_on_read -- the call then MODIFIES the table. ``count_expired(n)`` is called
        with the number of expired entries removed when n > 0, also when the call raises
        mid-batch. InvalidInputError on bad input. The GIL is released while the kernels run."""
        cdef c.BatchKeySpec spec = self._spec(key_type, assigner, max_parallelism, namespace_type)
        cdef c.TtlBatchSpec tspec = _ttl_spec(ttl)
        cdef _Chunks k = _Chunks(keys)
        cdef int64_t n = k.total
        cdef int64_t expired = 0, chunk_expired = 0
        cdef c.ValueSpec vt = _value_spec(value_type)
        cdef c.ArrowInput none
        cdef vector[vector[int64_t]] offsets
        cdef vector[vector[uint8_t]] data
        cdef uint8_t[::1] valid
        cdef uint8_t[::1] out_bytes
        cdef uint8_t* out_base
        cdef size_t width = c.value_width(vt), j, nchunks = k.count()
        valid_np = np.zeros(max(n, 1), np.uint8)
        valid = valid_np
        if width:
            vals = np.zeros(max(n, 1) * width, np.uint8)
            out_bytes = vals
            out_base = &out_bytes[0]
        else:
            offsets.resize(nchunks)
            data.resize(nchunks)
        self._claim()
        try:
            with nogil:
                # Without TTL a get changes nothing, so a failing chunk needs no validation
                # ahead; with TTL it removes and renews. The first chunk's kernel validates it
                # before touching anything: only the later chunks are checked ahead.
                if nchunks > 1 and tspec.enabled:
                    for j in range(1, nchunks):
                        c.validate_batch(self.table[0], spec, k.inputs[j], vt, c.BatchOp.Get,
                                         c.Reducer.Sum, none, tspec)
                for j in range(nchunks):
                    if width:
                        c.get_batch_fixed(self.table[0], spec, k.inputs[j], vt,
                                          out_base + k.starts[j] * width, &valid[k.starts[j]],
                                          tspec, &chunk_expired)
                    else:
                        c.get_batch_var(self.table[0], spec, k.inputs[j], vt, offsets[j],
                                        data[j], &valid[k.starts[j]], tspec, &chunk_expired)
                    expired += chunk_expired
                    chunk_expired = 0
        except ValueError as e:
            raise InvalidInputError(str(e)) from None
        finally:
            self.busy = 0
            expired += chunk_expired
            if expired and count_expired is not None:
                count_expired(expired)
        if width:
            return _fixed_out_array(value_type, vals, valid, n, width)
        off_np, data_np = _concat_var(offsets, data, n)
        typ = pa.large_string() if value_type == "string" else pa.large_binary()
        return pa.Array.from_buffers(typ, n, [_bitmap(valid[:n], n), pa.py_buffer(off_np), pa.py_buffer(data_np)])

    def put_batch(self, keys, values, str key_type, str assigner, int32_t max_parallelism,
                  str value_type, ttl=None, namespace_type=None):
        """values[i] for keys[i] in row order; a null value removes the key. ``keys`` and
        ``values`` as ``keys`` of :meth:`get_batch`, split into chunks of the same lengths
        (InvalidInputError otherwise); every chunk pair is validated before the first is
        written. ``ttl`` as in :meth:`get_batch`: every written value is stamped ``now_ms``."""
        cdef c.BatchKeySpec spec = self._spec(key_type, assigner, max_parallelism, namespace_type)
        cdef c.TtlBatchSpec tspec = _ttl_spec(ttl)
        cdef _Chunks k = _Chunks(keys)
        cdef _Chunks v = _Chunks(values)
        cdef c.ValueSpec vt = _value_spec(value_type)
        cdef size_t j, nchunks = k.count()
        k.check_aligned(v)
        self._claim()
        try:
            with nogil:
                # The first chunk's kernel validates it before touching anything.
                for j in range(1, nchunks):
                    c.validate_batch(self.table[0], spec, k.inputs[j], vt, c.BatchOp.Put,
                                     c.Reducer.Sum, v.inputs[j], tspec)
                for j in range(nchunks):
                    c.put_batch(self.table[0], spec, k.inputs[j], vt, v.inputs[j], tspec)
        except ValueError as e:
            raise InvalidInputError(str(e)) from None
        finally:
            self.busy = 0

    def append_batch(self, keys, values, str key_type, str assigner, int32_t max_parallelism,
                     str element_type, ttl=None, namespace_type=None):
        """ListState: appends values[i] (one element a row, the Arrow type of ``element_type``, no
        nulls) to the list blob of keys[i], in row order (batch_collections.h). ``keys`` and
        ``values`` as in :meth:`put_batch` (chunks of equal lengths, every chunk validated before
        the first is applied); ``ttl`` as there: every element is stamped ``now_ms``.
        InvalidInputError on bad input, the table then unchanged."""
        cdef c.BatchKeySpec spec = self._spec(key_type, assigner, max_parallelism, namespace_type)
        cdef c.TtlBatchSpec tspec = _ttl_spec(ttl)
        cdef _Chunks k = _Chunks(keys)
        cdef _Chunks v = _Chunks(values)
        cdef c.ValueSpec et = _value_spec(element_type)
        cdef size_t j, nchunks = k.count()
        k.check_aligned(v)
        self._claim()
        try:
            with nogil:
                for j in range(1, nchunks):
                    c.validate_list_append_batch(self.table[0], spec, k.inputs[j], et, v.inputs[j],
                                                 tspec)
                for j in range(nchunks):
                    c.list_append_batch(self.table[0], spec, k.inputs[j], et, v.inputs[j], tspec)
        except ValueError as e:
            raise InvalidInputError(str(e)) from None
        finally:
            self.busy = 0

    def map_put_batch(self, keys, user_keys, values, str key_type, str assigner,
                      int32_t max_parallelism, str user_key_type, str value_type, ttl=None,
                      namespace_type=None):
        """MapState: puts user_keys[i] -> values[i] into the map blob of keys[i], in row order
        (batch_collections.h; the blob stays sorted by ser(user key)). ``user_key_type``: a
        scalar statecore key type (its serializer is the user keys' one). ``keys``,
        ``user_keys`` and ``values`` chunked alike, as in :meth:`put_batch`; no null user keys
        or values. ``ttl`` as there: every put value is stamped ``now_ms``. InvalidInputError
        on bad input, the table then unchanged."""
        cdef c.BatchKeySpec spec = self._spec(key_type, assigner, max_parallelism, namespace_type)
        cdef c.TtlBatchSpec tspec = _ttl_spec(ttl)
        cdef c.KeySchema uks = _key_schema(user_key_type)
        cdef _Chunks k = _Chunks(keys)
        cdef _Chunks u = _Chunks(user_keys)
        cdef _Chunks v = _Chunks(values)
        cdef c.ValueSpec vt = _value_spec(value_type)
        cdef size_t j, nchunks = k.count()
        k.check_aligned(u)
        k.check_aligned(v)
        self._claim()
        try:
            with nogil:
                for j in range(1, nchunks):
                    c.validate_map_put_batch(self.table[0], spec, k.inputs[j], uks, u.inputs[j], vt,
                                             v.inputs[j], tspec)
                for j in range(nchunks):
                    c.map_put_batch(self.table[0], spec, k.inputs[j], uks, u.inputs[j], vt,
                                    v.inputs[j], tspec)
        except ValueError as e:
            raise InvalidInputError(str(e)) from None
        finally:
            self.busy = 0

    def add_batch(self, keys, values, str key_type, str assigner, int32_t max_parallelism,
                  str value_type, str reducer, ttl=None, count_expired=None, namespace_type=None):
        """Fold values into the state with a built-in reducer; the running aggregate after each
        row as an array of the state's type (int64 for count), null where none.

        ``keys``/``values`` as in :meth:`put_batch`, except that an integer (int64, uint64,
        int32) ``sum`` takes one chunk only (InvalidInputError otherwise): its overflow is found
        while applying, and the kernel's undo log covers one call.
        ``ttl``/``count_expired`` as in :meth:`get_batch` (batch.h "TTL"): rows fold into the
        unexpired aggregate and stamp ``now_ms``, null rows read as get_batch does; expired
        entries met are reported also when the batch fails (an int64 sum overflow undoes the
        aggregates but not what null rows removed or renewed, as the Python path)."""
        cdef c.BatchKeySpec spec = self._spec(key_type, assigner, max_parallelism, namespace_type)
        cdef c.TtlBatchSpec tspec = _ttl_spec(ttl)
        cdef int64_t expired = 0, chunk_expired = 0
        cdef _Chunks k = _Chunks(keys)
        cdef _Chunks v = _Chunks(values)
        cdef int64_t n = k.total
        cdef uint8_t[::1] valid
        cdef uint8_t[::1] out_bytes
        cdef uint8_t* out_base
        cdef size_t width, j, nchunks = k.count()
        cdef c.ValueSpec vt = _value_spec(value_type)
        cdef c.Reducer red
        if c.value_width(vt) == 0:
            raise InvalidInputError(f"add_batch kernel needs a fixed-width state, got {value_type!r}")
        if reducer not in _REDUCERS:
            raise InvalidInputError(f"reducer {reducer!r} has no batch kernel")
        if reducer == "sum" and value_type in ("int64", "int32", "uint64") and nchunks > 1:
            raise InvalidInputError(f"a {value_type} sum batch must be one chunk (its overflow "
                                    "rollback covers one kernel call)")
        k.check_aligned(v)
        red = _REDUCERS[reducer]
        width = c.value_width(vt)  # count states are int64 states: their output too
        # Not zeroed: the kernels write every row's validity and value (a null row's value
        # too), and the arrays are dropped when a kernel fails.
        valid_np = np.empty(max(n, 1), np.uint8)
        valid = valid_np
        vals = np.empty(max(n, 1) * width, np.uint8)
        out_bytes = vals
        out_base = &out_bytes[0]
        self._claim()
        try:
            with nogil:
                # The first chunk's kernel validates it before touching anything.
                for j in range(1, nchunks):
                    c.validate_batch(self.table[0], spec, k.inputs[j], vt, c.BatchOp.Add,
                                     red, v.inputs[j], tspec)
                for j in range(nchunks):
                    c.add_batch(self.table[0], spec, k.inputs[j], vt, red, v.inputs[j],
                                out_base + k.starts[j] * width, &valid[k.starts[j]], tspec,
                                &chunk_expired)
                    expired += chunk_expired
                    chunk_expired = 0
        except ValueError as e:
            raise InvalidInputError(str(e)) from None
        finally:
            self.busy = 0
            expired += chunk_expired
            if expired and count_expired is not None:
                count_expired(expired)
        return _fixed_out_array(value_type, vals, valid, n, width)

    # ---------------------------------------------- collection reads, removals, clear
    # (batch_reads.h). Chunked input as in get_batch/put_batch: a call that can change the
    # table (clear, remove, reads with TTL) validates every later chunk before the first is
    # applied; the outputs of all chunks are one result (the kernels append to one buffer).

    def clear_batch(self, keys, str key_type, str assigner, int32_t max_parallelism,
                    namespace_type=None):
        """Removes the entry of every key in row order (absent keys skipped); any state kind
        and value type (the value bytes are not read). ``keys`` as in :meth:`get_batch`.
        InvalidInputError on bad input, the table then unchanged."""
        cdef c.BatchKeySpec spec = self._spec(key_type, assigner, max_parallelism, namespace_type)
        cdef c.TtlBatchSpec none_ttl
        cdef _Chunks k = _Chunks(keys)
        cdef size_t j, nchunks = k.count()
        self._claim()
        try:
            with nogil:
                for j in range(1, nchunks):
                    c.validate_key_batch(self.table[0], spec, k.inputs[j], none_ttl)
                for j in range(nchunks):
                    c.clear_batch(self.table[0], spec, k.inputs[j])
        except ValueError as e:
            raise InvalidInputError(str(e)) from None
        finally:
            self.busy = 0

    def list_get_batch(self, keys, str key_type, str assigner, int32_t max_parallelism,
                       str element_type, ttl=None, count_expired=None, namespace_type=None):
        """ListState: the list of every key as a ``list<T>`` array (T the Arrow type of
        ``element_type``, as the Python backend's ``pa.list_(T)``; ``large_list`` / large
        element types only when the result holds 2**31 elements / bytes or more), one row per
        key, an empty list for an absent key, no nulls. ``keys``, ``ttl`` and
        ``count_expired`` as in :meth:`get_batch`; with TTL expired elements are dropped (and
        removed, counted) as batch_reads.h says. The GIL is released while the kernels run."""
        cdef c.BatchKeySpec spec = self._spec(key_type, assigner, max_parallelism, namespace_type)
        cdef c.TtlBatchSpec tspec = _ttl_spec(ttl)
        cdef _Chunks k = _Chunks(keys)
        cdef int64_t n = k.total
        cdef int64_t expired = 0, chunk_expired = 0
        cdef c.ValueSpec et = _value_spec(element_type)
        cdef vector[int64_t] list_offsets
        cdef vector[int64_t] element_offsets
        cdef vector[uint8_t] elements
        cdef size_t width = c.value_width(et), j, nchunks = k.count()
        list_offsets.push_back(0)
        element_offsets.push_back(0)
        self._claim()
        try:
            with nogil:
                if nchunks > 1 and tspec.enabled:
                    for j in range(1, nchunks):
                        c.validate_key_batch(self.table[0], spec, k.inputs[j], tspec)
                for j in range(nchunks):
                    c.list_get_batch(self.table[0], spec, k.inputs[j], et, list_offsets,
                                     elements, element_offsets, tspec, &chunk_expired)
                    expired += chunk_expired
                    chunk_expired = 0
        except ValueError as e:
            raise InvalidInputError(str(e)) from None
        finally:
            self.busy = 0
            expired += chunk_expired
            if expired and count_expired is not None:
                count_expired(expired)
        count = list_offsets.back()
        typ = VT.value_serializer(element_type).arrow_type
        data = _u8_array(elements)
        if width:
            if typ == pa.bool_():
                buf = pa.py_buffer(np.packbits(data, bitorder="little"))
            else:
                buf = pa.py_buffer(data)
            values = pa.Array.from_buffers(typ, count, [None, buf])
        else:
            small = elements.size() < 2**31
            if not small:
                typ = pa.large_string() if typ == pa.string() else pa.large_binary()
            values = pa.Array.from_buffers(typ, count, [None, pa.py_buffer(
                _offsets_array(element_offsets, small)), pa.py_buffer(data)])
        small = count < 2**31
        ltyp = pa.list_(values.type) if small else pa.large_list(values.type)
        return pa.Array.from_buffers(ltyp, n, [None, pa.py_buffer(
            _offsets_array(list_offsets, small))], children=[values])

    def map_get_batch(self, keys, user_keys, str key_type, str assigner,
                      int32_t max_parallelism, str user_key_type, str value_type, ttl=None,
                      count_expired=None, namespace_type=None):
        """MapState: the value of user_keys[i] in the map of keys[i], null where absent, as
        :meth:`get_batch` returns values (string -> large_string, binary -> large_binary).
        ``keys``/``user_keys`` chunked alike (as :meth:`map_put_batch`), no null user keys;
        ``ttl``/``count_expired`` as in :meth:`get_batch` (expired pairs removed, counted)."""
        cdef c.BatchKeySpec spec = self._spec(key_type, assigner, max_parallelism, namespace_type)
        cdef c.TtlBatchSpec tspec = _ttl_spec(ttl)
        cdef c.KeySchema uks = _key_schema(user_key_type)
        cdef _Chunks k = _Chunks(keys)
        cdef _Chunks u = _Chunks(user_keys)
        cdef int64_t n = k.total
        cdef int64_t expired = 0, chunk_expired = 0
        cdef c.ValueSpec vt = _value_spec(value_type)
        cdef c.MapGetOutput out
        cdef vector[int64_t] offsets
        cdef vector[uint8_t] data
        cdef uint8_t[::1] valid
        cdef uint8_t[::1] out_bytes
        cdef uint8_t* out_base = NULL
        cdef size_t width = c.value_width(vt), j, nchunks = k.count()
        k.check_aligned(u)
        valid_np = np.zeros(max(n, 1), np.uint8)
        valid = valid_np
        if width:
            vals = np.zeros(max(n, 1) * width, np.uint8)
            out_bytes = vals
            out_base = &out_bytes[0]
        offsets.push_back(0)
        out.offsets = &offsets
        out.data = &data
        self._claim()
        try:
            with nogil:
                if nchunks > 1 and tspec.enabled:
                    for j in range(1, nchunks):
                        c.validate_map_key_batch(self.table[0], spec, k.inputs[j], uks,
                                                 u.inputs[j], tspec)
                for j in range(nchunks):
                    out.valid = &valid[k.starts[j]]
                    if width:
                        out.fixed = out_base + k.starts[j] * width
                    c.map_get_batch(self.table[0], spec, k.inputs[j], uks, u.inputs[j], vt, out,
                                    tspec, &chunk_expired)
                    expired += chunk_expired
                    chunk_expired = 0
        except ValueError as e:
            raise InvalidInputError(str(e)) from None
        finally:
            self.busy = 0
            expired += chunk_expired
            if expired and count_expired is not None:
                count_expired(expired)
        if width:
            return _fixed_out_array(value_type, vals, valid, n, width)
        typ = pa.large_string() if value_type == "string" else pa.large_binary()
        return pa.Array.from_buffers(typ, n, [_bitmap(valid[:n], n), pa.py_buffer(
            _offsets_array(offsets, False)), pa.py_buffer(_u8_array(data))])

    def map_contains_batch(self, keys, user_keys, str key_type, str assigner,
                           int32_t max_parallelism, str user_key_type, str value_type, ttl=None,
                           count_expired=None, namespace_type=None):
        """MapState: a bool array (no nulls), true where user_keys[i] is in the map of keys[i]
        (with TTL: where :meth:`map_get_batch` would return a value, with the same removals,
        renewals and counts). Arguments as :meth:`map_get_batch`."""
        cdef c.BatchKeySpec spec = self._spec(key_type, assigner, max_parallelism, namespace_type)
        cdef c.TtlBatchSpec tspec = _ttl_spec(ttl)
        cdef c.KeySchema uks = _key_schema(user_key_type)
        cdef _Chunks k = _Chunks(keys)
        cdef _Chunks u = _Chunks(user_keys)
        cdef int64_t n = k.total
        cdef int64_t expired = 0, chunk_expired = 0
        cdef c.ValueSpec vt = _value_spec(value_type)
        cdef uint8_t[::1] found
        cdef size_t j, nchunks = k.count()
        k.check_aligned(u)
        found_np = np.zeros(max(n, 1), np.uint8)
        found = found_np
        self._claim()
        try:
            with nogil:
                if nchunks > 1 and tspec.enabled:
                    for j in range(1, nchunks):
                        c.validate_map_key_batch(self.table[0], spec, k.inputs[j], uks,
                                                 u.inputs[j], tspec)
                for j in range(nchunks):
                    c.map_contains_batch(self.table[0], spec, k.inputs[j], uks, u.inputs[j], vt,
                                         &found[k.starts[j]], tspec, &chunk_expired)
                    expired += chunk_expired
                    chunk_expired = 0
        except ValueError as e:
            raise InvalidInputError(str(e)) from None
        finally:
            self.busy = 0
            expired += chunk_expired
            if expired and count_expired is not None:
                count_expired(expired)
        return pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(
            np.packbits(found_np[:n], bitorder="little"))])

    def map_remove_batch(self, keys, user_keys, str key_type, str assigner,
                         int32_t max_parallelism, str user_key_type, namespace_type=None):
        """MapState: removes user_keys[i] from the map of keys[i] in row order; a map left
        empty is removed. Chunked as :meth:`map_put_batch`, every chunk validated before the
        first is applied. InvalidInputError on bad input, the table then unchanged."""
        cdef c.BatchKeySpec spec = self._spec(key_type, assigner, max_parallelism, namespace_type)
        cdef c.TtlBatchSpec none_ttl
        cdef c.KeySchema uks = _key_schema(user_key_type)
        cdef _Chunks k = _Chunks(keys)
        cdef _Chunks u = _Chunks(user_keys)
        cdef size_t j, nchunks = k.count()
        k.check_aligned(u)
        self._claim()
        try:
            with nogil:
                for j in range(1, nchunks):
                    c.validate_map_key_batch(self.table[0], spec, k.inputs[j], uks, u.inputs[j],
                                             none_ttl)
                for j in range(nchunks):
                    c.map_remove_batch(self.table[0], spec, k.inputs[j], uks, u.inputs[j])
        except ValueError as e:
            raise InvalidInputError(str(e)) from None
        finally:
            self.busy = 0



cdef _u8_array(vector[uint8_t]& v):
    """A numpy uint8 copy of a kernel's byte output (one memcpy)."""
    out = np.empty(v.size(), np.uint8)
    cdef uint8_t[::1] dst = out
    if v.size():
        memcpy(&dst[0], v.data(), v.size())
    return out



cdef _offsets_array(vector[int64_t]& v, bint small):
    """A kernel's int64 offsets as an Arrow offsets buffer: int32 when ``small`` (the last
    offset fits), else int64."""
    out = np.empty(v.size(), np.int64)
    cdef int64_t[::1] dst = out
    if v.size():
        memcpy(&dst[0], v.data(), v.size() * 8)
    return out.astype(np.int32) if small else out

cdef _concat_var(vector[vector[int64_t]]& offsets, vector[vector[uint8_t]]& data, int64_t n):
    """One int64 offsets array and one data array from get_batch_var's per-chunk outputs."""
    cdef size_t j, total = 0
    cdef int64_t i, base = 0, row = 0, m
    for j in range(data.size()):
        total += data[j].size()
    off_np = np.zeros(n + 1, np.int64)
    data_np = np.empty(total, np.uint8)
    cdef int64_t[::1] off = off_np
    cdef uint8_t[::1] dst = data_np
    for j in range(offsets.size()):
        m = <int64_t>offsets[j].size() - 1
        for i in range(m):
            off[row + i + 1] = base + offsets[j][i + 1]
        if data[j].size():
            memcpy(&dst[base], data[j].data(), data[j].size())
        row += m
        base += data[j].size()
    return off_np, data_np


# ----------------------------------------------------------------------------- async snapshot writer

from concurrent.futures import CancelledError
from cpython.buffer cimport PyBUF_WRITABLE


def lz4_block_compress(data):
    """``data`` (any contiguous buffer, bytes) in the LZ4 block format without a stored size, as
    ``bytes``: the bytes ``lz4.block.compress(data, mode="fast", acceleration=2,
    store_size=False)`` (format.LZ4_ACCELERATION) give with the same LZ4 release
    (native/third_party/lz4: 1.9.4), computed with the GIL released. Raises InvalidInputError
    for more than LZ4's input limit (about 2 GiB)."""
    cdef const uint8_t[::1] v = memoryview(data).cast("B")
    cdef size_t n = v.shape[0]
    cdef const uint8_t* p = &v[0] if n else NULL
    cdef vector[uint8_t] out
    if n and c.lz4_block_bound(n) == 0:
        raise InvalidInputError(f"a block of {n} bytes exceeds the LZ4 input limit")
    with nogil:
        c.lz4_block_compress(p, n, &out)
    return PyBytes_FromStringAndSize(<const char*>out.data(), out.size())


def decode_blocks(data, blocks, uint64_t base, bint has_validity):
    """The entries of consecutive stored blocks of one (state, key group) of a checkpoint data
    file (checkpoint/format.py), checked, decompressed and parsed with the GIL released: the
    native form of ``DataFileReader.entries``' loop over ``format.decode_block``, with the same
    checks. ``data``: the group's stored bytes (any buffer); ``blocks``: its rows of the block
    table (numpy, ``format.BLOCK_DTYPE``) whose ``offset`` counts from the file start, ``base``
    the file offset of ``data[0]``; ``has_validity``: incremental file (NULL value =
    tombstone). Returns ``(keys, values, None, None)`` -- ``pa.binary()`` arrays over buffers
    of :mod:`statecore.checkpoint.scratch`, reused once the arrays are gone -- or
    ``(None, None, i, reason)`` for the first bad block ``blocks[i]``."""
    cdef const uint8_t[::1] d = memoryview(data).cast("B")
    cdef size_t size = d.shape[0]
    cdef size_t nb = len(blocks), i
    cdef vector[c.StoredBlockRef] refs
    cdef const uint64_t[::1] off = np.ascontiguousarray(blocks["offset"], np.uint64)
    cdef const uint64_t[::1] sl = np.ascontiguousarray(blocks["stored_length"], np.uint64)
    cdef const uint64_t[::1] rl = np.ascontiguousarray(blocks["raw_length"], np.uint64)
    cdef const uint64_t[::1] en = np.ascontiguousarray(blocks["entries"], np.uint64)
    cdef const uint64_t[::1] xx = np.ascontiguousarray(blocks["xxh64"], np.uint64)
    cdef uint64_t n = 0, raw = 0
    refs.resize(nb)
    for i in range(nb):
        # An offset before the group's bytes wraps to a huge one, which the bounds check rejects.
        refs[i].offset = off[i] - base
        refs[i].stored_length = sl[i]
        refs[i].raw_length = rl[i]
        refs[i].entries = en[i]
        refs[i].xxh64 = xx[i]
        n += en[i]
        raw += rl[i]
    if n > 2**31 - 2:
        return None, None, 0, f"{n} entries in one read (a key group or a range of them) exceed an Arrow binary array"
    # Reused memory (checkpoint/scratch.py says why); imported here: the checkpoint package
    # imports this module.
    from statecore.checkpoint.scratch import take
    ko_np = take(4 * (n + 1)).view(np.int32)
    vo_np = take(4 * (n + 1)).view(np.int32)
    kd_np = take(max(raw, 1))
    vd_np = take(max(raw, 1))
    va_np = take(max((n + 7) // 8, 1))
    cdef int32_t[::1] ko = ko_np
    cdef int32_t[::1] vo = vo_np
    cdef uint8_t[::1] kd = kd_np
    cdef uint8_t[::1] vd = vd_np
    cdef uint8_t[::1] va = va_np
    cdef c.DecodeBuffers bufs
    bufs.key_offsets = &ko[0]
    bufs.value_offsets = &vo[0]
    bufs.key_data = &kd[0]
    bufs.value_data = &vd[0]
    bufs.data_capacity = max(raw, 1)
    bufs.validity = &va[0]
    cdef const uint8_t* p = &d[0] if size else NULL
    cdef c.DecodeResult r
    with nogil:
        r = c.decode_blocks(p, size, refs.data(), nb, has_validity, bufs)
    if r.failed_block >= 0:
        return None, None, r.failed_block, r.error.decode("utf-8", "replace")
    validity = pa.py_buffer(va_np) if r.tombstones else None
    keys = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(ko_np),
                                                  pa.py_buffer(kd_np[:r.key_bytes])])
    values = pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(vo_np),
                                                    pa.py_buffer(vd_np[:r.value_bytes])],
                                   null_count=r.tombstones)
    return keys, values, None, None


cdef int _export_bytes(Py_buffer* buf, int flags, object owner, vector[uint8_t]* data,
                       Py_ssize_t* shape, Py_ssize_t* strides, str what) except -1:
    """Fills ``buf`` as a read-only 1-D byte view of ``data``, which ``owner`` keeps alive."""
    if flags & PyBUF_WRITABLE:
        raise BufferError(f"a serialized {what} is read-only")
    shape[0] = data.size()
    strides[0] = 1
    buf.buf = <void*>data.data()
    buf.obj = owner
    buf.len = shape[0]
    buf.readonly = 1
    buf.itemsize = 1
    buf.format = "B"
    buf.ndim = 1
    buf.shape = shape
    buf.strides = strides
    buf.suboffsets = NULL
    buf.internal = NULL
    return 0


cdef class SerializedChunk:
    """Consecutive stored (compressed, checksummed) blocks of a checkpoint data file, from
    :meth:`SnapshotBlockSerializer.next_chunk`: their concatenated bytes through the read-only
    buffer protocol (zero copy: ``out.write(chunk)``), and ``blocks``, one tuple per block in
    file order: ``(key_group, state, entries, tombstones, last_of_group, stored_length,
    raw_length, xxh64)`` (lengths in bytes; ``xxh64``: XXH64 seed 0 of the stored bytes)."""
    cdef c.BlockChunk chunk
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]

    @property
    def blocks(self):
        return [(b.key_group, b.state, b.entries, b.tombstones, b.last_of_group,
                 b.stored_length, b.raw_length, b.xxh64) for b in self.chunk.blocks]

    def __len__(self):
        return self.chunk.bytes.size()

    def __getbuffer__(self, Py_buffer* buf, int flags):
        _export_bytes(buf, flags, self, &self.chunk.bytes, self.shape, self.strides, "chunk")

    def __releasebuffer__(self, Py_buffer* buf):
        pass


cdef class SerializedBlock:
    """One uncompressed block payload of a checkpoint data file (layout: checkpoint/format.py),
    produced by :class:`SnapshotBlockSerializer`. Exposes its bytes through the read-only buffer
    protocol (zero copy: ``lz4.block.compress(block)``, ``memoryview(block)``). Attributes:
    ``key_group``, ``state`` (index into the serializer's sources), ``entries`` (incl.
    tombstones), ``tombstones``, ``last_of_group`` (last block of its (state, key group))."""
    cdef c.BlockPayload payload
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]

    @property
    def key_group(self):
        return self.payload.key_group

    @property
    def state(self):
        return self.payload.state

    @property
    def entries(self):
        return self.payload.entries

    @property
    def tombstones(self):
        return self.payload.tombstones

    @property
    def last_of_group(self):
        return self.payload.last_of_group

    def __len__(self):
        return self.payload.bytes.size()

    def __getbuffer__(self, Py_buffer* buf, int flags):
        _export_bytes(buf, flags, self, &self.payload.bytes, self.shape, self.strides, "block")

    def __releasebuffer__(self, Py_buffer* buf):
        pass


cdef void _fill_static(c.SortedRun* out, keys, values) except *:
    """Copies (keys, values) pa.binary arrays (NULL value = tombstone) into a SortedRun."""
    cdef int64_t n = len(keys), i
    if len(values) != n:
        raise InvalidInputError(f"{n} keys but {len(values)} values")
    keys = keys.cast(pa.binary()) if keys.type != pa.binary() else keys
    values = values.cast(pa.binary()) if values.type != pa.binary() else values
    if keys.null_count:
        raise InvalidInputError("keys must not be null")
    kb, vb = keys.buffers(), values.buffers()
    ko = np.frombuffer(kb[1], np.int32)[keys.offset:keys.offset + n + 1].astype(np.uint64)
    vo = np.frombuffer(vb[1], np.int32)[values.offset:values.offset + n + 1].astype(np.uint64)
    kd = np.frombuffer(kb[2], np.uint8)[int(ko[0]):int(ko[n])] if kb[2] is not None else np.zeros(0, np.uint8)
    vd = np.frombuffer(vb[2], np.uint8)[int(vo[0]):int(vo[n])] if vb[2] is not None else np.zeros(0, np.uint8)
    ko -= ko[0]
    vo -= vo[0]
    out.key_offsets.resize(n + 1)
    out.value_offsets.resize(n + 1)
    out.key_data.resize(kd.shape[0])
    out.value_data.resize(vd.shape[0])
    cdef const uint64_t[::1] kov = ko
    cdef const uint64_t[::1] vov = vo
    cdef const uint8_t[::1] kdv = kd
    cdef const uint8_t[::1] vdv = vd
    for i in range(n + 1):
        out.key_offsets[i] = kov[i]
        out.value_offsets[i] = vov[i]
    if kd.shape[0]:
        memcpy(out.key_data.data(), &kdv[0], kd.shape[0])
    if vd.shape[0]:
        memcpy(out.value_data.data(), &vdv[0], vd.shape[0])
    if values.null_count:
        valid = values.is_valid().to_numpy(zero_copy_only=False)
        out.valid.resize(n)
        for i in range(n):
            out.valid[i] = 1 if valid[i] else 0


cdef class SnapshotBlockSerializer:
    """Background C++ thread producing the block payloads of one checkpoint data file from native
    table snapshots (native/include/statecore/snapshot_writer.h is the design).

    ``sources``: one tuple per state in file order: ``(name, NativeTableSnapshot, changes: bool,
    base: int[, None, ttl])`` -- entries, or with ``changes`` the changes since table version
    ``base`` with tombstones; ``ttl`` = ``(kind, fixed_width, ttl_ms, now)`` filters full listings
    through the TTL filter (full-snapshot cleanup, counted in ``stats()["ttl_expired"]``) -- or ``(name, None, False, 0, {kg: (keys, values)})`` for entries materialized
    in Python (timers; pa.binary arrays, NULL value = tombstone). ``kg_start``/``kg_end``:
    inclusive key-group range of the file (``kg_end < kg_start``: empty). ``prefix_bytes``: 1 or
    2 (key-group prefix width). ``block_target_bytes``: uncompressed block target (bytes).
    ``incremental``: append the validity bitmap. ``queue_blocks``: bounded queue capacity (memory
    bound: that many payloads). ``release_as_written``: release each key group's map snapshot
    as soon as it is encoded (the table snapshots become unusable for readers). ``nice``: added to
    the producer thread's nice value (Linux; 0 = unchanged).

    The table snapshots must stay unreleased by others while the serializer runs (the Python
    wrapper keeps references to them). Raises InvalidInputError for bad arguments or a released
    table snapshot.
    """
    cdef c.SnapshotSerializer* ser
    cdef object keep

    def __cinit__(self, sources, int32_t kg_start, int32_t kg_end, int prefix_bytes,
                  size_t block_target_bytes, bint incremental, size_t queue_blocks=4,
                  bint release_as_written=False, int nice=0):
        cdef vector[c.SerializerSource]* srcs = c.new_sources()
        cdef c.SerializerSource* st
        cdef c.SerializerOptions o
        cdef NativeTableSnapshot ts
        self.keep = []
        try:
            for src in sources:
                name = src[0].encode("utf-8")
                if src[1] is not None:
                    ts = src[1]
                    if ts.released:
                        raise InvalidInputError(f"state {src[0]!r}: the table snapshot was released")
                    c.add_table_source(srcs, name, ts.snap[0], bool(src[2]), src[3])
                    if len(src) > 5 and src[5] is not None:
                        kind, width, ttl_ms, now = src[5]
                        c.set_source_ttl(srcs, _ttl_filter_spec(kind, width, ttl_ms), now)
                    self.keep.append(ts)
                else:
                    st = c.add_static_source(srcs, name)
                    for kg, (keys, values) in sorted((src[4] or {}).items()):
                        if len(keys):
                            _fill_static(c.static_group(st, kg), keys, values)
            o.kg_start = kg_start
            o.kg_end = kg_end
            o.prefix_bytes = prefix_bytes
            o.block_target_bytes = block_target_bytes
            o.incremental = incremental
            o.queue_blocks = queue_blocks
            o.release_as_written = release_as_written
            o.nice = nice
            try:
                self.ser = c.new_serializer(srcs, o)
            except ValueError as e:
                raise InvalidInputError(str(e)) from None
        finally:
            del srcs

    def __dealloc__(self):
        if self.ser != NULL:
            with nogil:
                del self.ser  # cancels and joins the producer

    def start(self):
        """Launch the producer thread."""
        self.ser.start()

    def next_block(self):
        """The next :class:`SerializedBlock` in file order, or None after the last one. Waits
        with the GIL released. Raises InvalidInputError when the snapshot broke its contract,
        ``concurrent.futures.CancelledError`` after :meth:`cancel`."""
        cdef SerializedBlock b = SerializedBlock.__new__(SerializedBlock)
        cdef int r
        try:
            with nogil:
                r = c.serializer_next(self.ser, &b.payload)
        except ValueError as e:
            raise InvalidInputError(str(e)) from None
        if r < 0:
            raise CancelledError("snapshot serialization was cancelled")
        return b if r else None

    def next_chunk(self, size_t target_bytes):
        """The next blocks in file order as a :class:`SerializedChunk`, compressed and
        checksummed with the GIL released, at least ``target_bytes`` stored bytes unless the
        file ends first; None after the last block. The GIL is taken back once per chunk rather
        than once per block (snapshot_writer.h next_chunk says why). Raises as
        :meth:`next_block`."""
        cdef SerializedChunk ch = SerializedChunk.__new__(SerializedChunk)
        cdef int r
        try:
            with nogil:
                r = c.serializer_next_chunk(self.ser, &ch.chunk, target_bytes)
        except ValueError as e:
            raise InvalidInputError(str(e)) from None
        if r < 0:
            raise CancelledError("snapshot serialization was cancelled")
        return ch if r else None

    def cancel(self):
        """Stop the producer (at its next block) and wait for its thread; idempotent, any
        thread."""
        with nogil:
            self.ser.cancel()

    def stats(self):
        """``{"blocks", "payload_bytes", "max_queued", "producer_waits", "ttl_expired"}`` so
        far."""
        cdef c.SerializerStats s = self.ser.stats()
        return {"blocks": s.blocks, "payload_bytes": s.payload_bytes,
                "max_queued": s.max_queued, "producer_waits": s.producer_waits,
                "ttl_expired": s.ttl_expired}


def _table_reclaim(NativeStateTable table):
    """Free now, in every key group of ``table``, the retired entries of released snapshots
    (otherwise freed at each map's next operation). Owner thread. Returns the retired entries
    still held (needed by live snapshots)."""
    cdef int32_t kg
    cdef size_t held = 0
    for kg in range(table.kg_start, table.kg_end + 1):
        table.table.map(kg).reclaim()
        held += table.table.map(kg).retired_entries()
    return held

# Hashes, key groups and per-record keys: XXH64 / Murmur3, the Spark and Flink key-group
# assigners, KeyEncoder (prefix | ser(key) of the per-record path) and Flink's operator-index
# helpers (KeyGroupRangeAssignment).

def cpu_dispatch():
    """The x86-64 level that this process's vectorized batch loops run (native/src/
    multiversion.h), read once per process: ``{"level": ..., "detected": ...}``, each one of
    ``"baseline"``, ``"x86-64-v3"`` (AVX2) and ``"x86-64-v4"`` (AVX-512). ``detected`` is the
    highest level the CPU and the OS support; ``level`` is lowered from it by the environment
    variable ``STATECORE_CPU`` (``auto`` or one of the level names)."""
    cdef c.Dispatch d = c.dispatch()
    return {"level": c.level_name(d.level).decode(), "detected": c.level_name(d.detected).decode()}


def _check_cpu_request():
    """Raises InvalidInputError when ``STATECORE_CPU`` names no level (the loops would run the
    baseline): a misspelt request fails at import instead of measuring the wrong path."""
    if not c.dispatch().request_valid:
        import os

        raise InvalidInputError(
            f"STATECORE_CPU={os.environ.get('STATECORE_CPU')!r} is not a CPU level: use auto, "
            "baseline, x86-64-v3 or x86-64-v4")


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


cdef enum _KeyFast:
    _KEY_GENERIC = 0
    _KEY_INT64 = 1
    _KEY_INT32 = 2
    _KEY_STRING = 3


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


def default_max_parallelism(int32_t parallelism):
    """Flink computeDefaultMaxParallelism."""
    return c.default_max_parallelism(parallelism)


def key_group_range_for_operator(int32_t max_parallelism, int32_t parallelism, int32_t index):
    """Flink computeKeyGroupRangeForOperatorIndex -> (start, end), inclusive."""
    r = c.key_group_range_for_operator(max_parallelism, parallelism, index)
    return (r.start, r.end)


def operator_index_for_key_group(int32_t max_parallelism, int32_t parallelism, int32_t key_group):
    """Flink computeOperatorIndexForKeyGroup."""
    return c.operator_index_for_key_group(max_parallelism, parallelism, key_group)

# Stored values of the per-record path: a state's value, list blob or map entry (with or without
# the TTL timestamp suffix; docs/formats.md "Values", "Map state", "TTL suffix") decoded to and
# encoded from their Python stored forms, as the reference backend's serializers do
# (statecore.serializers).

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

# A map entry holds one user value, a list entry one chunk of elements (docs/formats.md "Map
# state", "List state").
_LAYOUTS = {"value": _LAYOUT_VALUE, "reducing": _LAYOUT_VALUE, "aggregating": _LAYOUT_VALUE,
            "list": _LAYOUT_LIST, "map": _LAYOUT_VALUE}


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


cdef object _decode_value(const uint8_t* p, size_t n, _Fmt f, bint ttl):
    if not ttl:
        return _decode_stored(p, n, f)
    if n < 8:
        raise InvalidInputError(f"TTL value of {n} bytes lacks its 8-byte timestamp")
    return (_decode_stored(p, n - 8, f), <int64_t>_get_be(p + n - 8, 8))


# A list chunk (docs/formats.md "List state") as its stored form, a list of elements (each
# ``(element, ts)`` with TTL), and back.
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


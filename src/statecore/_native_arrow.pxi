# Arrow in and out: arrays imported through the C Data Interface for the batch kernels
# (_Imported, _Chunks), raw views of pa.binary (keys, values) pairs for the bulk paths
# (_binary_run, _Entries), and the Arrow arrays built from kernel outputs.

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


def utf8_errors(offsets, data):
    """The UTF-8 check the batch kernels make of string columns (native/include/statecore/
    detail/utf8.h: the Unicode Standard's Table 3-7), for each of the byte strings
    ``data[offsets[i]:offsets[i + 1]]`` (``offsets``: int64 array of n + 1 non-decreasing
    offsets into the uint8 array ``data``). Returns ``(codes, at)``, two int64 arrays of n:
    0 for a well-formed string, else the error code (:func:`utf8_error_name`) and in ``at``
    the offset of the ill-formed sequence's first byte within the string. For tests of the
    validator against Python's decoder."""
    cdef const int64_t[::1] o = np.ascontiguousarray(offsets, np.int64)
    cdef const uint8_t[::1] d = np.ascontiguousarray(data, np.uint8)
    cdef int64_t n = o.shape[0] - 1, i
    cdef size_t pos
    if n < 0:
        raise InvalidInputError("utf8_errors: offsets must hold at least one value")
    for i in range(n):
        if o[i] < 0 or o[i + 1] < o[i] or o[i + 1] > d.shape[0]:
            raise InvalidInputError(f"utf8_errors: bad offsets at string {i}")
    codes = np.zeros(n, np.int64)
    at = np.zeros(n, np.int64)
    cdef int64_t[::1] cv = codes
    cdef int64_t[::1] av = at
    cdef const uint8_t* base = &d[0] if d.shape[0] else <const uint8_t*>NULL
    with nogil:
        for i in range(n):
            pos = 0
            if o[i + 1] > o[i]:
                cv[i] = c.utf8_check(base + o[i], <size_t>(o[i + 1] - o[i]), &pos)
                av[i] = <int64_t>pos
    return codes, at


def utf8_error_name(int code) -> str:
    """The words for an error code of :func:`utf8_errors` ("overlong form", ...)."""
    return c.utf8_error_name(code).decode()


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


cdef object _bitmap(uint8_t[::1] valid, int64_t n):
    """Arrow validity bitmap (LSB bit order) from a byte map; None when all valid. Every batch
    output passes here, so "all valid?" is one memchr over the bytes rather than a numpy
    reduction, which builds a temporary array."""
    if n == 0 or memchr(&valid[0], 0, <size_t>n) == NULL:
        return None
    return pa.py_buffer(np.packbits(np.asarray(valid), bitorder="little"))


cdef _fixed_out_array(str value_type, vals, uint8_t[::1] valid, int64_t n, size_t width):
    """The Arrow array of a fixed-width kernel output: ``vals`` holds ``width`` bytes per row
    (bool: a 0/1 byte per row, bit-packed here), ``valid`` a 0/1 byte per row."""
    typ = VT.value_serializer(value_type).arrow_type
    if typ == pa.bool_():
        buf = pa.py_buffer(np.packbits(vals[:n], bitorder="little"))
    else:
        buf = pa.py_buffer(vals[:n * width])
    return pa.Array.from_buffers(typ, n, [_bitmap(valid[:n], n), buf])


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

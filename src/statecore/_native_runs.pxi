# Sorted runs of entries outside a table: the newest-wins merge of checkpoint runs, the TTL
# filter over Arrow entries and the check of entries about to be bulk-loaded.

def merge_newest_wins(parts, bint keep_tombstones=False):
    """Newest-wins merge of sorted runs of one key group (sorted_run.h ``merge_newest_wins``):
    ``parts`` = ``[(keys, values), ...]`` newest first, ``pa.binary()`` arrays (sliced ones too),
    each run's keys strictly ascending in byte order, a NULL value = tombstone. Returns
    ``(keys, values)``, new ``pa.binary()`` arrays without NULLs, sorted by key: per key the
    newest entry, keys whose newest entry is a tombstone left out (with ``keep_tombstones``:
    kept as a NULL value, a change set's deletion) -- what the checkpoint store's sort-based
    merge computes, in one k-way pass with the GIL released. Raises InvalidInputError for another array type, mismatched lengths, a
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
    with nogil:
        c.merge_newest_wins(runs, &picks, keep_tombstones)
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

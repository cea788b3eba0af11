# Checkpoint data-file blocks: LZ4 block compression, decoding stored blocks into Arrow arrays,
# and SnapshotBlockSerializer, the background producer of a data file's blocks from table
# snapshots (native/include/statecore/snapshot_writer.h).

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


def key_hashes(keys):
    """XXH64 (seed 0) of every value of the ``pa.binary()`` array ``keys`` (no nulls; the
    values of a sliced array as sliced), as a numpy uint64 array, computed with the GIL
    released: the hashes of format-6 Bloom filters (docs/formats.md "Filters and block
    keys")."""
    cdef int64_t n = len(keys), i
    out_np = np.empty(n, np.uint64)
    if n == 0:
        return out_np
    bufs = keys.buffers()
    off_np = np.frombuffer(bufs[1], np.int32)[keys.offset:keys.offset + n + 1]
    data_np = (np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None and len(bufs[2])
               else np.zeros(1, np.uint8))
    if off_np[0] < 0 or off_np[n] > len(data_np) or bool(np.any(np.diff(off_np) < 0)):
        raise InvalidInputError("keys: offsets do not fit the data")
    cdef const int32_t[::1] off = np.ascontiguousarray(off_np)
    cdef const uint8_t[::1] data = data_np
    cdef uint64_t[::1] out = out_np
    with nogil:
        for i in range(n):
            out[i] = c.xxh64(&data[0] + off[i], off[i + 1] - off[i], 0)
    return out_np


def bloom_filter_of_keys(keys, uint32_t bits_per_key):
    """The Bloom filter (docs/formats.md "Filters and block keys") of the values of the
    ``pa.binary()`` array ``keys`` (no nulls; a sliced array as sliced) with ``bits_per_key``
    (1 to 64) bits per key, as ``bytes``: the bytes of
    ``blocks.bloom_filter(key_hashes(keys), bits_per_key)``, hashed and set in one pass with the
    GIL released (block_codec.h ``bloom_filter_build``). Raises InvalidInputError for offsets
    that do not fit the data or ``bits_per_key`` out of range."""
    if bits_per_key < 1 or bits_per_key > 64:
        raise InvalidInputError(f"bits_per_key must be in [1, 64], got {bits_per_key}")
    cdef int64_t n = len(keys)
    cdef vector[uint8_t] out
    cdef const int32_t[::1] off
    cdef const uint8_t[::1] data
    if n == 0:
        with nogil:
            c.bloom_filter_build(NULL, NULL, 0, bits_per_key, &out)
        return PyBytes_FromStringAndSize(<const char*>out.data(), out.size())
    bufs = keys.buffers()
    off_np = np.frombuffer(bufs[1], np.int32)[keys.offset:keys.offset + n + 1]
    data_np = (np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None and len(bufs[2])
               else np.zeros(1, np.uint8))
    if off_np[0] < 0 or off_np[n] > len(data_np) or bool(np.any(np.diff(off_np) < 0)):
        raise InvalidInputError("keys: offsets do not fit the data")
    off = np.ascontiguousarray(off_np)
    data = data_np
    with nogil:
        c.bloom_filter_build(&off[0], &data[0], n, bits_per_key, &out)
    return PyBytes_FromStringAndSize(<const char*>out.data(), out.size())


def bloom_probe_hashes(filt, uint32_t k, hashes):
    """Numpy bool array: for each XXH64 of ``hashes`` (uint64 array), whether the Bloom filter
    ``filt`` (bytes-like, at least 8 bytes) with ``k`` probes may hold its key (False:
    certainly not), computed with the GIL released; ``blocks.bloom_probe`` with the same
    arguments gives the same array."""
    cdef const uint8_t[::1] f = memoryview(filt).cast("B")
    cdef size_t nbytes = f.shape[0]
    if nbytes == 0:
        raise InvalidInputError("a Bloom filter of 0 bytes")
    cdef const uint64_t[::1] h = np.ascontiguousarray(hashes, dtype=np.uint64)
    cdef Py_ssize_t n = h.shape[0]
    out_np = np.empty(n, dtype=np.bool_)
    if n == 0:
        return out_np
    cdef uint8_t[::1] out = out_np.view(np.uint8)
    with nogil:
        c.bloom_probe_many(&f[0], nbytes, k, &h[0], n, &out[0])
    return out_np


cdef inline int64_t _search(const int32_t* off, const uint8_t* data, int64_t n,
                            const uint8_t* q, int64_t ql) noexcept nogil:
    """Index of the value equal to ``q[0, ql)`` among the ``n`` ascending binary values given
    by ``off``/``data``, or -1."""
    cdef int64_t lo = 0, hi = n, mid, hl, m
    cdef int c
    cdef const uint8_t* h
    while lo < hi:
        mid = lo + (hi - lo) // 2
        h = data + off[mid]
        hl = off[mid + 1] - off[mid]
        m = ql if ql < hl else hl
        c = memcmp(h, q, m) if m else 0
        if c == 0:
            c = (hl > ql) - (hl < ql)
        if c == 0:
            return mid
        if c < 0:
            lo = mid + 1
        else:
            hi = mid
    return -1


cdef const uint8_t* _addr(buf, int64_t skip):
    """Address of byte ``skip`` of the pa.Buffer ``buf`` (NULL for a missing buffer)."""
    if buf is None:
        return NULL
    return <const uint8_t*><size_t>buf.address + skip


def lookup_in_blocks(blocks, which, needles):
    """Point lookups in decoded checkpoint blocks: ``blocks`` a list of ``(keys, values)``
    pairs of ``pa.binary()`` arrays (keys ascending by bytes and unique, no nulls; a NULL value
    is a tombstone), ``which`` (int64, one per needle) the block to search each needle of the
    ``pa.binary()`` array ``needles`` in. Returns ``(rows, values)``: ``rows`` (numpy int64) the
    needle's row in its block or -1, ``values`` a ``pa.binary()`` array of the needles' values,
    NULL where not found or a tombstone. A byte-wise binary search per needle and one gather,
    with the GIL released (statecore.checkpoint.lookup)."""
    cdef int64_t nn = len(needles), nb = len(blocks), i, b, r, total = 0, at
    which_np = np.ascontiguousarray(which, np.int64)
    if len(which_np) != nn:
        raise InvalidInputError(f"{nn} needles but {len(which_np)} block numbers")
    if nn and (which_np.min() < 0 or which_np.max() >= nb):
        raise InvalidInputError("a block number is outside the blocks")
    cdef vector[const int32_t*] kof, vof
    cdef vector[const uint8_t*] kdat, vdat, vbits
    cdef vector[int64_t] klen, vbit0
    for keys, values in blocks:
        if keys.null_count or len(keys) != len(values):
            raise InvalidInputError("block keys must hold no nulls and pair up with values")
        kb, vb = keys.buffers(), values.buffers()
        kof.push_back(<const int32_t*>_addr(kb[1], 4 * keys.offset))
        kdat.push_back(_addr(kb[2], 0))
        klen.push_back(len(keys))
        vof.push_back(<const int32_t*>_addr(vb[1], 4 * values.offset))
        vdat.push_back(_addr(vb[2], 0))
        vbits.push_back(_addr(vb[0], 0) if values.null_count else NULL)
        vbit0.push_back(values.offset)
    nb_ = needles.buffers()
    cdef const int32_t* qoff = <const int32_t*>_addr(nb_[1], 4 * needles.offset)
    cdef const uint8_t* qdat = _addr(nb_[2], 0)
    rows_np = np.full(nn, -1, np.int64)
    cdef int64_t[::1] rows = rows_np
    cdef const int64_t[::1] wh = which_np
    cdef int64_t bit
    with nogil:
        for i in range(nn):
            b = wh[i]
            if klen[b] == 0:
                continue
            r = _search(kof[b], kdat[b], klen[b], qdat + qoff[i], qoff[i + 1] - qoff[i])
            if r < 0:
                continue
            bit = vbit0[b] + r
            if vbits[b] != NULL and not (vbits[b][bit >> 3] >> (bit & 7)) & 1:
                rows[i] = r  # a tombstone: found, no value
                continue
            rows[i] = r
            total += vof[b][r + 1] - vof[b][r]
    if total > 2**31 - 1:
        raise InvalidInputError(f"{total} bytes of values exceed an Arrow binary array")
    off_np = np.zeros(nn + 1, np.int32)
    data_np = np.empty(max(total, 1), np.uint8)
    valid_np = np.zeros((nn + 7) // 8, np.uint8)
    cdef int32_t[::1] off = off_np
    cdef uint8_t[::1] data = data_np
    cdef uint8_t[::1] valid = valid_np
    cdef int64_t nulls = 0, ln
    at = 0
    with nogil:
        for i in range(nn):
            r = rows[i]
            b = wh[i]
            if r >= 0:
                bit = vbit0[b] + r
                if vbits[b] == NULL or (vbits[b][bit >> 3] >> (bit & 7)) & 1:
                    ln = vof[b][r + 1] - vof[b][r]
                    if ln:
                        memcpy(&data[0] + at, vdat[b] + vof[b][r], ln)
                    at += ln
                    valid[i >> 3] |= <uint8_t>(1 << (i & 7))
                else:
                    nulls += 1
            else:
                nulls += 1
            off[i + 1] = <int32_t>at
    values = pa.Array.from_buffers(pa.binary(), nn, [pa.py_buffer(valid_np), pa.py_buffer(off_np),
                                                     pa.py_buffer(data_np[:total])],
                                   null_count=nulls)
    return rows_np, values


cdef _block_refs(blocks, uint64_t base, vector[c.StoredBlockRef]* refs):
    """``refs`` filled from block-table rows (numpy, ``format.BLOCK_DTYPE``) whose offsets
    count from the file start, ``base`` the file offset of the bytes they will be read from. A
    row's ``codec`` goes through unchecked: the native decoder reports an unknown one as a bad
    block."""
    cdef size_t nb = len(blocks), i
    cdef const uint64_t[::1] off = np.ascontiguousarray(blocks["offset"], np.uint64)
    cdef const uint64_t[::1] sl = np.ascontiguousarray(blocks["stored_length"], np.uint64)
    cdef const uint64_t[::1] rl = np.ascontiguousarray(blocks["raw_length"], np.uint64)
    cdef const uint64_t[::1] en = np.ascontiguousarray(blocks["entries"], np.uint64)
    cdef const uint64_t[::1] xx = np.ascontiguousarray(blocks["xxh64"], np.uint64)
    cdef const uint32_t[::1] co = np.ascontiguousarray(blocks["codec"], np.uint32)
    refs.resize(nb)
    for i in range(nb):
        # An offset before the group's bytes wraps to a huge one, which the bounds check rejects.
        refs[0][i].offset = off[i] - base
        refs[0][i].stored_length = sl[i]
        refs[0][i].raw_length = rl[i]
        refs[0][i].entries = en[i]
        refs[0][i].xxh64 = xx[i]
        refs[0][i].codec = co[i]


def verify_blocks(data, blocks, uint64_t base):
    """Check (bounds, XXH64 of the stored bytes) and LZ4-decompress consecutive stored blocks of
    a checkpoint data file into one reused scratch buffer, parsing and keeping nothing, with the
    GIL released: what :func:`decode_blocks` does before it parses a payload (the same checks
    and words), i.e. the floor under decoding them. ``data``, ``blocks``, ``base``: as
    :func:`decode_blocks`. Returns ``(raw_bytes, None, None)`` (the decompressed bytes, int) or
    ``(None, i, reason)`` for the first bad block ``blocks[i]``."""
    cdef const uint8_t[::1] d = memoryview(data).cast("B")
    cdef size_t size = d.shape[0]
    cdef vector[c.StoredBlockRef] refs
    _block_refs(blocks, base, &refs)
    cdef const uint8_t* p = &d[0] if size else NULL
    cdef c.VerifyResult r
    with nogil:
        r = c.verify_blocks(p, size, refs.data(), refs.size())
    if r.failed_block >= 0:
        return None, r.failed_block, r.error.decode("utf-8", "replace")
    return r.raw_bytes, None, None


def load_blocks(NativeStateTable table, data, blocks, key_groups, uint64_t base,
                bint has_validity, int prefix_width, int64_t key_width=-1,
                int64_t value_width=-1, bint into_empty=False, bint open_ahead=False,
                int threads=1, uint64_t min_slice_bytes=0):
    """Restore consecutive stored blocks of one run's state straight into ``table``: each block
    checked (bounds, XXH64), decompressed and its payload checked as :func:`decode_blocks` does,
    its entries checked and inserted from the decompressed bytes in C++ with the GIL released,
    no Arrow arrays in between (native bulk_load.h ``load_blocks``). ``data``, ``blocks``,
    ``base``, ``has_validity``: as :func:`decode_blocks` (the blocks sorted by key group);
    ``key_groups``: the key group of each block (int32, from the file's key-group index);
    ``prefix_width``: 1 or 2 key-group prefix bytes; ``key_width`` / ``value_width``: the bytes
    every key / non-tombstone value must have (-1: any); ``into_empty``: the oldest run of these
    key groups, loaded into maps that are empty (its keys inserted without a look for an equal
    one); ``open_ahead``: blocks verified and decompressed on a native worker thread a few
    blocks ahead of the inserts (less wall time, the same CPU time on two cores). Returns
    ``(entries, None, None, None)`` or ``(None, i, reason, corrupt)`` for the first bad block
    ``blocks[i]``: ``corrupt`` when its stored bytes are damaged (or its keys
    not strictly ascending), else an entry breaks the state's rules; the blocks before it stay
    loaded (load into a table to discard on error). InvalidInputError for ``key_groups`` not
    one per block or a prefix width other than 1 or 2; StateError when another thread's call
    holds the table.

    ``threads`` > 1: the blocks are cut between key groups into up to that many slices of about
    equal stored bytes, at least ``min_slice_bytes`` (bytes) each, loaded at once on threads of
    their own (native bulk_load.h ``load_blocks_parallel``: they write disjoint key groups'
    maps). Then on a bad block the other slices, key groups after it included, may be loaded
    too; the bad block reported is the first in ``blocks`` order among the failed slices."""
    cdef const uint8_t[::1] d = memoryview(data).cast("B")
    cdef size_t size = d.shape[0]
    cdef size_t nb = len(blocks)
    cdef vector[c.StoredBlockRef] refs
    _block_refs(blocks, base, &refs)
    kg_np = np.ascontiguousarray(key_groups, np.int32)
    if kg_np.ndim != 1 or <size_t>kg_np.shape[0] != nb:
        raise InvalidInputError(f"{nb} blocks but {kg_np.size} key groups")
    cdef const int32_t[::1] kgs = kg_np
    cdef const int32_t* kp = &kgs[0] if nb else NULL
    cdef c.BlockLoadSpec spec
    spec.prefix_bytes = prefix_width
    spec.key_width = key_width
    spec.value_width = value_width
    spec.has_validity = has_validity
    spec.into_empty = into_empty
    spec.open_ahead = open_ahead
    cdef const uint8_t* p = &d[0] if size else NULL
    cdef c.BlockLoadResult r
    table._claim()
    try:
        with nogil:
            if threads > 1:
                r = c.load_blocks_parallel(table.table[0], p, size, refs.data(), kp, nb, spec,
                                           threads, min_slice_bytes)
            else:
                r = c.load_blocks(table.table[0], p, size, refs.data(), kp, nb, spec)
    finally:
        table._release()
    if r.failed_block >= 0:
        return None, r.failed_block, r.error.decode("utf-8", "replace"), r.corrupt
    return r.entries, None, None, None


cdef class PagePrefault:
    """A worker thread faulting in about ``nbytes`` of the page pool's memory ahead of a bulk
    load (native detail/page_pool.h ``PagePrefault``): the chunks a restore's maps will take are
    mapped and populated there, so the loading thread writes mapped memory instead of faulting
    in, and having the kernel zero, every page of the new state itself; a chunk the loading
    thread maps itself while the helper runs counts against ``nbytes``. Nothing when the pool
    is off or keeps no spares. :meth:`close` (or leaving the ``with`` block) stops the helper
    and waits for it; chunks it faulted in stay with the pool as spares (up to its limit).
    ``chunks``: chunks handed to the pool so far."""
    cdef c.PagePrefault* p

    def __cinit__(self, size_t nbytes):
        self.p = new c.PagePrefault(nbytes)

    @property
    def chunks(self):
        return self.p.chunks() if self.p != NULL else 0

    def close(self):
        cdef c.PagePrefault* p = self.p
        self.p = NULL
        if p != NULL:
            with nogil:
                del p

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __dealloc__(self):
        if self.p != NULL:
            with nogil:
                del self.p


def decode_blocks(data, blocks, uint64_t base, bint has_validity):
    """The entries of consecutive stored blocks of one (state, key group) of a checkpoint data
    file (docs/formats.md "Data file"), checked, decompressed and parsed with the GIL released:
    the native form of ``DataFileReader.entries``' loop over ``format.decode_block``, with the
    same checks. ``data``: the group's stored bytes (any buffer); ``blocks``: its rows of the block
    table (numpy, ``format.BLOCK_DTYPE``) whose ``offset`` counts from the file start, ``base``
    the file offset of ``data[0]``; ``has_validity``: incremental file (NULL value =
    tombstone). Returns ``(keys, values, None, None)`` -- ``pa.binary()`` arrays over buffers
    of :mod:`statecore.buffer_pool`, reused once the arrays are gone -- or
    ``(None, None, i, reason)`` for the first bad block ``blocks[i]``."""
    cdef const uint8_t[::1] d = memoryview(data).cast("B")
    cdef size_t size = d.shape[0]
    cdef size_t nb = len(blocks), i
    cdef vector[c.StoredBlockRef] refs
    _block_refs(blocks, base, &refs)
    cdef uint64_t n = 0, raw = 0
    for i in range(nb):
        n += refs[i].entries
        raw += refs[i].raw_length
    if n > 2**31 - 2:
        return None, None, 0, f"{n} entries in one read (a key group or a range of them) exceed an Arrow binary array"
    # Reused memory: statecore.buffer_pool says why.
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

    @property
    def lookup(self):
        """One ``(last_key, bloom)`` per block, in the order of :attr:`blocks`: the block's
        last encoded key (bytes) and, for the last block of its (state, key group), the group's
        Bloom filter (bytes; None for other blocks) -- the format-6 footer's block keys and
        filters (docs/formats.md "Filters and block keys")."""
        out = []
        for b in self.chunk.blocks:
            key = PyBytes_FromStringAndSize(<const char*>b.last_key.data(), b.last_key.size())
            filt = (PyBytes_FromStringAndSize(<const char*>b.filter.data(), b.filter.size())
                    if b.last_of_group else None)
            out.append((key, filt))
        return out

    def __len__(self):
        return self.chunk.bytes.size()

    def __getbuffer__(self, Py_buffer* buf, int flags):
        _export_bytes(buf, flags, self, &self.chunk.bytes, self.shape, self.strides, "chunk")

    def __releasebuffer__(self, Py_buffer* buf):
        pass


cdef class SerializedBlock:
    """One uncompressed block payload of a checkpoint data file (docs/formats.md "Data file"),
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
    cdef const uint8_t[::1] validv
    if values.null_count:
        validity = values.is_valid().to_numpy(zero_copy_only=False).astype(np.uint8)
        validv = validity
        out.valid.resize(n)
        memcpy(out.valid.data(), &validv[0], n)


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
    bound: that many payloads; a side that waits sleeps until the other drained or filled it
    to half, snapshot_writer.h). ``release_as_written``: release each key group's map snapshot
    as soon as it is encoded (the table snapshots become unusable for readers). ``nice``: added to
    the producer thread's nice value (Linux; 0 = unchanged). ``bloom_bits_per_key``: the size
    of each (state, key group)'s Bloom filter (1 to 64, format.DEFAULT_BLOOM_BITS_PER_KEY).
    ``codec``: how :meth:`next_chunk` stores the blocks (``format.CODECS``: 0 LZ4 block, 1
    uncompressed).

    The table snapshots must stay unreleased by others while the serializer runs (the Python
    wrapper keeps references to them). Raises InvalidInputError for bad arguments or a released
    table snapshot.
    """
    cdef c.SnapshotSerializer* ser
    cdef object keep

    def __cinit__(self, sources, int32_t kg_start, int32_t kg_end, int prefix_bytes,
                  size_t block_target_bytes, bint incremental, size_t queue_blocks=4,
                  bint release_as_written=False, int nice=0, uint32_t bloom_bits_per_key=10,
                  uint32_t codec=0):
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
            o.bloom_bits_per_key = bloom_bits_per_key
            o.codec = codec
            self.ser = c.new_serializer(srcs, o)
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
        with nogil:
            r = c.serializer_next(self.ser, &b.payload)
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
        with nogil:
            r = c.serializer_next_chunk(self.ser, &ch.chunk, target_bytes)
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


def open_blocks(data, blocks, uint64_t base, bint has_validity, last_keys):
    """Open consecutive stored blocks of a checkpoint data file for point lookups
    (payload_lookup.h): each checked as :func:`decode_blocks` checks it (bounds, XXH64, LZ4,
    payload structure) and its last key against ``last_keys[i]`` (bytes: the footer's block
    key), decompressed into a numpy uint8 array of its own, with the GIL released. ``data``,
    ``blocks``, ``base``, ``has_validity``: as :func:`decode_blocks`. Returns ``(payloads, None,
    None)`` -- one array per block, searched by :func:`lookup_in_payloads` -- or ``(None, i,
    reason)`` for the first bad block ``blocks[i]``."""
    cdef const uint8_t[::1] d = memoryview(data).cast("B")
    cdef size_t size = d.shape[0]
    cdef size_t nb = len(blocks), i
    cdef vector[c.StoredBlockRef] refs
    _block_refs(blocks, base, &refs)
    if len(last_keys) != nb:
        raise InvalidInputError(f"{nb} blocks but {len(last_keys)} last keys")
    cdef vector[const uint8_t*] lk
    cdef vector[size_t] lks
    cdef vector[uint8_t*] outs
    cdef uint8_t[::1] o
    cdef bytes key
    payloads = []
    for i in range(nb):
        key = last_keys[i]
        lk.push_back(<const uint8_t*>PyBytes_AS_STRING(key))
        lks.push_back(PyBytes_GET_SIZE(key))
        # At least one byte (LZ4 gets no null destination); the payload a view of it, which
        # keeps it alive while the native call writes into it.
        buf = np.empty(max(refs[i].raw_length, 1), np.uint8)
        payloads.append(buf[:refs[i].raw_length])
        o = buf
        outs.push_back(&o[0])
    cdef const uint8_t* p = &d[0] if size else NULL
    cdef string why
    cdef int64_t bad
    with nogil:
        bad = c.open_blocks_into(p, size, refs.data(), nb, has_validity, lk.data(), lks.data(),
                                 outs.data(), &why)
    if bad >= 0:
        return None, bad, why.decode("utf-8", "replace")
    return payloads, None, None


def lookup_in_payloads(payloads, bint has_validity, which, needles):
    """Point lookups in block payloads :func:`open_blocks` returned (of one file:
    ``has_validity`` as it was opened with): ``which`` (int64, one per needle) the payload to
    search each needle of the ``pa.binary()`` array ``needles`` in. Returns ``(rows, values)``
    as :func:`lookup_in_blocks`: the needle's row or -1, and a ``pa.binary()`` array of the
    values, NULL where not found or a tombstone. A byte-wise binary search per needle in place
    and one gather, with the GIL released."""
    cdef int64_t nn = len(needles), nb = len(payloads), i, b, r, total = 0
    which_np = np.ascontiguousarray(which, np.int64)
    if len(which_np) != nn:
        raise InvalidInputError(f"{nn} needles but {len(which_np)} payload numbers")
    if nn and (which_np.min() < 0 or which_np.max() >= nb):
        raise InvalidInputError("a payload number is outside the payloads")
    if needles.null_count:
        raise InvalidInputError("needles must not contain nulls")
    cdef vector[c.PayloadView] views
    cdef const uint8_t[::1] pv
    for payload in payloads:
        pv = payload
        if pv.shape[0] < 4:
            raise InvalidInputError("a block payload is shorter than its entry count")
        views.push_back(c.PayloadView.of(&pv[0], pv.shape[0], has_validity))
    nb_ = needles.buffers()
    cdef const int32_t* qoff = <const int32_t*>_addr(nb_[1], 4 * needles.offset)
    cdef const uint8_t* qdat = _addr(nb_[2], 0)
    cdef uint8_t empty = 0
    if qdat == NULL:
        qdat = &empty
    rows_np = np.full(nn, -1, np.int64)
    cdef int64_t[::1] rows = rows_np
    cdef const int64_t[::1] wh = which_np
    with nogil:
        for i in range(nn):
            b = wh[i]
            r = views[b].find(qdat + qoff[i], qoff[i + 1] - qoff[i])
            rows[i] = r
            if r >= 0 and views[b].has_value(r):
                total += views[b].value_offset(r + 1) - views[b].value_offset(r)
    if total > 2**31 - 1:
        raise InvalidInputError(f"{total} bytes of values exceed an Arrow binary array")
    off_np = np.zeros(nn + 1, np.int32)
    data_np = np.empty(max(total, 1), np.uint8)
    valid_np = np.zeros((nn + 7) // 8, np.uint8)
    cdef int32_t[::1] off = off_np
    cdef uint8_t[::1] data = data_np
    cdef uint8_t[::1] valid = valid_np
    cdef int64_t nulls = 0, ln, at = 0
    cdef uint32_t a
    with nogil:
        for i in range(nn):
            r = rows[i]
            b = wh[i]
            if r >= 0 and views[b].has_value(r):
                a = views[b].value_offset(r)
                ln = views[b].value_offset(r + 1) - a
                if ln:
                    memcpy(&data[0] + at, views[b].value_data + a, ln)
                at += ln
                valid[i >> 3] |= <uint8_t>(1 << (i & 7))
            else:
                nulls += 1
            off[i + 1] = <int32_t>at
    values = pa.Array.from_buffers(pa.binary(), nn, [pa.py_buffer(valid_np), pa.py_buffer(off_np),
                                                     pa.py_buffer(data_np[:total])],
                                   null_count=nulls)
    return rows_np, values


cdef class RunRouter:
    """The candidate blocks, in one run (data file) of a checkpoint version, of a batch's
    encoded keys (run_route.h ``route_to_blocks``): per key the Bloom filter of its (state, key
    group) in the run, then the first block of that key group whose footer last key is >= the
    key (docs/formats.md "Filters and block keys"), for every key of the batch in one call with
    the GIL released.

    ``kg_start``, ``kg_end``: the inclusive key groups it routes keys of. ``key_groups``,
    ``first_blocks``, ``block_counts`` (int arrays, one per (state, key group) the run holds):
    the file's key-group index rows of one state. ``key_offsets`` (int64), ``key_data``
    (bytes-like): the footer's block keys (``DataFileReader.lookup_tables``), block ``b``'s last
    key ``key_data[key_offsets[b]:key_offsets[b + 1]]``. A key group's filter is probed once
    given by :meth:`set_filter`; until then its keys all pass to the block search.
    InvalidInputError when the arrays differ in length, a key group lies outside
    ``[kg_start, kg_end]`` or its blocks outside the footer's, or the offsets decrease."""
    cdef vector[c.RouteGroup] groups
    cdef int64_t kg_base
    cdef object koff_np
    cdef object kdata_view
    cdef list keep
    cdef const int64_t* koff
    cdef const uint8_t* kdata
    cdef uint8_t empty

    def __cinit__(self, int64_t kg_start, int64_t kg_end, key_groups, first_blocks,
                  block_counts, key_offsets, key_data):
        kgs = np.ascontiguousarray(key_groups, np.int64)
        firsts = np.ascontiguousarray(first_blocks, np.int64)
        counts = np.ascontiguousarray(block_counts, np.int64)
        if not (len(kgs) == len(firsts) == len(counts)):
            raise InvalidInputError(
                f"{len(kgs)} key groups, {len(firsts)} first blocks, {len(counts)} block counts")
        koff = np.ascontiguousarray(key_offsets, np.int64)
        cdef const uint8_t[::1] kd = memoryview(key_data).cast("B")
        nblocks = len(koff) - 1
        if len(kgs) and (kgs.min() < kg_start or kgs.max() > kg_end):
            raise InvalidInputError(
                f"a key group lies outside the key groups [{kg_start}, {kg_end}]")
        if len(kgs) and (firsts.min() < 0 or counts.min() < 0
                         or (firsts + counts).max() > nblocks):
            raise InvalidInputError(
                f"a key group's blocks lie outside the footer's {max(nblocks, 0)} block keys")
        if len(koff) and (koff[0] < 0 or koff[-1] > kd.shape[0]
                          or bool(np.any(np.diff(koff) < 0))):
            raise InvalidInputError("block key offsets do not fit the key data")
        self.kg_base = kg_start
        self.groups.resize(max(kg_end - kg_start + 1, 0))
        cdef int64_t i, g
        for i in range(len(kgs)):
            g = kgs[i] - kg_start
            self.groups[g].first_block = firsts[i]
            self.groups[g].block_count = counts[i]
        self.koff_np = koff
        self.kdata_view = kd
        self.keep = []
        self.empty = 0
        cdef const int64_t[::1] ko = koff
        self.koff = &ko[0] if len(koff) else NULL
        self.kdata = &kd[0] if kd.shape[0] else &self.empty

    def set_filter(self, int64_t key_group, filt, uint32_t hashes):
        """Probe ``filt`` (bytes-like, the Bloom filter of ``key_group`` in the run, checked
        against its XXH64 by the caller; kept referenced) with ``hashes`` probes for the keys
        of ``key_group`` from now on. InvalidInputError for a key group the router does not
        hold or an empty filter."""
        cdef int64_t g = key_group - self.kg_base
        if g < 0 or g >= <int64_t>self.groups.size() or self.groups[g].block_count < 0:
            raise InvalidInputError(f"the run holds no key group {key_group}")
        cdef const uint8_t[::1] f = memoryview(filt).cast("B")
        if f.shape[0] == 0:
            raise InvalidInputError("a Bloom filter of 0 bytes")
        self.keep.append(f)
        self.groups[g].filter = &f[0]
        self.groups[g].filter_bytes = f.shape[0]
        self.groups[g].hashes = hashes

    def route(self, keys, rows, key_groups, hashes):
        """``(blocks, filter_negatives, range_negatives)``: for each key ``keys[rows[i]]``
        (``keys`` a ``pa.binary()`` array without nulls, ``rows`` int64), of key group
        ``key_groups[rows[i]]`` (int64, one per key of ``keys``) and XXH64 ``hashes[rows[i]]``
        (uint64, one per key), ``blocks[i]`` (numpy int64) the file block number of its
        candidate block, or -1 when the run cannot hold it (a key group the run lacks, a filter
        negative, a key after the key group's last block key); and how many keys the filters
        and the block keys sent past the run. InvalidInputError for nulls, arrays of other
        lengths or rows outside the keys."""
        cdef int64_t nq = len(keys)
        if keys.null_count:
            raise InvalidInputError("keys must not contain nulls")
        kg_np = np.ascontiguousarray(key_groups, np.int64)
        h_np = np.ascontiguousarray(hashes, np.uint64)
        rw_np = np.ascontiguousarray(rows, np.int64)
        if len(kg_np) != nq or len(h_np) != nq:
            raise InvalidInputError(
                f"{nq} keys but {len(kg_np)} key groups and {len(h_np)} hashes")
        cdef int64_t n = len(rw_np)
        if n and (rw_np.min() < 0 or rw_np.max() >= nq):
            raise InvalidInputError("a row number is outside the keys")
        out_np = np.empty(n, np.int64)
        if n == 0:
            return out_np, 0, 0
        bufs = keys.buffers()
        cdef c.RouteKeys k
        k.offsets = <const int32_t*>_addr(bufs[1], 4 * keys.offset)
        k.data = _addr(bufs[2], 0)
        if k.data == NULL:
            k.data = &self.empty
        cdef const int64_t[::1] kgv = kg_np
        cdef const uint64_t[::1] hv = h_np
        cdef const int64_t[::1] rv = rw_np
        cdef int64_t[::1] ov = out_np
        k.key_groups = &kgv[0]
        k.hashes = &hv[0]
        cdef c.RouteCounts counts
        counts.filter_negatives = 0
        counts.range_negatives = 0
        with nogil:
            c.route_to_blocks(self.groups.data(), self.groups.size(), self.kg_base, self.koff,
                              self.kdata, k, &rv[0], n, &ov[0], &counts)
        return out_np, counts.filter_negatives, counts.range_negatives

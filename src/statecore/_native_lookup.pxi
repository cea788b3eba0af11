# Run lookups of the tiered mode (statecore.checkpoint.lookup) with their per-block work native:
# the decoded-block cache (block_cache.h), one file's block table (RunBlocks), the steps of a
# batch (run_lookup.h LookupStep) and one key's lookup in one run.


#: :meth:`RunBlocks.lookup_one` outcomes.
ONE_VALUE = 0        # found: the value
ONE_TOMBSTONE = 1    # found a tombstone: absent, older runs shadowed
ONE_FILTERED = 2     # the run's Bloom filter ruled the key out
ONE_PAST = 3         # after the last key of the key group's last block
ONE_NOT_HELD = 4     # the run holds no entry of the key group
ONE_NOT_FOUND = 5    # the filter passed the key, its block does not hold it
ONE_MISSING = 6      # its block is not in the cache: the block number


cdef class OpenedPayload:
    """One checked, decompressed block payload (docs/formats.md "Block payload") held by a
    :class:`NativeBlockCache`, exposed through the read-only buffer protocol (zero copy:
    ``np.frombuffer(p, np.uint8)``); the bytes stay valid while this object lives, evicted or
    not."""
    cdef shared_ptr[const c.OpenedBlock] block
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]

    def __len__(self):
        return deref(self.block).size

    def __getbuffer__(self, Py_buffer* buf, int flags):
        if flags & PyBUF_WRITABLE:
            raise BufferError("a cached block payload is read-only")
        self.shape[0] = deref(self.block).size
        self.strides[0] = 1
        buf.buf = <void*>deref(self.block).bytes()
        buf.obj = self
        buf.len = self.shape[0]
        buf.readonly = 1
        buf.itemsize = 1
        buf.format = "B"
        buf.ndim = 1
        buf.shape = self.shape
        buf.strides = self.strides
        buf.suboffsets = NULL
        buf.internal = NULL

    def __releasebuffer__(self, Py_buffer* buf):
        pass


cdef object _payload_array(shared_ptr[const c.OpenedBlock] block):
    """A numpy uint8 view of ``block`` that keeps it alive."""
    cdef OpenedPayload p = OpenedPayload.__new__(OpenedPayload)
    p.block = block
    return np.frombuffer(p, np.uint8)


cdef class NativeBlockCache:
    """Decoded blocks of format-6 data files for the run lookups (block_cache.h): opened block
    payloads keyed by (file id, block number), least recently used first out, holding at most
    ``budget`` payload bytes (each block counted by its raw_length); a block larger than the
    budget is never kept. Thread-safe (the fetch threads insert into it with the GIL released).
    ``hits`` / ``misses`` count lookups of a block; ``used`` is the bytes held now.
    InvalidInputError for a budget that is not an int >= 0."""
    cdef c.BlockCache* cache

    def __cinit__(self, budget):
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise InvalidInputError(f"cache budget must be an int >= 0 bytes, got {budget!r}")
        self.cache = new c.BlockCache(<uint64_t>budget)

    def __dealloc__(self):
        del self.cache

    @property
    def budget(self):
        return self.cache.budget()

    @property
    def hits(self):
        return self.cache.stats().hits

    @property
    def misses(self):
        return self.cache.stats().misses

    @property
    def rejected(self):
        """Blocks offered to a full cache and refused by its admission test (block_cache.h:
        asked for no more often than the block they would have replaced)."""
        return self.cache.stats().rejected

    @property
    def used(self):
        return self.cache.stats().used_bytes

    def __len__(self):
        return self.cache.stats().blocks

    def get(self, int64_t file_id, int64_t block):
        """The payload (numpy uint8, read-only) of block ``block`` of file ``file_id``, now the
        most recently used, or None; counted as a hit or a miss."""
        cdef shared_ptr[const c.OpenedBlock] got = self.cache.get(file_id, block)
        if not got:
            return None
        return _payload_array(got)

    def set_budget(self, uint64_t budget):
        """A new budget (bytes), the least recently used blocks evicted down to it."""
        self.cache.set_budget(budget)

    def clear(self):
        """Drop every block (payloads handed out stay valid)."""
        self.cache.clear()

    def retain_files(self, file_ids):
        """Drop the blocks of every file whose id is not in ``file_ids`` (an iterable of ints;
        payloads handed out stay valid); counters and admission counts are kept."""
        ids = np.ascontiguousarray(np.fromiter(file_ids, np.int64))
        cdef const int64_t[::1] v = ids
        cdef size_t n = v.shape[0]
        cdef const int64_t* p = &v[0] if n else NULL
        with nogil:
            self.cache.retain_files(p, n)


cdef class RunBlocks:
    """One format-6 data file's blocks as the native run lookups see them: ``file_id`` (its id
    in a :class:`NativeBlockCache`), ``blocks`` (the whole block table, ``format.BLOCK_DTYPE``
    rows, offsets from the start of the file), ``key_offsets`` (int64) and ``key_data``
    (bytes-like): the footer's last key of every block (``DataFileReader.lookup_tables``);
    ``has_validity``: an incremental run's payloads (tombstones). InvalidInputError when the
    block keys do not pair with the blocks."""
    cdef c.RunBlockTable table
    cdef vector[c.StoredBlockRef] refs
    cdef object koff_np
    cdef object kdata_view
    cdef uint8_t empty

    def __cinit__(self, int64_t file_id, blocks, key_offsets, key_data, bint has_validity):
        koff = np.ascontiguousarray(key_offsets, np.int64)
        cdef const uint8_t[::1] kd = memoryview(key_data).cast("B")
        if len(koff) != len(blocks) + 1:
            raise InvalidInputError(f"{len(blocks)} blocks but {len(koff)} block key offsets")
        if koff[0] < 0 or koff[-1] > kd.shape[0] or bool(np.any(np.diff(koff) < 0)):
            raise InvalidInputError("block key offsets do not fit the key data")
        _block_refs(blocks, 0, &self.refs)
        self.koff_np = koff
        self.kdata_view = kd
        self.empty = 0
        cdef const int64_t[::1] ko = koff
        self.table.file_id = file_id
        self.table.has_validity = has_validity
        self.table.blocks = self.refs.data()
        self.table.block_count = self.refs.size()
        self.table.key_offsets = &ko[0]
        self.table.key_data = &kd[0] if kd.shape[0] else &self.empty

    @property
    def file_id(self):
        return self.table.file_id

    def block_span(self, int64_t first, int64_t last):
        """``(offset, length)``: the file bytes from block ``first`` through block ``last``."""
        self._check(first)
        self._check(last)
        cdef uint64_t lo = self.refs[first].offset
        return lo, self.refs[last].offset + self.refs[last].stored_length - lo

    cdef int _check(self, int64_t b) except -1:
        if b < 0 or <size_t>b >= self.refs.size():
            raise InvalidInputError(f"block {b} is outside the file's {self.refs.size()} blocks")
        return 0

    def open_into(self, NativeBlockCache cache, data, uint64_t base, blocks):
        """Open the blocks ``blocks`` (int64 block numbers, ascending) from ``data`` (the
        file's bytes from offset ``base``), each checked (bounds, XXH64, LZ4, payload, last key
        against the footer's) with the GIL released and offered to ``cache``. Returns
        ``(payloads, None, None)`` (numpy uint8 arrays) or ``(None, i, reason)`` for the first
        bad block ``blocks[i]``, which is not cached."""
        bs = np.ascontiguousarray(blocks, np.int64)
        cdef const int64_t[::1] bv = bs
        cdef size_t n = len(bs), i
        for i in range(n):
            self._check(bv[i])
        cdef const uint8_t[::1] d = memoryview(data).cast("B")
        cdef size_t size = d.shape[0]
        cdef const uint8_t* p = &d[0] if size else &self.empty
        cdef vector[shared_ptr[const c.OpenedBlock]] out
        out.resize(n)
        cdef string why
        cdef int64_t bad = -1
        with nogil:
            for i in range(n):
                out[i] = c.open_table_block(self.table, bv[i], p, size, base, &why)
                if not out[i]:
                    bad = i
                    break
                cache.cache.put(self.table.file_id, bv[i], out[i])
        if bad >= 0:
            return None, bad, why.decode("utf-8", "replace")
        return [_payload_array(out[i]) for i in range(n)], None, None

    cdef tuple _search_one(self, const c.OpenedBlock* blk, const uint8_t* q, size_t ql):
        cdef c.PayloadView v = c.PayloadView.of(blk.bytes(), blk.size, self.table.has_validity)
        cdef int64_t r = v.find(q, ql)
        if r < 0:
            return ONE_NOT_FOUND, None
        if not v.has_value(r):
            return ONE_TOMBSTONE, None
        cdef uint32_t a = v.value_offset(r)
        return ONE_VALUE, PyBytes_FromStringAndSize(<const char*>v.value_data + a,
                                                    v.value_offset(r + 1) - a)

    def lookup_one(self, RunRouter router, NativeBlockCache cache, bytes key, int64_t kg):
        """One encoded key ``key`` (of key group ``kg``) in this run: routed by ``router``
        (this file's :class:`RunRouter`: filter, block keys), its block taken from ``cache``
        and searched in place. ``(outcome, value)``: ``(ONE_VALUE, bytes)``, ``(ONE_MISSING,
        block number)`` when the block is not cached (:meth:`open_search_one` next), else
        ``(ONE_TOMBSTONE | ONE_FILTERED | ONE_PAST | ONE_NOT_HELD | ONE_NOT_FOUND, None)``."""
        cdef const uint8_t* q = <const uint8_t*>PyBytes_AS_STRING(key)
        cdef size_t ql = PyBytes_GET_SIZE(key)
        return self._lookup_hashed(router, cache, q, ql, c.xxh64(q, ql, 0), kg)

    cdef tuple _lookup_hashed(self, RunRouter router, NativeBlockCache cache,
                              const uint8_t* q, size_t ql, uint64_t h, int64_t kg):
        """:meth:`lookup_one` of the key ``q[0:ql]`` whose XXH64 (seed 0) is ``h``."""
        cdef int32_t offs[2]
        offs[0] = 0
        offs[1] = <int32_t>ql
        cdef c.RouteKeys rk
        rk.offsets = offs
        rk.data = q
        rk.key_groups = &kg
        rk.hashes = &h
        cdef int64_t row = 0, b = -1
        cdef c.RouteCounts counts
        counts.filter_negatives = 0
        counts.range_negatives = 0
        c.route_to_blocks(router.groups.data(), router.groups.size(), router.kg_base,
                          router.koff, router.kdata, rk, &row, 1, &b, &counts)
        if b < 0:
            if counts.filter_negatives:
                return ONE_FILTERED, None
            return (ONE_PAST, None) if counts.range_negatives else (ONE_NOT_HELD, None)
        self._check(b)
        cdef shared_ptr[const c.OpenedBlock] got = cache.cache.get(self.table.file_id, b)
        if not got:
            return ONE_MISSING, b
        return self._search_one(got.get(), q, ql)

    def open_search_one(self, NativeBlockCache cache, data, uint64_t base, int64_t block,
                        bytes key):
        """Open block ``block`` from ``data`` (the file's bytes from offset ``base``) as
        :meth:`open_into`, offer it to ``cache`` and search ``key`` in it: ``(outcome, value)``
        as :meth:`lookup_one` (never ``ONE_MISSING``), or ``(-1, reason)`` for a bad block (not
        cached)."""
        self._check(block)
        cdef const uint8_t[::1] d = memoryview(data).cast("B")
        cdef size_t size = d.shape[0]
        cdef string why
        cdef shared_ptr[const c.OpenedBlock] got = c.open_table_block(
            self.table, block, &d[0] if size else &self.empty, size, base, &why)
        if not got:
            return -1, why.decode("utf-8", "replace")
        cache.cache.put(self.table.file_id, block, got)
        return self._search_one(got.get(), <const uint8_t*>PyBytes_AS_STRING(key),
                                PyBytes_GET_SIZE(key))


cdef inline size_t _slot(size_t slot) except? 2:
    if slot > 1:
        raise InvalidInputError(f"a round slot is 0 or 1, got {slot}")
    return slot


def lookup_chain_one(list chain, NativeBlockCache cache, bytes key, int64_t kg,
                     Py_ssize_t start=0):
    """:meth:`RunBlocks.lookup_one` of the encoded key ``key`` (of key group ``kg``) in the runs
    of ``chain`` (``(RunBlocks, RunRouter)`` pairs, newest first) from index ``start`` on,
    hashing the key once, until one run decides: its outcome is ``ONE_VALUE``, ``ONE_TOMBSTONE``
    or ``ONE_MISSING`` (its block is not cached). Returns ``(index, outcome, value, filtered,
    past, false_positives)``: that run's index, outcome and value as ``lookup_one``'s (``len
    (chain)``, ``ONE_NOT_HELD``, None when no run decided), and how many runs on the way the
    Bloom filter ruled out, the key lay past, and the filter passed without the block holding
    the key. The per-record read of a tiered backend: one call for the whole chain instead of
    one per run. InvalidInputError for a negative ``start``."""
    if start < 0:
        raise InvalidInputError(f"start must be >= 0, got {start}")
    cdef const uint8_t* q = <const uint8_t*>PyBytes_AS_STRING(key)
    cdef size_t ql = PyBytes_GET_SIZE(key)
    cdef uint64_t h = c.xxh64(q, ql, 0)
    cdef Py_ssize_t i, n = len(chain)
    cdef int64_t filtered = 0, past = 0, false_positives = 0
    cdef RunBlocks blocks
    cdef RunRouter router
    cdef tuple got
    for i in range(start, n):
        blocks, router = chain[i]
        got = blocks._lookup_hashed(router, cache, q, ql, h, kg)
        outcome = got[0]
        if outcome == ONE_FILTERED:
            filtered += 1
        elif outcome == ONE_PAST:
            past += 1
        elif outcome == ONE_NOT_FOUND:
            false_positives += 1
        elif outcome != ONE_NOT_HELD:
            return i, outcome, got[1], filtered, past, false_positives
    return max(n, start), ONE_NOT_HELD, None, filtered, past, false_positives


cdef class NativeFetchPool:
    """``threads`` (int >= 1) native threads that read, open and search the blocks of lookup
    steps over local files (:meth:`LookupStep.run`; fetch_pool.h says why not Python
    threads). :meth:`close` (idempotent; also when collected) finishes the reads in flight and
    joins the threads. InvalidInputError for a bad ``threads``."""
    cdef c.FetchPool* pool

    def __cinit__(self, threads):
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise InvalidInputError(f"threads must be an int >= 1, got {threads!r}")
        self.pool = new c.FetchPool(<size_t>threads)

    @property
    def threads(self):
        """The number of threads (0 once closed)."""
        return 0 if self.pool == NULL else self.pool.threads()

    def close(self):
        cdef c.FetchPool* pool = self.pool
        self.pool = NULL
        if pool != NULL:
            with nogil:
                del pool

    def __dealloc__(self):
        if self.pool != NULL:
            with nogil:
                del self.pool


cdef class LookupStep:
    """One step of a batch of run lookups (run_lookup.h): the keys routed to candidate blocks
    (:meth:`add`, per file), answered either by :meth:`run` (local files: the whole step on
    native threads, then :meth:`results`) or in rounds of at most ``open_bytes`` decoded bytes
    (a larger block alone), the caller doing the reads: per round (:meth:`next_round`) the cached blocks pinned and the missing ones
    planned as reads (:meth:`ranges`: blocks of one file at most ``gap_bytes`` apart in one
    read of at most ``max_read_bytes``), each read's bytes opened into ``cache`` with the GIL
    released (:meth:`open_range`, from any thread), then every key of the round searched
    (:meth:`search`). A round lives in one of two slots (``slot``, 0 or 1, default 0), so that
    the next round's reads can run on other threads while this thread searches the current
    one; planning a slot (:meth:`next_round`) must wait for its reads. InvalidInputError for
    block numbers outside a file, key indices outside the keys searched, or a slot other than
    0 and 1."""
    cdef c.LookupStep* step
    cdef NativeBlockCache cache
    cdef list files
    cdef int64_t max_key
    cdef object keys  # set_keys's
    cdef bint rounds  # whether a round was planned, or run() called
    cdef bint ran  # whether run() succeeded
    cdef uint8_t empty

    def __cinit__(self, NativeBlockCache cache, uint64_t open_bytes, uint64_t gap_bytes,
                  uint64_t max_read_bytes):
        self.cache = cache
        self.step = new c.LookupStep(cache.cache, open_bytes, gap_bytes, max_read_bytes)
        self.files = []
        self.max_key = -1

    def __dealloc__(self):
        del self.step

    cdef int _key_arrays(self, keys, const int32_t** offsets, const uint8_t** data) except -1:
        """Point ``offsets`` and ``data`` at the offsets and bytes of ``keys``, a
        ``pa.binary()`` array without nulls that holds every key index :meth:`add` got;
        InvalidInputError otherwise."""
        if not isinstance(keys, pa.Array) or not pa.types.is_binary(keys.type):
            raise InvalidInputError("keys must be a pyarrow binary array")
        if keys.null_count:
            raise InvalidInputError("keys must not contain nulls")
        if self.max_key >= len(keys):
            raise InvalidInputError("a key index is outside the keys")
        bufs = keys.buffers()
        offsets[0] = <const int32_t*>_addr(bufs[1], 4 * keys.offset)
        data[0] = _addr(bufs[2], 0)
        if data[0] == NULL:
            data[0] = &self.empty
        return 0

    def add(self, RunBlocks blocks, keys, block_numbers):
        """Keys ``keys[i]`` (int64 indices into the keys :meth:`search` gets) routed to block
        ``block_numbers[i]`` of the file ``blocks``; each file once, before the first round."""
        k = np.ascontiguousarray(keys, np.int64)
        b = np.ascontiguousarray(block_numbers, np.int64)
        if len(k) != len(b):
            raise InvalidInputError(f"{len(k)} keys but {len(b)} block numbers")
        if not len(k):
            return
        if self.rounds or self.keys is not None:
            raise InvalidInputError("add comes before set_keys and the first round")
        if k.min() < 0:
            raise InvalidInputError("a key index is negative")
        if b.min() < 0 or b.max() >= blocks.table.block_count:
            raise InvalidInputError(
                f"a block number is outside the file's {blocks.table.block_count} blocks")
        self.max_key = max(self.max_key, int(k.max()))
        self.files.append(blocks)
        cdef const int64_t[::1] kv = k
        cdef const int64_t[::1] bv = b
        self.step.add(&blocks.table, &kv[0], &bv[0], len(k))

    def set_keys(self, keys):
        """The keys (indices into ``keys``, a ``pa.binary()`` array without nulls) that
        :meth:`run` searches, and that :meth:`open_range` searches each block it opens for
        right away, on the thread that opened it; :meth:`search` must then get the same
        ``keys``. After the last :meth:`add`, before the first round or :meth:`run`. InvalidInputError for nulls, a key index outside
        ``keys``, or a call after the first round."""
        if self.rounds:
            raise InvalidInputError("set_keys comes before the first round")
        cdef const int32_t* qoff = NULL
        cdef const uint8_t* qdat = NULL
        self._key_arrays(keys, &qoff, &qdat)
        self.keys = keys  # its buffers must outlive the step's rounds
        self.step.set_keys(qoff, qdat)

    def next_round(self, size_t slot=0):
        """Plan the step's next round into ``slot`` (False when none is left), unpinning the
        round it held: its cached blocks pinned (each a cache hit or miss), its missing ones
        planned as :meth:`ranges`. No read of ``slot`` may be in flight."""
        self.rounds = True
        return self.step.next_round(_slot(slot))

    def round_bytes(self, size_t slot=0):
        """Decoded bytes of the round's blocks, cached ones included."""
        return self.step.round_bytes(_slot(slot))

    def round_searched_on_open(self, size_t slot=0):
        """How many of the round's blocks were searched for their keys where they were opened
        (:meth:`set_keys`); :meth:`search` searches the others."""
        return self.step.round_searched_on_open(_slot(slot))

    def ranges(self, size_t slot=0):
        """The round's reads: ``[(file, offset, length, first block, blocks)]`` -- ``file`` the
        index of its file in :meth:`add` order, ``offset`` and ``length`` the file bytes to
        read, ``first block`` its first block's number, ``blocks`` how many it opens."""
        cdef const vector[c.ReadRange]* rs = &self.step.ranges(_slot(slot))
        cdef const vector[pair[size_t, int64_t]]* ms = &self.step.missing(slot)
        return [(deref(rs)[r].file, deref(rs)[r].offset, deref(rs)[r].length,
                 deref(ms)[deref(rs)[r].first].second, deref(rs)[r].count)
                for r in range(rs.size())]

    def open_range(self, size_t r, data, size_t slot=0):
        """Open the blocks of read ``r`` of :meth:`ranges` from ``data`` (its bytes), with the
        GIL released: ``(None, None)``, or ``(block number, reason)`` of its first bad block
        (neither it nor the blocks after it cached)."""
        if r >= self.step.ranges(_slot(slot)).size():
            raise InvalidInputError(f"the round has no read {r}")
        cdef const uint8_t[::1] d = memoryview(data).cast("B")
        cdef size_t size = d.shape[0]
        cdef uint8_t empty = 0
        cdef const uint8_t* p = &d[0] if size else &empty
        cdef string why
        cdef int64_t bad
        with nogil:
            bad = self.step.open_range(r, p, size, &why, slot)
        if bad < 0:
            return None, None
        return (self.step.missing(slot)[self.step.ranges(slot)[r].first + bad].second,
                why.decode("utf-8", "replace"))

    def search(self, keys, size_t slot=0):
        """Search the round's keys (indices into ``keys``, a ``pa.binary()`` array without
        nulls) in their blocks, every read of the round opened: ``(key indices, rows,
        values)`` in the round's order -- ``rows`` (int64) the key's row in its block or -1,
        ``values`` a ``pa.binary()`` array, NULL where not found or a tombstone -- with the GIL
        released."""
        _slot(slot)
        if self.keys is not None and keys is not self.keys:
            raise InvalidInputError("search must get the keys set_keys got")
        cdef const int32_t* qoff = NULL
        cdef const uint8_t* qdat = NULL
        self._key_arrays(keys, &qoff, &qdat)
        cdef size_t n = self.step.round_key_count(slot), i
        idx_np = np.empty(n, np.int64)
        rows_np = np.empty(n, np.int64)
        cdef int64_t[::1] idx = idx_np
        cdef int64_t[::1] rows = rows_np
        for i in range(n):
            idx[i] = self.step.round_key(i, slot)
        cdef uint64_t total = 0
        if n:
            with nogil:
                total = self.step.search(qoff, qdat, &rows[0], slot)
        if total > 2**31 - 1:
            raise InvalidInputError(f"{total} bytes of values exceed an Arrow binary array")
        off_np = np.zeros(n + 1, np.int32)
        data_np = np.empty(max(total, 1), np.uint8)
        valid_np = np.zeros((n + 7) // 8, np.uint8)
        cdef int32_t[::1] off = off_np
        cdef uint8_t[::1] data = data_np
        cdef uint8_t[::1] valid = valid_np
        cdef int64_t nulls = 0
        if n:
            with nogil:
                nulls = self.step.gather(&off[0], &data[0], &valid[0] if n else NULL, slot)
        values = pa.Array.from_buffers(pa.binary(), n, [pa.py_buffer(valid_np),
                                                        pa.py_buffer(off_np),
                                                        pa.py_buffer(data_np[:total])],
                                       null_count=nulls)
        return idx_np, rows_np, values

    def run(self, NativeFetchPool pool, fds, size_t workers):
        """Local files: answer every key of the step in one call, with the GIL released
        (run_lookup.h LookupStep::run): its blocks in chunks of at most ``open_bytes / (workers
        + 1)`` decoded bytes, each read (pread from ``fds[file index]``, open OS file
        descriptors, one per file in :meth:`add` order), opened into the cache and searched
        by one of ``workers`` threads of ``pool`` or by this thread (``pool`` None: this thread
        alone); then :meth:`results`. After :meth:`set_keys`, instead of rounds, once.
        ``None``, or ``((file index, offset, length, first block), what, reason)`` of the read
        that failed -- ``what`` ``"read"`` (the read failed), ``"short"`` (the file ended
        inside it) or the number of its first bad block (not cached). InvalidInputError for a
        closed pool, too few descriptors, ``workers`` 0, no :meth:`set_keys`, or a step already
        run or in rounds."""
        if self.rounds:
            raise InvalidInputError("a step runs once, and not after rounds")
        if self.keys is None:
            raise InvalidInputError("run comes after set_keys")
        if pool is not None and pool.pool == NULL:
            raise InvalidInputError("the fetch pool is closed")
        if workers == 0:
            raise InvalidInputError("workers must be >= 1")
        cdef vector[int] fv = [int(f) for f in fds]
        if fv.size() < len(self.files):
            raise InvalidInputError(
                f"{fv.size()} file descriptors for {len(self.files)} files")
        cdef c.FetchPool* p = pool.pool if pool is not None else NULL
        cdef c.StepFailure failure
        cdef bint ok
        self.rounds = True
        with nogil:
            ok = self.step.run(p, fv.data(), fv.size(), workers, &failure)
        self.ran = ok
        if ok:
            return None
        text = failure.why.decode("utf-8", "replace")
        what = ("read" if failure.bad == -2 else "short" if failure.bad == -3  # kRead*
                else failure.bad)
        return (failure.file, failure.offset, failure.length, failure.first_block), what, text

    def counts(self):
        """What :meth:`run` read: ``{"blocks_read", "bytes_read" (the gaps a read coalesces
        included), "peak_open_bytes" (decoded bytes of blocks open at once)}``."""
        cdef const c.StepCounts* n = &self.step.counts()
        return {"blocks_read": n.blocks_read, "bytes_read": n.bytes_read,
                "peak_open_bytes": n.peak_open_bytes}

    def results(self):
        """After :meth:`run` succeeded: ``(key indices, rows, values)`` of every key of the
        step, in block order -- ``rows`` (int64) the key's row in its block or -1, ``values``
        a ``pa.binary()`` array, NULL where not found or a tombstone. InvalidInputError before
        a successful run, or for more than 2 GiB of values."""
        if not self.ran:
            raise InvalidInputError("results come after a successful run")
        cdef size_t n = self.step.key_count()
        cdef uint64_t total = self.step.value_bytes()
        if total > 2**31 - 1:
            raise InvalidInputError(f"{total} bytes of values exceed an Arrow binary array")
        idx_np = np.empty(n, np.int64)
        rows_np = np.empty(n, np.int64)
        off_np = np.zeros(n + 1, np.int32)
        data_np = np.empty(max(total, 1), np.uint8)
        valid_np = np.zeros(max((n + 7) // 8, 1), np.uint8)
        cdef int64_t[::1] idx = idx_np
        cdef int64_t[::1] rows = rows_np
        cdef int32_t[::1] off = off_np
        cdef uint8_t[::1] data = data_np
        cdef uint8_t[::1] valid = valid_np
        cdef int64_t nulls = 0
        if n:
            with nogil:
                nulls = self.step.gather_step(&idx[0], &rows[0], &off[0], &data[0], &valid[0])
        values = pa.Array.from_buffers(pa.binary(), n, [pa.py_buffer(valid_np),
                                                        pa.py_buffer(off_np),
                                                        pa.py_buffer(data_np[:total])],
                                       null_count=nulls)
        return idx_np, rows_np, values

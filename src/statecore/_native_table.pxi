# The state table: NativeStateTable (a copy-on-write StateMap per key group; per-record access,
# TTL cleanup and migration, bulk load, batch kernels) and NativeTableSnapshot.

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
        except InvalidInputError as e:
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
        with nogil:
            run = self.snap.map(kg).get().sorted_changes(base)
        return _run_to_arrow(run, kg)

    def release(self):
        if not self.released:
            self.released = True
            self.snap.release()


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
    # Map state (enable_map_index): the members of every map, and how entry keys split.
    cdef c.CollectionIndex* index
    cdef c.KeySchema ix_key
    cdef c.NamespaceType ix_ns
    cdef int32_t ix_mp
    # List state (enable_list_index): the elements of every list; entry keys' key-group prefix.
    cdef c.ListIndex* list_index
    cdef int lx_pw

    def __cinit__(self, int32_t kg_start, int32_t kg_end):
        self.table = new c.StateTable(kg_start, kg_end)
        self.kg_start = kg_start
        self.kg_end = kg_end
        self.index = NULL
        self.list_index = NULL

    def __dealloc__(self):
        del self.index
        del self.list_index
        del self.table

    cdef int _idle(self) except -1:
        if self.busy:
            raise StateError("this state's table is in use by a native call running in another "
                             "thread; a backend must be used by one thread at a time")
        return 0

    # Every call that runs without the GIL has the same shape:
    #
    #     self._claim()
    #     try:
    #         with nogil:
    #             c.some_kernel(self.table[0], ...)   # C++ errors: raise_native_error
    #     finally:
    #         self._release()
    #
    # _claim and _release are plain C calls under the GIL; the C++ -> Python error translation
    # happens in the declarations (_native_core.pxd), so no call site catches and re-raises.
    # (Cython has no closures for cdef code, and a ``with`` over an object goes through the
    # Python __enter__/__exit__ protocol on every call: the try/finally is the zero-cost form.)

    cdef int _claim(self) except -1:
        """Marks the table busy for a call about to release the GIL; StateError if a call
        of another thread holds it."""
        if self.busy:
            self._idle()
        self.busy = 1
        return 0

    cdef void _release(self) noexcept:
        """Clears the mark of :meth:`_claim` (in the call's ``finally``)."""
        self.busy = 0

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
    # The reference backend's stored forms (backends/python.py) converted here instead of
    # through serializers.py: an access of the per-record path then costs one call into this
    # class.

    def set_value_format(self, str kind, str value_type, bint ttl):
        """State kind (value, reducing, aggregating and map -- one user value per entry --
        share a layout; list), value type (a statecore.value_types name; ``pickle`` stores its
        bytes as they are) and whether values and list elements carry the 8-byte TTL timestamp
        suffix, for
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
        TTL; a map entry's user value likewise), for a list chunk the list of its elements (each
        ``(element, ts)`` with TTL). InvalidInputError for malformed bytes, with the reference
        backend's messages."""
        cdef c.ByteView out
        cdef c.StateMap* m = self._map(kg)
        if not m.get(<const uint8_t*>PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), &out):
            return None
        if self.vlayout == _LAYOUT_LIST:
            return _decode_list(out.data, out.size, self.vfmt, self.vttl)
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

    # ---- map state: one entry per user key (docs/formats.md "Map state")
    def enable_map_index(self, str key_type, str namespace_type, int32_t max_parallelism):
        """Keep the index of the user keys of every map (collection_index.h) for the map calls
        below, the map kernels and restores; entry keys split after ``prefix | ser(key) |
        ser(namespace)`` of ``key_type`` / ``namespace_type`` (encoded_prefix_size). Once."""
        if self.index != NULL:
            raise StateError("the map index is enabled already")
        self.ix_key = _key_schema(key_type)
        self.ix_ns = _namespace_type(namespace_type)
        self.ix_mp = max_parallelism
        self.index = new c.CollectionIndex(self.kg_start, self.kg_end)

    cdef int _need_index(self) except -1:
        if self.index == NULL:
            raise StateError("the map index is not enabled (enable_map_index)")
        self._idle()
        return 0

    def map_get(self, int32_t kg, bytes prefix not None, bytes ukb not None):
        """Stored form of user key ``ukb`` of the map ``prefix`` (as :meth:`get_stored`)."""
        return self.get_stored(kg, prefix + ukb)

    def map_put(self, int32_t kg, bytes prefix not None, bytes ukb not None, stored):
        """Write user key ``ukb`` of the map ``prefix`` (as :meth:`put_stored`) and list it: a
        new user key goes last, a present one keeps its place. With TTL a user key still
        listed whose entry is gone without the index being told (a cleanup step that failed
        part way) is a new entry, so it moves last."""
        self._need_index()
        cdef bytes key = prefix + ukb
        cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(prefix)
        cdef const uint8_t* u = <const uint8_t*>PyBytes_AS_STRING(ukb)
        cdef size_t ps = PyBytes_GET_SIZE(prefix), us = PyBytes_GET_SIZE(ukb)
        cdef c.ByteView out
        if self.vttl and self.index.contains(kg, p, ps, u, us) and not self._map(kg).get(
                <const uint8_t*>PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), &out):
            self.index.erase(kg, p, ps, u, us)
        self.put_stored(kg, key, stored)
        self.index.insert(kg, p, ps, u, us)

    def map_remove(self, int32_t kg, bytes prefix not None, bytes ukb not None):
        """Remove user key ``ukb`` of the map ``prefix`` (absent: no-op)."""
        self._need_index()
        self.remove_key(kg, prefix + ukb)
        self.index.erase(kg, <const uint8_t*>PyBytes_AS_STRING(prefix), PyBytes_GET_SIZE(prefix),
                         <const uint8_t*>PyBytes_AS_STRING(ukb), PyBytes_GET_SIZE(ukb))

    def map_items(self, int32_t kg, bytes prefix not None):
        """``[(user key bytes, stored form), ...]`` of the map ``prefix`` in its order; listed
        user keys whose entries are gone (see :meth:`map_put`) are unlisted on the way."""
        self._need_index()
        cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(prefix)
        cdef size_t ps = PyBytes_GET_SIZE(prefix)
        cdef vector[string] members = self.index.list_members(kg, p, ps)
        cdef c.StateMap* m = self._map(kg)
        cdef c.ByteView out
        cdef size_t i
        cdef bytes ukb, key
        out_list = []
        gone = []
        for i in range(members.size()):
            ukb = PyBytes_FromStringAndSize(members[i].data(), members[i].size())
            key = prefix + ukb
            if not m.get(<const uint8_t*>PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), &out):
                gone.append(ukb)
                continue
            out_list.append((ukb, _decode_value(out.data, out.size, self.vfmt, self.vttl)))
        for ukb in gone:
            self.index.erase(kg, p, ps, <const uint8_t*>PyBytes_AS_STRING(ukb),
                             PyBytes_GET_SIZE(ukb))
        return out_list

    def map_size(self, int32_t kg, bytes prefix not None):
        """Listed user keys of the map ``prefix`` (exact without TTL)."""
        self._need_index()
        return self.index.size(kg, <const uint8_t*>PyBytes_AS_STRING(prefix),
                               PyBytes_GET_SIZE(prefix))

    def map_clear(self, int32_t kg, bytes prefix not None):
        """Remove every entry of the map ``prefix``; O(its size)."""
        self._need_index()
        cdef vector[string] members = self.index.take(
            kg, <const uint8_t*>PyBytes_AS_STRING(prefix), PyBytes_GET_SIZE(prefix))
        cdef c.StateMap* m = self._map(kg)
        cdef string key
        cdef size_t i
        for i in range(members.size()):
            key.assign(PyBytes_AS_STRING(prefix), PyBytes_GET_SIZE(prefix))
            key.append(members[i])
            m.remove(<const uint8_t*>key.data(), key.size())

    def index_entry_keys(self, keys, bint insert):
        """List (``insert``) or unlist the map entries ``keys`` (a pa.binary array of encoded
        entry keys, no nulls; CollectionIndex::insert_entry_keys): after a restore, a change set.
        InvalidInputError, nothing changed, for a key that does not split."""
        self._need_index()
        cdef _Entries e = _Entries(keys, keys)
        cdef uint8_t empty = 0
        cdef const uint8_t* kd = e.kd if e.kd != NULL else &empty
        if e.n == 0:
            return
        if insert:
            self.index.insert_entry_keys(kd, e.ko, e.n, self.ix_key, self.ix_ns, self.ix_mp)
        else:
            self.index.erase_entry_keys(kd, e.ko, e.n, self.ix_key, self.ix_ns, self.ix_mp)

    def check_entry_keys(self, keys, str user_key_type=None):
        """InvalidInputError unless every key of ``keys`` (pa.binary, no nulls) splits into a
        map prefix and a non-empty user key (encoded_prefix_size) and, given
        ``user_key_type``, that user key is exactly one serialized key of that type
        (serialized_key_problem: width, varlen, UTF-8, ...): the check of a restore before it
        loads anything; the message names the key group and the reason. Returns None."""
        self._need_index()
        cdef _Entries e = _Entries(keys, keys)
        cdef uint8_t empty = 0
        cdef const uint8_t* kd = e.kd if e.kd != NULL else &empty
        cdef int64_t i
        cdef size_t n, p
        cdef string why
        cdef c.KeySchema uks
        cdef bint check_uk = user_key_type is not None
        if check_uk:
            uks = _key_schema(user_key_type)
        for i in range(e.n):
            n = e.ko[i + 1] - e.ko[i]
            try:
                p = c.encoded_prefix_size(kd + e.ko[i], n, self.ix_key, self.ix_ns, self.ix_mp)
            except InvalidInputError as exc:
                raise InvalidInputError(f"map entry key {i}: {exc}") from None
            if p >= n:
                raise InvalidInputError(f"map entry key {i} holds no user key after its prefix")
            if check_uk:
                why = c.serialized_key_problem(kd + e.ko[i] + p, n - p, uks)
                if why.size():
                    raise InvalidInputError(
                        f"key group {c.read_key_group_prefix(kd + e.ko[i], n, self.ix_mp)}: "
                        f"map entry key {i} ({(<bytes>kd[e.ko[i]:e.ko[i + 1]]).hex()}): "
                        f"undecodable {user_key_type} user key: "
                        f"{why.decode('utf-8', 'replace')}")

    def index_prune(self):
        """Unlist the user keys whose entries are gone (CollectionIndex::prune, after a TTL
        migration dropped entries); returns how many."""
        self._need_index()
        return self.index.prune(self.table[0])

    def index_stats(self):
        """``{"maps", "user_keys", "bytes"}`` of the map index (bytes estimated)."""
        if self.index == NULL:
            return {"maps": 0, "user_keys": 0, "bytes": 0}
        return {"maps": self.index.collections(), "user_keys": self.index.members(),
                "bytes": self.index.bytes()}

    # ---- list state: a list is a sequence of chunks (docs/formats.md "List state")
    def enable_list_index(self, int prefix_width):
        """Keep the index of the chunks of every list (list_index.h) for the list calls below,
        the list kernels and restores; entry keys carry a ``prefix_width``-byte (1 or 2)
        key-group prefix. Once."""
        if self.list_index != NULL:
            raise StateError("the list index is enabled already")
        if prefix_width not in (1, 2):
            raise InvalidInputError(f"key-group prefix width must be 1 or 2, got {prefix_width}")
        self.lx_pw = prefix_width
        self.list_index = new c.ListIndex(self.kg_start, self.kg_end)

    cdef int _need_list_index(self) except -1:
        if self.list_index == NULL:
            raise StateError("the list index is not enabled (enable_list_index)")
        if self.vlayout != _LAYOUT_LIST:
            raise StateError("the list calls need the list value format (set_value_format)")
        self._idle()
        return 0

    def list_chunks(self, int32_t kg, bytes prefix not None):
        """``[(seq, [stored element, ...]), ...]``: the chunks of the list ``prefix`` in list
        order (stored forms as :meth:`get_stored`); listed chunks whose entries are gone (a TTL
        cleanup step that failed part way) are unlisted on the way."""
        self._need_list_index()
        cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(prefix)
        cdef size_t ps = PyBytes_GET_SIZE(prefix)
        cdef vector[uint64_t] seqs
        cdef c.StateMap* m = self._map(kg)
        cdef c.ByteView out
        cdef string key
        cdef size_t i
        self.list_index.chunks(kg, p, ps, seqs)
        out_list = []
        gone = []
        key.assign(<const char*>p, ps)
        key.resize(ps + 8)
        for i in range(seqs.size()):
            c.store_list_seq(<uint8_t*>key.data() + ps, seqs[i])
            if not m.get(<const uint8_t*>key.data(), key.size(), &out):
                gone.append(seqs[i])
                continue
            out_list.append((seqs[i], _decode_list(out.data, out.size, self.vfmt, self.vttl)))
        for seq in gone:
            self.list_index.erase(kg, p, ps, seq)
        return out_list

    def list_append(self, int32_t kg, bytes prefix not None, list stored not None):
        """Append the stored forms ``stored`` to the list ``prefix`` (list_chunks.h
        list_append_encoded: the last chunk filled, then new chunks, listed). Every stored form
        is encoded before the table changes, so one that does not fit the format
        (InvalidInputError) changes nothing."""
        self._need_list_index()
        cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(prefix)
        cdef size_t ps = PyBytes_GET_SIZE(prefix)
        cdef Py_ssize_t i, n = len(stored)
        cdef size_t suffix = 8 if self.vttl else 0
        cdef size_t width = self.vfmt.width
        cdef vector[size_t] ends
        cdef vector[uint8_t] key
        cdef bytes raw
        cdef c.StateMap* m = self._map(kg)
        cdef uint8_t head[10]
        cdef Py_ssize_t hs
        cdef size_t total = 0
        if n == 0:
            return
        parts = []
        for i in range(n):
            raw = self._value_bytes(stored[i])
            if width == 0:
                # The varlen head of a variable-width element (docs/formats.md "List state").
                _write_varlen(head, PyBytes_GET_SIZE(raw) - suffix)
                hs = _varlen_size(PyBytes_GET_SIZE(raw) - suffix)
                parts.append(PyBytes_FromStringAndSize(<const char*>head, hs))
                total += hs
            parts.append(raw)
            total += PyBytes_GET_SIZE(raw)
            ends.push_back(total)
        data = b"".join(parts)
        c.list_append_encoded(m[0], self.list_index[0], kg, p, ps,
                              <const uint8_t*>PyBytes_AS_STRING(data), ends.data(), n, width,
                              suffix, key)

    cdef bytes _value_bytes(self, stored):
        """The bytes of one stored value (or list element / map entry) of this table: the value's
        bytes and, with TTL, its timestamp."""
        cdef uint8_t buf[8]
        cdef Py_ssize_t n
        try:
            v, ts = stored if self.vttl else (stored, None)
            n = _fixed_into(v, self.vfmt, buf) if self.vfmt.width <= 8 else -1
            raw = _var_bytes(v, self.vfmt) if n < 0 else PyBytes_FromStringAndSize(
                <const char*>buf, n)
            return raw + _be_bytes(ts) if self.vttl else raw
        except (TypeError, ValueError, OverflowError) as e:
            raise InvalidInputError(f"stored value {stored!r} does not fit the state's format: "
                                    f"{e}") from None

    def list_put_chunk(self, int32_t kg, bytes prefix not None, uint64_t seq, list stored not None):
        """Rewrite chunk ``seq`` (present) of the list ``prefix`` with the stored elements
        ``stored`` (a TTL read that renewed or dropped some); an empty ``stored`` removes the
        chunk and unlists it."""
        self._need_list_index()
        cdef uint8_t sb[8]
        c.store_list_seq(sb, seq)
        key = prefix + (<const char*>sb)[:8]
        if stored:
            self.put_stored(kg, key, stored)
            return
        self.remove_key(kg, key)
        self.list_index.erase(kg, <const uint8_t*>PyBytes_AS_STRING(prefix),
                              PyBytes_GET_SIZE(prefix), seq)

    def list_size(self, int32_t kg, bytes prefix not None):
        """Elements of the list ``prefix`` (expired ones included), counted in its chunks
        without decoding them."""
        self._need_list_index()
        cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(prefix)
        cdef size_t ps = PyBytes_GET_SIZE(prefix)
        cdef vector[uint64_t] seqs
        cdef c.StateMap* m = self._map(kg)
        cdef c.ByteView out
        cdef string key
        cdef size_t i, total = 0
        self.list_index.chunks(kg, p, ps, seqs)
        key.assign(<const char*>p, ps)
        key.resize(ps + 8)
        for i in range(seqs.size()):
            c.store_list_seq(<uint8_t*>key.data() + ps, seqs[i])
            if m.get(<const uint8_t*>key.data(), key.size(), &out):
                total += c.list_chunk_count(out.data, out.size, self.vfmt.width,
                                            8 if self.vttl else 0)
        return total

    def list_clear(self, int32_t kg, bytes prefix not None):
        """Remove every chunk of the list ``prefix`` and drop it from the index; O(its
        chunks)."""
        self._need_list_index()
        cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(prefix)
        cdef size_t ps = PyBytes_GET_SIZE(prefix)
        cdef vector[uint64_t] seqs = self.list_index.take(kg, p, ps)
        cdef c.StateMap* m = self._map(kg)
        cdef string key
        cdef size_t i
        key.assign(<const char*>p, ps)
        key.resize(ps + 8)
        for i in range(seqs.size()):
            c.store_list_seq(<uint8_t*>key.data() + ps, seqs[i])
            m.remove(<const uint8_t*>key.data(), key.size())

    def list_index_entry_keys(self, keys, bint insert):
        """List (``insert``) or unlist the list chunks ``keys`` (a pa.binary array of encoded
        entry keys ``prefix | seq``, no nulls; ListIndex::insert_entry_keys): after a restore,
        a change set. InvalidInputError, nothing changed, for a key too short to hold a
        sequence number."""
        self._need_list_index()
        cdef _Entries e = _Entries(keys, keys)
        cdef uint8_t empty = 0
        cdef const uint8_t* kd = e.kd if e.kd != NULL else &empty
        if e.n == 0:
            return
        if insert:
            self.list_index.insert_entry_keys(kd, e.ko, e.n, self.lx_pw)
        else:
            self.list_index.erase_entry_keys(kd, e.ko, e.n, self.lx_pw)

    def list_index_prune(self):
        """Unlist the elements whose entries are gone (ListIndex::prune, after a TTL migration
        dropped entries); returns how many."""
        self._need_list_index()
        return self.list_index.prune(self.table[0])

    def list_index_stats(self):
        """``{"lists", "elements", "bytes"}`` of the list index (bytes estimated)."""
        if self.list_index == NULL:
            return {"lists": 0, "elements": 0, "bytes": 0}
        return {"lists": self.list_index.lists(), "chunks": self.list_index.chunks(),
                "bytes": self.list_index.bytes()}

    cdef bint _indexed(self) noexcept nogil:
        return self.index != NULL or self.list_index != NULL

    cdef int _unlist(self, vector[string]& removed) except -1 nogil:
        """Unlist from the map or list index the entries a TTL cleanup step removed (their
        keys in ``removed``, emptied)."""
        if removed.size() == 0:
            return 0
        if self.index != NULL:
            self.index.erase_entry_key_strings(removed, self.ix_key, self.ix_ns, self.ix_mp)
        if self.list_index != NULL:
            self.list_index.erase_entry_key_strings(removed, self.lx_pw)
        removed.clear()
        return 0

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
        cdef vector[string] removed  # with a map / list index: the removed entries' keys
        self._claim()
        try:
            with nogil:
                step = c.cleanup_step(m[0], &cursor, min_entries, spec, now, &scratch,
                                      &removed if self._indexed() else NULL)
                self._unlist(removed)
        except InvalidInputError as e:
            raise InvalidInputError(f"key group {kg}: {e}") from None
        finally:
            self._release()
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
        finally:
            self._release()
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
        finally:
            self._release()
        return r.rewritten, r.removed, r.expired

    def ttl_cleanup_table_step(self, int32_t kg, uint64_t bucket, size_t min_entries, str kind,
                               fixed_width, int64_t ttl_ms, int64_t now, size_t steps=1):
        """Incremental TTL cleanup over the whole table (ttl.h ``cleanup_step`` with a
        ``TableCursor``): from key group ``kg``, bucket ``bucket`` on, key group after key
        group, until at least ``min_entries`` entries were visited or the last key group ended;
        ``steps`` such steps one after the other (what as many single state accesses run: each
        step stops at the end of a pass, the next one starts a new pass). Returns ``(visited,
        expired, next_kg, next_bucket, wrapped)`` summed over the steps; ``wrapped`` = a pass
        over the table completed (the cursor is back at the first key group). A ``kg`` outside
        the range restarts at the first one. InvalidInputError for a stored value whose TTL
        layout is broken."""
        cdef c.FilterSpec spec = _ttl_filter_spec(kind, fixed_width, ttl_ms)
        cdef c.CleanupStep step
        cdef c.SortedRun scratch
        cdef vector[string] removed  # with a map / list index: the removed entries' keys
        cdef c.TableCursor cur
        cdef size_t visited = 0, expired = 0, i
        cdef bint wrapped = False, from_start
        cur.key_group = kg
        cur.bucket = bucket
        self._claim()
        try:
            with nogil:
                for i in range(steps):
                    from_start = cur.key_group == self.table[0].kg_start() and cur.bucket == 0
                    step = c.cleanup_table_step(self.table[0], &cur, min_entries, spec, now,
                                                &scratch, &removed if self._indexed() else NULL)
                    self._unlist(removed)
                    visited += step.visited
                    expired += step.expired
                    wrapped = wrapped or step.wrapped
                    if step.wrapped and from_start and step.visited == 0:
                        break  # an empty table: the remaining steps would visit nothing too
        finally:
            self._release()
        return visited, expired, cur.key_group, cur.bucket, wrapped

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
        finally:
            self._release()

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
            self._release()
        return removed

    # ---------------------------------------------------------------- tiered mode (tiered.md)
    cdef int32_t _prefix_kg(self, const uint8_t* k, int32_t size, int prefix_width) except -2:
        cdef int32_t kg
        if size <= prefix_width:
            raise InvalidInputError("an encoded key is not longer than its key-group prefix")
        kg = k[0] if prefix_width == 1 else (<int32_t>k[0] << 8) | k[1]
        if kg < self.kg_start or kg > self.kg_end:
            raise InvalidInputError(f"an encoded key has key group {kg}, outside the table's "
                                    f"range [{self.kg_start}, {self.kg_end}]")
        return kg

    def absent_keys(self, keys, int prefix_width):
        """Which encoded keys (a pa.binary array without nulls, any key groups of the table,
        each read from its big-endian ``prefix_width``-byte prefix) the table does not hold:
        a numpy bool array. InvalidInputError for a key not longer than its prefix or of a key
        group outside the table."""
        cdef _Entries e = _Entries(keys, keys)
        cdef int64_t i
        cdef int32_t kg, size
        cdef uint8_t empty = 0
        cdef const uint8_t* kd = e.kd if e.kd != NULL else &empty
        out = np.zeros(e.n, np.bool_)
        cdef uint8_t[::1] o = out.view(np.uint8)
        self._idle()
        for i in range(e.n):
            size = e.ko[i + 1] - e.ko[i]
            kg = self._prefix_kg(kd + e.ko[i], size, prefix_width)
            o[i] = not self.table.map(kg).get(kd + e.ko[i], size, NULL)
        return out

    def load_clean(self, keys, values, int prefix_width):
        """Insert entries of the committed checkpoint as clean (StateMap::insert_clean: part of
        the base, logged as no change): ``keys``/``values`` pa.binary arrays of equal length,
        keys without nulls (any order, key groups read from the prefix); a NULL value (absent
        from the checkpoint) and a key the table already holds are skipped. Returns the entries
        inserted. InvalidInputError for bad keys (nothing inserted then: the keys are checked
        first); StateError (from the map's logic error) when the table has no base. The GIL is
        released while the entries are inserted."""
        cdef _Entries e = _Entries(keys, values)
        cdef int64_t i
        cdef int64_t n = 0
        cdef uint8_t empty = 0
        cdef const uint8_t* kd = e.kd if e.kd != NULL else &empty
        cdef const uint8_t* vd = e.vd if e.vd != NULL else &empty
        kgs = np.empty(e.n, np.int32)
        cdef int32_t[::1] kv = kgs
        self._idle()
        for i in range(e.n):
            kv[i] = self._prefix_kg(kd + e.ko[i], e.ko[i + 1] - e.ko[i], prefix_width)
        if e.n == 0:
            return 0
        # tiered_batch.h load_clean_batch: the rows' map slots prefetched ahead.
        self._claim()
        try:
            with nogil:
                n = c.load_clean_batch(self.table[0], &kv[0], e.ko, kd, e.vo, vd, e.vbits,
                                       e.voff, e.n)
        finally:
            self._release()
        return n

    def load_clean_one(self, int32_t kg, bytes key not None, bytes value not None):
        """:meth:`load_clean` of one entry (``key`` of key group ``kg``, its stored ``value``)
        for the per-record reads: True when inserted, False when the table holds the key
        already. InvalidInputError for a key group outside the table; StateError (from the
        map's logic error) when the table has no base."""
        cdef c.StateMap* m = self._map(kg)
        return m.insert_clean(<const uint8_t*>PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key),
                              <const uint8_t*>PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value))

    def batch_encoded_keys(self, keys, str key_type, str assigner, int32_t max_parallelism,
                           rows=None, bint only_absent=True, namespace_type=None):
        """The encoded keys (a ``pa.binary()`` array) of the rows of ``keys`` -- all, or those
        where the numpy bool array ``rows`` is true -- each once per chunk, in the order of their
        first row; with ``only_absent`` only those the table does not hold (tiered_batch.h: what
        the tiered mode loads before a kernel runs). ``keys`` and ``namespace_type`` as in
        :meth:`get_batch`; the keys are validated as the kernels validate them
        (InvalidInputError). Touches no state; the GIL is released."""
        cdef c.BatchKeySpec spec = self._spec(key_type, assigner, max_parallelism, namespace_type)
        cdef _Chunks k = _Chunks(keys)
        cdef size_t j, nchunks = k.count()
        cdef vector[int32_t] offsets
        cdef vector[uint8_t] data
        cdef const uint8_t[::1] mask
        cdef const uint8_t* mp = NULL
        if rows is not None:
            rows_np = np.ascontiguousarray(rows, np.bool_).view(np.uint8)
            if len(rows_np) != k.total:
                raise InvalidInputError(f"{k.total} keys but {len(rows_np)} row flags")
            if k.total:
                mask = rows_np
                mp = &mask[0]
        offsets.push_back(0)
        self._claim()
        try:
            with nogil:
                for j in range(nchunks):
                    c.batch_encoded_keys(self.table[0], spec, k.inputs[j],
                                         mp + k.starts[j] if mp != NULL else NULL, only_absent,
                                         &offsets, &data)
        finally:
            self._release()
        cdef size_t n = offsets.size() - 1
        off_np = np.empty(n + 1, np.int32)
        data_np = np.empty(max(data.size(), 1), np.uint8)
        cdef int32_t[::1] ov = off_np
        cdef uint8_t[::1] dv = data_np
        memcpy(&ov[0], offsets.data(), 4 * (n + 1))
        if data.size():
            memcpy(&dv[0], data.data(), data.size())
        return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(off_np),
                                                      pa.py_buffer(data_np[:data.size()])])

    def is_clean(self, int32_t kg, bytes key not None):
        """True when ``key`` is present and unchanged since the base (StateMap::is_clean)."""
        cdef c.StateMap* m = self._map(kg)
        return m.is_clean(<const uint8_t*><const char*>key, len(key))

    def evict_clean(self, size_t target_bytes):
        """Remove clean entries (unchanged since the base; StateTable::evict_clean's clock hand
        over key groups and buckets) without logging them, until :attr:`nbytes` <=
        ``target_bytes`` or none is left. Returns the entries removed."""
        self._idle()
        return self.table.evict_clean(target_bytes)

    def evict_collection(self, int32_t kg, bytes prefix not None):
        """Evict the list or map ``prefix`` (a list's chunks, a map's user keys, as its index
        lists them) whole or not at all: when every entry present is clean
        (StateMap::evict, no removal logged) they are removed and the collection is unlisted,
        returning how many; else nothing changes and -1 is returned (an
        entry written since the base). The tiered mode never holds part of a collection."""
        if self.index == NULL and self.list_index == NULL:
            raise StateError("evict_collection needs a map or list index")
        self._idle()
        return self._evict_collection(kg, prefix)

    def evict_collections(self, list kgs not None, list prefixes not None,
                          list skip not None, size_t target_bytes):
        """:meth:`evict_collection` of ``prefixes[i]`` (bytes) in key group ``kgs[i]`` (ints)
        in order, until :attr:`nbytes` <= ``target_bytes``; ``skip[i]`` true: not tried. One
        call for a run of collections (the tiered mode's least recently used first). Returns
        a list, one int per collection tried or skipped before the target was reached: the
        entries evicted (>= 0), -1 (an entry written since the base: kept), -2 (skipped);
        shorter than ``prefixes`` when the target was reached first. InvalidInputError for
        lists of different lengths or a key group outside the table's range."""
        if self.index == NULL and self.list_index == NULL:
            raise StateError("evict_collections needs a map or list index")
        if len(kgs) != len(prefixes) or len(skip) != len(prefixes):
            raise InvalidInputError(
                f"kgs, prefixes and skip must have one item per collection, got {len(kgs)}, "
                f"{len(prefixes)} and {len(skip)}")
        self._idle()
        cdef size_t total = self.table.bytes(), before
        cdef Py_ssize_t i
        cdef int32_t kg
        cdef int64_t got
        cdef c.StateMap* m
        out = []
        for i in range(len(prefixes)):
            if total <= target_bytes:
                break
            if skip[i]:
                out.append(-2)
                continue
            kg = kgs[i]
            m = self._map(kg)
            before = m.bytes()
            got = self._evict_collection(kg, prefixes[i])
            total -= before - m.bytes()
            out.append(got)
        return out

    cdef int64_t _evict_collection(self, int32_t kg, bytes prefix) except -2:
        cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(prefix)
        cdef size_t ps = PyBytes_GET_SIZE(prefix)
        cdef c.StateMap* m = self._map(kg)
        cdef vector[string] keys
        cdef vector[string] members
        cdef vector[uint64_t] seqs
        cdef string key
        cdef size_t i
        cdef int64_t evicted = 0
        if self.index != NULL:
            members = self.index.list_members(kg, p, ps)
            for i in range(members.size()):
                key.assign(<const char*>p, ps)
                key.append(members[i])
                keys.push_back(key)
        else:
            self.list_index.chunks(kg, p, ps, seqs)
            for i in range(seqs.size()):
                key.assign(<const char*>p, ps)
                key.resize(ps + 8)
                c.store_list_seq(<uint8_t*>key.data() + ps, seqs[i])
                keys.push_back(key)
        for i in range(keys.size()):
            if (m.get(<const uint8_t*>keys[i].data(), keys[i].size(), NULL)
                    and not m.is_clean(<const uint8_t*>keys[i].data(), keys[i].size())):
                return -1
        for i in range(keys.size()):
            evicted += m.evict(<const uint8_t*>keys[i].data(), keys[i].size())
        if self.index != NULL:
            self.index.take(kg, p, ps)
        else:
            self.list_index.take(kg, p, ps)
        return evicted

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
        self.table.mark_base(version)

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

    cdef int _cleanup_begin(self, c.IncrementalCleanup* ic, cleanup) except -1:
        """Fill ``ic`` from ``cleanup``, the incremental TTL cleanup a kernel runs before each
        row (ttl.h ``IncrementalCleanup``): ``cleanup.start()`` gives ``(key group, bucket,
        cleanup_size, steps_per_row, kind, fixed_width, ttl_ms, now)`` -- the cursor of
        :meth:`ttl_cleanup_table_step`, which per-record steps continue -- and the kernel's
        call ends with ``cleanup.end(key group, bucket, expired)`` (also when it raises: the
        steps of the rows before the error stay done). A map state's removed entries leave the
        map index too, a list state's the list index."""
        kg, bucket, size, steps, kind, fixed_width, ttl_ms, now = cleanup.start()
        if size < 1 or steps < 1:
            raise InvalidInputError(f"cleanup size {size} and steps a row {steps} must be >= 1")
        ic.table = self.table
        ic.cursor.key_group = kg
        ic.cursor.bucket = bucket
        ic.cleanup_size = size
        ic.steps_per_row = steps
        ic.spec = _ttl_filter_spec(kind, fixed_width, ttl_ms)
        ic.now = now
        if self.index != NULL:
            ic.index = self.index
            ic.index_key = self.ix_key
            ic.index_namespace = self.ix_ns
            ic.index_max_parallelism = self.ix_mp
        if self.list_index != NULL:
            ic.list_index = self.list_index
            ic.list_prefix_width = self.lx_pw
        return 0

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
                  ttl=None, count_expired=None, namespace_type=None, cleanup=None):
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
        mid-batch. ``cleanup`` (every kernel call of this class): None, or a TTL state's
        incremental cleanup, run before each row (:meth:`_cleanup_begin`; batch.h "TTL").
        InvalidInputError on bad input. The GIL is released while the kernels run."""
        cdef c.BatchKeySpec spec = self._spec(key_type, assigner, max_parallelism, namespace_type)
        cdef c.TtlBatchSpec tspec = _ttl_spec(ttl)
        cdef c.IncrementalCleanup ic
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
        if cleanup is not None:
            self._cleanup_begin(&ic, cleanup)
            tspec.cleanup = &ic
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
        finally:
            self._release()
            if cleanup is not None:
                cleanup.end(ic.cursor.key_group, ic.cursor.bucket, ic.expired)
            expired += chunk_expired
            if expired and count_expired is not None:
                count_expired(expired)
        if width:
            return _fixed_out_array(value_type, vals, valid, n, width)
        off_np, data_np = _concat_var(offsets, data, n)
        typ = pa.large_string() if value_type == "string" else pa.large_binary()
        return pa.Array.from_buffers(typ, n, [_bitmap(valid[:n], n), pa.py_buffer(off_np), pa.py_buffer(data_np)])

    def put_batch(self, keys, values, str key_type, str assigner, int32_t max_parallelism,
                  str value_type, ttl=None, namespace_type=None, cleanup=None):
        """values[i] for keys[i] in row order; a null value removes the key. ``keys`` and
        ``values`` as ``keys`` of :meth:`get_batch`, split into chunks of the same lengths
        (InvalidInputError otherwise); every chunk pair is validated before the first is
        written. ``ttl`` as in :meth:`get_batch`: every written value is stamped ``now_ms``."""
        cdef c.BatchKeySpec spec = self._spec(key_type, assigner, max_parallelism, namespace_type)
        cdef c.TtlBatchSpec tspec = _ttl_spec(ttl)
        cdef c.IncrementalCleanup ic
        cdef _Chunks k = _Chunks(keys)
        cdef _Chunks v = _Chunks(values)
        cdef c.ValueSpec vt = _value_spec(value_type)
        cdef size_t j, nchunks = k.count()
        k.check_aligned(v)
        if cleanup is not None:
            self._cleanup_begin(&ic, cleanup)
            tspec.cleanup = &ic
        self._claim()
        try:
            with nogil:
                # The first chunk's kernel validates it before touching anything.
                for j in range(1, nchunks):
                    c.validate_batch(self.table[0], spec, k.inputs[j], vt, c.BatchOp.Put,
                                     c.Reducer.Sum, v.inputs[j], tspec)
                for j in range(nchunks):
                    c.put_batch(self.table[0], spec, k.inputs[j], vt, v.inputs[j], tspec)
        finally:
            self._release()
            if cleanup is not None:
                cleanup.end(ic.cursor.key_group, ic.cursor.bucket, ic.expired)

    def append_batch(self, keys, values, str key_type, str assigner, int32_t max_parallelism,
                     str element_type, ttl=None, namespace_type=None, cleanup=None):
        """ListState: appends values[i] (one element a row, the Arrow type of ``element_type``, no
        nulls) to the list of keys[i] as an entry of its own, in row order (batch_collections.h;
        the list index enabled). ``keys`` and
        ``values`` as in :meth:`put_batch` (chunks of equal lengths, every chunk validated before
        the first is applied); ``ttl`` as there: every element is stamped ``now_ms``.
        InvalidInputError on bad input, the table then unchanged."""
        cdef c.BatchKeySpec spec = self._spec(key_type, assigner, max_parallelism, namespace_type)
        cdef c.TtlBatchSpec tspec = _ttl_spec(ttl)
        cdef c.IncrementalCleanup ic
        cdef _Chunks k = _Chunks(keys)
        cdef _Chunks v = _Chunks(values)
        cdef c.ValueSpec et = _value_spec(element_type)
        cdef size_t j, nchunks = k.count()
        k.check_aligned(v)
        self._need_list_index()
        if cleanup is not None:
            self._cleanup_begin(&ic, cleanup)
            tspec.cleanup = &ic
        self._claim()
        try:
            with nogil:
                for j in range(1, nchunks):
                    c.validate_list_append_batch(self.table[0], spec, k.inputs[j], et, v.inputs[j],
                                                 tspec)
                for j in range(nchunks):
                    c.list_append_batch(self.table[0], spec, k.inputs[j], et, v.inputs[j], tspec,
                                        self.list_index)
        finally:
            self._release()
            if cleanup is not None:
                cleanup.end(ic.cursor.key_group, ic.cursor.bucket, ic.expired)

    def map_put_batch(self, keys, user_keys, values, str key_type, str assigner,
                      int32_t max_parallelism, str user_key_type, str value_type, ttl=None,
                      namespace_type=None, cleanup=None):
        """MapState: puts user_keys[i] -> values[i] into the map of keys[i], in row order, one
        entry per row (batch_collections.h; listed in the map index when enabled,
        :meth:`enable_map_index`). ``user_key_type``: a
        scalar statecore key type (its serializer is the user keys' one). ``keys``,
        ``user_keys`` and ``values`` chunked alike, as in :meth:`put_batch`; no null user keys
        or values. ``ttl`` as there: every put value is stamped ``now_ms``. InvalidInputError
        on bad input, the table then unchanged."""
        cdef c.BatchKeySpec spec = self._spec(key_type, assigner, max_parallelism, namespace_type)
        cdef c.TtlBatchSpec tspec = _ttl_spec(ttl)
        cdef c.IncrementalCleanup ic
        cdef c.KeySchema uks = _key_schema(user_key_type)
        cdef _Chunks k = _Chunks(keys)
        cdef _Chunks u = _Chunks(user_keys)
        cdef _Chunks v = _Chunks(values)
        cdef c.ValueSpec vt = _value_spec(value_type)
        cdef size_t j, nchunks = k.count()
        k.check_aligned(u)
        k.check_aligned(v)
        if cleanup is not None:
            self._cleanup_begin(&ic, cleanup)
            tspec.cleanup = &ic
        self._claim()
        try:
            with nogil:
                for j in range(1, nchunks):
                    c.validate_map_put_batch(self.table[0], spec, k.inputs[j], uks, u.inputs[j], vt,
                                             v.inputs[j], tspec)
                for j in range(nchunks):
                    c.map_put_batch(self.table[0], spec, k.inputs[j], uks, u.inputs[j], vt,
                                    v.inputs[j], tspec, self.index)
        finally:
            self._release()
            if cleanup is not None:
                cleanup.end(ic.cursor.key_group, ic.cursor.bucket, ic.expired)

    def add_batch(self, keys, values, str key_type, str assigner, int32_t max_parallelism,
                  str value_type, str reducer, ttl=None, count_expired=None, namespace_type=None, cleanup=None):
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
        cdef c.IncrementalCleanup ic
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
        if cleanup is not None:
            self._cleanup_begin(&ic, cleanup)
            tspec.cleanup = &ic
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
        finally:
            self._release()
            if cleanup is not None:
                cleanup.end(ic.cursor.key_group, ic.cursor.bucket, ic.expired)
            expired += chunk_expired
            if expired and count_expired is not None:
                count_expired(expired)
        return _fixed_out_array(value_type, vals, valid, n, width)

    # ---------------------------------------------- collection reads, removals, clear
    # (batch_reads.h). Chunked input as in get_batch/put_batch: a call that can change the
    # table (clear, remove, reads with TTL) validates every later chunk before the first is
    # applied; the outputs of all chunks are one result (the kernels append to one buffer).

    def clear_batch(self, keys, str key_type, str assigner, int32_t max_parallelism,
                    namespace_type=None, cleanup=None):
        """Removes the entry of every key in row order (absent keys skipped); any state kind
        and value type (the value bytes are not read); with the map index enabled, every entry
        of the key's map, with the list index every element of the key's list. ``keys`` as in :meth:`get_batch`.
        InvalidInputError on bad input, the table then unchanged."""
        cdef c.BatchKeySpec spec = self._spec(key_type, assigner, max_parallelism, namespace_type)
        cdef c.TtlBatchSpec none_ttl
        cdef c.IncrementalCleanup ic
        cdef c.IncrementalCleanup* icp = NULL
        cdef _Chunks k = _Chunks(keys)
        cdef size_t j, nchunks = k.count()
        if cleanup is not None:
            self._cleanup_begin(&ic, cleanup)
            icp = &ic
        self._claim()
        try:
            with nogil:
                for j in range(1, nchunks):
                    c.validate_key_batch(self.table[0], spec, k.inputs[j], none_ttl)
                for j in range(nchunks):
                    c.clear_batch(self.table[0], spec, k.inputs[j], self.index, self.list_index,
                                  icp)
        finally:
            self._release()
            if cleanup is not None:
                cleanup.end(ic.cursor.key_group, ic.cursor.bucket, ic.expired)

    def list_get_batch(self, keys, str key_type, str assigner, int32_t max_parallelism,
                       str element_type, ttl=None, count_expired=None, namespace_type=None, cleanup=None):
        """ListState: the list of every key as a ``list<T>`` array (T the Arrow type of
        ``element_type``, as the Python backend's ``pa.list_(T)``; ``large_list`` / large
        element types only when the result holds 2**31 elements / bytes or more), one row per
        key, an empty list for an absent key, no nulls. ``keys``, ``ttl`` and
        ``count_expired`` as in :meth:`get_batch`; with TTL expired elements are dropped (and
        removed, counted) as batch_reads.h says. The GIL is released while the kernels run."""
        cdef c.BatchKeySpec spec = self._spec(key_type, assigner, max_parallelism, namespace_type)
        cdef c.TtlBatchSpec tspec = _ttl_spec(ttl)
        cdef c.IncrementalCleanup ic
        cdef _Chunks k = _Chunks(keys)
        cdef int64_t n = k.total
        cdef int64_t expired = 0, chunk_expired = 0
        cdef c.ValueSpec et = _value_spec(element_type)
        cdef vector[int64_t] list_offsets
        cdef vector[int64_t] element_offsets
        cdef vector[uint8_t] elements
        cdef size_t width = c.value_width(et), j, nchunks = k.count()
        self._need_list_index()
        list_offsets.push_back(0)
        element_offsets.push_back(0)
        if cleanup is not None:
            self._cleanup_begin(&ic, cleanup)
            tspec.cleanup = &ic
        self._claim()
        try:
            with nogil:
                if nchunks > 1 and tspec.enabled:
                    for j in range(1, nchunks):
                        c.validate_key_batch(self.table[0], spec, k.inputs[j], tspec)
                for j in range(nchunks):
                    c.list_get_batch(self.table[0], spec, k.inputs[j], et, list_offsets,
                                     elements, element_offsets, tspec, &chunk_expired,
                                     self.list_index)
                    expired += chunk_expired
                    chunk_expired = 0
        finally:
            self._release()
            if cleanup is not None:
                cleanup.end(ic.cursor.key_group, ic.cursor.bucket, ic.expired)
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
                      count_expired=None, namespace_type=None, cleanup=None):
        """MapState: the value of user_keys[i] in the map of keys[i], null where absent, as
        :meth:`get_batch` returns values (string -> large_string, binary -> large_binary).
        ``keys``/``user_keys`` chunked alike (as :meth:`map_put_batch`), no null user keys;
        ``ttl``/``count_expired`` as in :meth:`get_batch` (expired pairs removed, counted)."""
        cdef c.BatchKeySpec spec = self._spec(key_type, assigner, max_parallelism, namespace_type)
        cdef c.TtlBatchSpec tspec = _ttl_spec(ttl)
        cdef c.IncrementalCleanup ic
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
        if cleanup is not None:
            self._cleanup_begin(&ic, cleanup)
            tspec.cleanup = &ic
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
                                    tspec, &chunk_expired, self.index)
                    expired += chunk_expired
                    chunk_expired = 0
        finally:
            self._release()
            if cleanup is not None:
                cleanup.end(ic.cursor.key_group, ic.cursor.bucket, ic.expired)
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
                           count_expired=None, namespace_type=None, cleanup=None):
        """MapState: a bool array (no nulls), true where user_keys[i] is in the map of keys[i]
        (with TTL: where :meth:`map_get_batch` would return a value, with the same removals,
        renewals and counts). Arguments as :meth:`map_get_batch`."""
        cdef c.BatchKeySpec spec = self._spec(key_type, assigner, max_parallelism, namespace_type)
        cdef c.TtlBatchSpec tspec = _ttl_spec(ttl)
        cdef c.IncrementalCleanup ic
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
        if cleanup is not None:
            self._cleanup_begin(&ic, cleanup)
            tspec.cleanup = &ic
        self._claim()
        try:
            with nogil:
                if nchunks > 1 and tspec.enabled:
                    for j in range(1, nchunks):
                        c.validate_map_key_batch(self.table[0], spec, k.inputs[j], uks,
                                                 u.inputs[j], tspec)
                for j in range(nchunks):
                    c.map_contains_batch(self.table[0], spec, k.inputs[j], uks, u.inputs[j], vt,
                                         &found[k.starts[j]], tspec, &chunk_expired, self.index)
                    expired += chunk_expired
                    chunk_expired = 0
        finally:
            self._release()
            if cleanup is not None:
                cleanup.end(ic.cursor.key_group, ic.cursor.bucket, ic.expired)
            expired += chunk_expired
            if expired and count_expired is not None:
                count_expired(expired)
        return pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(
            np.packbits(found_np[:n], bitorder="little"))])

    def map_remove_batch(self, keys, user_keys, str key_type, str assigner,
                         int32_t max_parallelism, str user_key_type, namespace_type=None, cleanup=None):
        """MapState: removes the entry of user_keys[i] in the map of keys[i] in row order (and
        unlists it). Chunked as :meth:`map_put_batch`, every chunk validated before the
        first is applied. InvalidInputError on bad input, the table then unchanged."""
        cdef c.BatchKeySpec spec = self._spec(key_type, assigner, max_parallelism, namespace_type)
        cdef c.TtlBatchSpec none_ttl
        cdef c.IncrementalCleanup ic
        cdef c.IncrementalCleanup* icp = NULL
        cdef c.KeySchema uks = _key_schema(user_key_type)
        cdef _Chunks k = _Chunks(keys)
        cdef _Chunks u = _Chunks(user_keys)
        cdef size_t j, nchunks = k.count()
        k.check_aligned(u)
        if cleanup is not None:
            self._cleanup_begin(&ic, cleanup)
            icp = &ic
        self._claim()
        try:
            with nogil:
                for j in range(1, nchunks):
                    c.validate_map_key_batch(self.table[0], spec, k.inputs[j], uks, u.inputs[j],
                                             none_ttl)
                for j in range(nchunks):
                    c.map_remove_batch(self.table[0], spec, k.inputs[j], uks, u.inputs[j],
                                       self.index, icp)
        finally:
            self._release()
            if cleanup is not None:
                cleanup.end(ic.cursor.key_group, ic.cursor.bucket, ic.expired)


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

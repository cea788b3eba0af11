"""NativeBackend: keyed state in the C++ copy-on-write state map (``statecore._native``).

Each registered state is one native ``StateTable``: a copy-on-write, incrementally rehashing map
per key group of the backend's key-group range, holding encoded keys and serialized values in the
byte formats of docs/formats.md, so native snapshots, checkpoints and Python-backend
snapshots are interchangeable.

Per-record state objects are the shared classes of :mod:`statecore.backends.states` (and
:mod:`statecore.backends.ttl_states`) running over :class:`NativeTable`, a
:class:`~statecore.backends.states.StateTable` whose slots are (key group, encoded key) and which
converts stored values to the map's bytes: the per-record semantics of the two backends are the
same code. The per-record path is kept short: ``set_current_key`` validates the key, computes its
key group and builds ``prefix | ser(key)`` in one native call (``_native.KeyEncoder``); each state
object caches its encoded key for the current key and its current namespace (``_NativeState``);
stored values of every state kind are converted in Cython (``NativeStateTable.get_stored`` /
``put_stored``).

What differs is where the bytes live and the batch paths: ``get_batch``/``put_batch`` (and
``contains_batch``) on value state and ``get_batch``/``add_batch`` on reducing state with built-in
reducers, for every namespace type (void; int32, int64, string, binary namespaces, one per row or
one for the whole batch, go to the kernels as {key, namespace} struct chunks, ``_keyed_chunks``)
and every value type but pickle (int64, uint64, float64, int32, bool, timestamp[unit],
fixed_size_binary[N], string, binary; large_string/large_binary input accepted; ``sum`` on
int64/uint64/float64/int32, ``min``/``max`` on every fixed-width type but bool (fixed_size_binary
by bytes), ``first``/``last`` on any fixed-width type, ``count`` of values of any flat type), and
every key type, multi-column keys included (the kernels hash and encode the key arrays themselves,
native/include/statecore/key_columns.h), run as native kernels that read the Arrow buffers through
the C Data Interface (no Python object per row) with the GIL released. ListState ``append_batch``
and MapState ``put_batch`` (any namespace, typed elements / typed user keys and values, TTL or not)
run the collection kernels (native/include/statecore/batch_collections.h): each row's element or
pair is spliced into the key's stored blob in C++. ListState ``get_batch``, MapState
``get_batch``/``contains_batch``/``remove_batch`` (same scope; removals also with pickle values)
and ``clear_batch`` of every state kind and value type run the read / removal kernels
(native/include/statecore/batch_reads.h), their Arrow results built from the kernels' buffers.
Other batch calls (pickle values or user keys, custom reducers, aggregating add/get, timers) take
the per-row path and behave identically.

Chunked input (a ChunkedArray, an ``__arrow_c_stream__`` object;
:func:`statecore.arrow_input.import_arrow`): the kernels read the chunks in place, one kernel
call per chunk (keys and values sliced -- views, no copy -- where their chunk boundaries
differ), all inside one GIL release; every later chunk is validated (``validate_batch``) before
the first is applied (the first chunk's kernel validates it before touching anything; a get
without TTL changes nothing and needs no pass ahead), so bad input anywhere leaves the state
unchanged. That pass hashes the keys of the later chunks once more (for the key-group check),
which costs about what combining them would copy. Copies remain where they are cheaper or
needed: chunks averaging fewer than ``_MIN_ROWS_PER_CHUNK`` rows are combined first (per-call
costs would exceed a copy); an integer (int64, uint64, int32) ``sum`` batch is combined into one
kernel call (its overflow rollback covers one call); a multi-column key given as a list of
chunked columns is combined per column; outputs are one new array. The per-row paths combine chunks
too (they build Python objects anyway). TTL-enabled states use the same kernels with TTL on (batch.h
"TTL", batch_reads.h: the value bytes, list elements and map values carry the timestamp suffix;
reads remove expired entries, list elements and map pairs and renew, writes stamp the batch's one
clock reading); their semantics are ttl_states.py's, row for row.

Snapshots: :meth:`NativeBackend.snapshot` takes one O(1) map snapshot per key group of every
state (O(states x key groups), independent of the number of entries); entries are serialized
only when a reader asks for a key group.

Incremental snapshots: the native maps track changes themselves (state_map.h "Change tracking":
a per-entry `modified` version and a per-map removal log). Table versions move by one per
snapshot, so the backend remembers, per snapshot id not yet completed, each table's version;
``notify_checkpoint_complete(id)`` marks those versions as the tables' bases. A restore rebases
every table after its bulk load. An incremental snapshot lists ``changes(kg, base)`` with the
table's base as of snapshot time.

Thread contract (``statecore.backends.base`` module docstring has the full text): one thread uses
a backend at a time; a snapshot may be read from another thread. The kernels release the GIL;
meanwhile other threads may use other backends (in parallel), never this one -- a call on a
state whose kernel is running raises StateError (``NativeStateTable``'s busy mark) -- and the
input buffers must stay unmodified until the call returns.
"""

from __future__ import annotations

import copy

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statecore import _native
from statecore import serializers as S
from statecore.arrow_input import (
    arrow_type_ok,
    batch_namespace_array,
    check_arrow_type,
    coerce_key_array,
    coerce_value_array,
    combined,
    import_arrow,
    is_arrow_input,
)
from statecore.backends import base, states, ttl_states
from statecore.backends.table_backend import TableBackend
from statecore.errors import InvalidInputError, StateError, StateMigrationError
from statecore.key_groups import KeyGroupRange
from statecore.timers import TIMERS_STATE_NAME

__all__ = ["NativeBackend", "NativeSnapshot", "NativeTable"]


#: Marks a staged part that spans several key groups (``NativeStateTable.load_range``).
_RANGE = object()


class NativeTable(states.StateTable):
    """The :class:`~statecore.backends.states.StateTable` interface over a native StateTable.

    ``get/put/remove(kg, k)`` take the encoded key as ``k`` (bytes: the native backend's slots,
    :meth:`NativeBackend._batch_slots` and ``_NativeState._slot``) and take and return the
    reference backend's stored forms; bytes in the map are the encoded key and the serialized
    value.
    """

    def __init__(self, meta: dict, backend: "NativeBackend"):
        super().__init__(meta)
        r = backend.key_group_range
        self.native = _native.NativeStateTable(r.start, r.end)
        self._ttl_cursor = None  # (key group, bucket) where the next cleanup step starts
        self._use_stored_format()

    def _use_stored_format(self) -> None:
        # Stored forms are converted in Cython (NativeStateTable.get_stored / put_stored, the
        # layouts of PythonTable.encode_value): the methods are bound on the instance so that an
        # access is one call into the extension, without a Python frame in between.
        self.native.set_value_format(self.kind, self.value_ser.name, self.ttl)
        self.get = self.native.get_stored
        self.put = self.native.put_stored
        self.remove = self.native.remove_key

    # get/put/remove are bound per instance (_use_stored_format); these satisfy the interface.
    def get(self, kg: int, k):
        return self.native.get_stored(kg, k)

    def put(self, kg: int, k, stored) -> None:
        self.native.put_stored(kg, k, stored)

    def remove(self, kg: int, k) -> None:
        self.native.remove_key(kg, k)

    def set_ttl_meta(self, ttl_meta) -> None:
        super().set_ttl_meta(ttl_meta)
        self._use_stored_format()  # the TTL suffix comes or goes with the setting

    # TTL cleanup passes run in C++ over the stored bytes (ttl.h cleanup_step); the cursor is
    # a key group and a bucket of its map (StateMap::collect_buckets survives rehashes).
    def ttl_cleanup_step(self, kgs, min_entries: int, ttl_ms: int, now: int):
        kg, bucket = self._ttl_cursor or (kgs.start, 0)
        visited, expired, kg, bucket, wrapped = self.native.ttl_cleanup_table_step(
            kg, bucket, min_entries, self.kind, self.value_ser.fixed_width, ttl_ms, now)
        self._ttl_cursor = (kg, bucket)
        return visited, expired, wrapped

    def ttl_restamp(self, ts_from: int, ts_to: int) -> int:
        return self.native.ttl_restamp(self.kind, self.value_ser.fixed_width, ts_from, ts_to)

    def ttl_migrate(self, ttl_meta, ts: int, ttl_ms: int, now: int) -> int:
        """StateTable.ttl_migrate over the stored bytes, in C++ (ttl.h ``migrate``: all or
        nothing, copy-on-write aware). StateMigrationError, with the state unchanged, for a
        value whose layout is broken (bytes restored without decoding)."""
        try:
            _, _, expired = self.native.ttl_migrate(self.kind, self.value_ser.fixed_width,
                                                    ttl_meta is not None, ts, ttl_ms, now)
        except InvalidInputError as e:
            raise StateMigrationError(
                f"state {self.name!r}: TTL migration failed, the state is unchanged: {e}") from e
        self.set_ttl_meta(ttl_meta)
        return expired

    def ttl_cleanup_key_group(self, kg: int, ttl_ms: int, now: int) -> int:
        return self.native.ttl_cleanup_step(kg, 0, 2**62, self.kind, self.value_ser.fixed_width,
                                            ttl_ms, now)[1]


class NativeSnapshot:
    """StateSnapshot over native table snapshots (see ``base.StateSnapshot``).

    Taking it costs O(states x key groups); ``entries(name, kg)`` serializes one key group on
    demand, sorted by encoded key. ``release()`` is idempotent and lets the maps stop copying.
    """

    def __init__(self, backend: "NativeBackend", tables: dict, timer_data: dict,
                 snapshot_id: int = 0, incremental: bool = False):
        self.max_parallelism = backend.max_parallelism
        self.key_group_range = backend.key_group_range
        self.key_type = backend.key_type
        self.assigner = backend.assigner
        self.snapshot_id = snapshot_id
        self.incremental = incremental
        self.ttl_expired: dict = {}  # TTL cleanup counts since the previous snapshot
        self._metas = [dict(t.meta) for t in tables.values()] + [backend.timers.meta()]
        self._snaps = {name: t.native.snapshot() for name, t in tables.items()}
        # TTL full-snapshot cleanup: entries expired at snapshot time are left out when read.
        self._ttl_filters = {} if incremental else {
            name: f for name, t in tables.items()
            if (f := backend._full_snapshot_ttl_filter(t)) is not None}
        self._count_expired = backend._count_expired
        self._timers = timer_data
        self._released = False
        self._pins = 0  # background writes reading the snapshot
        self._release_requested = False

    def table_versions(self) -> dict:
        """``{state name: table version of this snapshot}`` (what completing it marks as base)."""
        return {name: s.version for name, s in self._snaps.items()}

    def state_metas(self) -> list[dict]:
        return copy.deepcopy(self._metas)

    def entries(self, state_name: str, key_group: int):
        """(keys, values) pa.binary arrays of one state and key group sorted by key bytes; empty
        for key groups outside the snapshot's range. Raises StateError after release,
        InvalidInputError for an unknown state or a key group outside [0, max_parallelism)."""
        if self._released:
            raise StateError("snapshot was released")
        if not 0 <= key_group < self.max_parallelism:
            raise InvalidInputError(
                f"key group {key_group} outside [0, {self.max_parallelism - 1}]")
        empty = (pa.array([], pa.binary()), pa.array([], pa.binary()))
        if state_name == TIMERS_STATE_NAME:
            return self._timers.get(key_group, empty)
        snap = self._snaps.get(state_name)
        if snap is None:
            raise InvalidInputError(f"snapshot has no state named {state_name!r}")
        if key_group not in self.key_group_range:
            return empty
        if self.incremental:
            return snap.changes(key_group, snap.base_version)
        filt = self._ttl_filters.get(state_name)
        if filt is None:
            return snap.entries(key_group)
        keys, values, n = snap.entries_ttl_filtered(key_group, *filt)
        self._count_expired("full_snapshot", n)
        return keys, values

    def release(self) -> None:
        """Idempotent. While an asynchronous checkpoint write reads this snapshot (see
        :meth:`pin_for_write`) the release is deferred until that write ends, because a map
        snapshot must not be released while another thread reads it."""
        if self._pins:
            self._release_requested = True
            return
        if not self._released:
            self._released = True
            for s in self._snaps.values():
                s.release()
            self._timers = {}

    # ---- what the asynchronous checkpoint writer needs (CheckpointStore.write_snapshot_async)
    def block_sources(self) -> list[tuple]:
        """Sources of ``statecore._native.SnapshotBlockSerializer``, one per state in
        :meth:`state_metas` order: ``(name, NativeTableSnapshot, incremental, base version,
        None, ttl filter or None)`` for native states (TTL full-snapshot cleanup runs in the
        serializer thread, the same ttl.h filter as :meth:`entries`), ``(name, None, False, 0,
        {kg: (keys, values)})`` for the timers. Raises StateError after release."""
        if self._released:
            raise StateError("snapshot was released")
        out = []
        for m in self._metas:
            name = m["name"]
            if name == TIMERS_STATE_NAME:
                out.append((name, None, False, 0, dict(self._timers)))
            else:
                s = self._snaps[name]
                out.append((name, s, self.incremental, s.base_version if self.incremental else 0,
                            None, self._ttl_filters.get(name)))
        return out

    def serializer_finished(self, stats: dict) -> None:
        """Called by the asynchronous writer once the file is written: counts what the
        serializer's TTL filters left out as ``full_snapshot`` cleanup."""
        if stats.get("ttl_expired"):
            self._count_expired("full_snapshot", stats["ttl_expired"])

    def pin_for_write(self):
        """Defer :meth:`release` while a background write reads the table snapshots; returns the
        function ending that (performs a release requested meanwhile). Raises StateError after
        release."""
        if self._released:
            raise StateError("snapshot was released")
        self._pins += 1
        done = []

        def unpin() -> None:
            if done:
                return
            done.append(True)
            self._pins -= 1
            if not self._pins and self._release_requested:
                self._release_requested = False
                self.release()

        return unpin


class NativeBackend(TableBackend):
    """Keyed state backend over the native engine (see module docstring; arguments as
    :class:`statecore.backends.base.KeyedStateBackend`)."""

    def _assign_key_group(self, key) -> int:
        fn = _native.spark_key_group if self.assigner == "spark" else _native.flink_key_group
        return fn(key, self.key_type, self.max_parallelism)

    def __init__(self, **options):
        super().__init__(**options)
        # snapshot id -> {state name: table version}, for ids newer than the base
        self._pending: dict[int, dict[str, int]] = {}
        r = self.key_group_range
        self._keys = _native.KeyEncoder(self.key_type, self.assigner, self.max_parallelism,
                                        r.start, r.end, str(r))
        # ``prefix | ser(current key)`` (KeyEncoder.encode), None while there is no current key
        # or the backend is closed. A new object per set_current_key: state objects compare it
        # by identity to know whether their cached encoded key (_NativeState) is current.
        self._ckey = None

    def set_current_key(self, key) -> None:
        """As :meth:`KeyedStateBackend.set_current_key`, validating the key and computing its
        key group once, in one native call."""
        self._check_open()
        self._current_key, self._current_key_group, self._ckey = self._keys.encode(key)
        if self._every_record_ttl:
            for table, cfg in self._every_record_ttl.values():
                self._ttl_accessed(table, cfg)

    def close(self) -> None:
        self._ckey = None
        super().close()

    def _batch_slots(self, state, keys, namespaces):
        # The native tables address entries by encoded key (see NativeTable).
        mp, ks, ns_ser = self.max_parallelism, self._key_ser, state._table.ns_ser
        return [(kg, S.encode_key(kg, mp, k, ks, ns, ns_ser))
                for kg, (k, ns) in super()._batch_slots(state, keys, namespaces)]

    def _new_table(self, meta: dict) -> NativeTable:
        return NativeTable(meta, self)

    # ------------------------------------------------------------------ snapshot / restore
    def snapshot(self, incremental: bool = False) -> NativeSnapshot:
        self._check_open()
        timer_data = self.timers.snapshot_all()
        sid = self._next_snapshot_id()
        snap = NativeSnapshot(self, self._tables, timer_data, sid,
                              self._snapshot_incremental(incremental))
        snap.ttl_expired = self._take_ttl_delta()
        self._pending[sid] = snap.table_versions()
        return snap

    def _complete_snapshot(self, snapshot_id: int) -> None:
        versions = self._pending.get(snapshot_id, {})
        for name, version in versions.items():
            self._tables[name].native.mark_base(version)
        # Older ids can no longer move the base.
        self._pending = {sid: v for sid, v in self._pending.items() if sid > snapshot_id}

    def restore(self, snapshot_like) -> None:
        """Load the snapshot's key groups inside this backend's range: entries are bulk-loaded as
        bytes (no decoding). Everything is validated and staged first, so a malformed snapshot
        raises (InvalidInputError / StateMigrationError / the reader's CorruptCheckpointError)
        and leaves the backend unchanged. A state registered with a TTL migration request whose
        snapshot has the other TTL setting is loaded into a private table, converted there in
        C++ and staged from it (one more copy of that state's entries)."""
        self._check_open()
        base.check_snapshot_compatible(self, snapshot_like)
        kgs = list(self.key_group_range.intersection(
            KeyGroupRange.of(snapshot_like.key_group_range)))
        staged = []
        migrated, expired = False, 0
        for meta in snapshot_like.state_metas():
            if meta["kind"] == "timers":
                continue
            table = self._table_for_restore(meta)
            migration = self._restore_migration(table, meta)
            src = table if migration is None else NativeTable(meta, self)
            staged.append((table, None, None, None))  # registers a state even without entries
            if migration is None and kgs and hasattr(snapshot_like, "entries_chunks"):
                staged.extend((table, _RANGE, keys, vals) for keys, vals in
                              self._range_parts(table, snapshot_like, kgs, tombstones=False))
                continue
            loaded = []
            for kg in kgs:
                keys, vals = snapshot_like.entries(meta["name"], kg)
                if len(keys):
                    self._check_entries(src, kg, keys, vals)
                    loaded.append((kg, keys, vals))
            if migration is not None:
                migrated = True
                for kg, keys, vals in loaded:
                    src.native.load(kg, keys, vals, self._prefix_width)
                expired += src.ttl_migrate(*migration)
                snap = src.native.snapshot()
                try:
                    loaded = [(kg, *snap.entries(kg)) for kg, _, _ in loaded]
                finally:
                    snap.release()
            staged.extend((table, kg, keys, vals) for kg, keys, vals in loaded if len(keys))
        timers = self.timers.stage_restore(snapshot_like)
        for table, kg, keys, vals in staged:
            self._tables.setdefault(table.name, table)
            if kg is _RANGE:
                table.native.load_range(keys, vals, self._prefix_width)
            elif kg is not None:
                table.native.load(kg, keys, vals, self._prefix_width)
        self.timers.apply_restore(timers)
        # The restored state is the base: the bulk load is not a change.
        self._contents_are_base()
        if migrated:
            self._migrated(expired)

    @property
    def _prefix_width(self) -> int:
        return len(S.key_group_prefix(0, self.max_parallelism))

    def _range_parts(self, table: NativeTable, reader, kgs: list, tombstones: bool) -> list:
        """``reader.entries_chunks`` of ``table``'s state over key groups ``kgs`` (consecutive,
        inside this backend's range), each ``(keys, values)`` pair checked in one native scan
        (:func:`statecore._native.check_entry_range`: what :meth:`_check_entries` checks per key
        group, and that the pairs are sorted by key group; NULL values are tombstones only with
        ``tombstones``). A partition read as a few large pairs instead of one per key group
        saves the per-call costs of every key group (a catch-up touches them all)."""
        lo, hi = kgs[0], kgs[-1]
        width = self._value_width(table)
        parts = []
        for keys, vals in reader.entries_chunks(table.name, lo, hi):
            try:
                err = _native.check_entry_range(keys, vals, lo, hi, self._prefix_width,
                                                -1 if width is None else width, tombstones)
            except InvalidInputError as exc:
                err = str(exc)
            if err is not None:
                raise InvalidInputError(f"state {table.name!r}, key groups {lo}..{hi}: {err}")
            parts.append((keys, vals))
        return parts

    def _stage_change_set(self, table: NativeTable, changes, kgs: list) -> list:
        if not kgs or not hasattr(changes, "entries_chunks"):
            return super()._stage_change_set(table, changes, kgs)
        return [(_RANGE, keys, vals, None)
                for keys, vals in self._range_parts(table, changes, kgs, tombstones=True)]

    def _stage_changes(self, table: NativeTable, kg: int, keys: pa.Array, vals: pa.Array):
        """A change set's entries of ``kg`` checked as :meth:`restore` checks them, split into
        ``(kg, live keys, live values, tombstoned keys or None)``, still as bytes."""
        gone = None
        if vals.null_count:
            dead = vals.is_null()
            live = pc.invert(dead)
            gone = keys.filter(dead)
            keys, vals = keys.filter(live), vals.filter(live)
            self._check_keys(table, kg, gone)
        if len(keys):
            self._check_entries(table, kg, keys, vals)
        return kg, keys, vals, gone

    def _apply_staged_changes(self, table: NativeTable, part) -> None:
        kg, keys, vals, gone = part
        if kg is _RANGE:
            table.native.load_range(keys, vals, self._prefix_width)
        elif len(keys):
            table.native.load(kg, keys, vals, self._prefix_width)
        if gone is not None:
            table.native.remove_keys(kg, gone)

    def _contents_are_base(self, applied_changes: bool = False) -> None:
        # The bulk load is not a change; snapshots issued before it can no longer move the base.
        for table in self._tables.values():
            table.native.rebase(applied_changes)
        self._pending.clear()
        self._restored_is_base()

    def _check_entries(self, table: NativeTable, kg: int, keys: pa.Array, vals: pa.Array) -> None:
        """Entries are loaded as bytes without decoding, so check what can be checked cheaply:
        no nulls, every encoded key longer than the key-group prefix and carrying the prefix of
        the key group it is listed under, and for fixed-width value/reducing states every value
        exactly that wide (plus the 8-byte timestamp with TTL). InvalidInputError names the
        state and key group otherwise."""
        name = table.name
        vals = vals.cast(pa.binary()) if vals.type != pa.binary() else vals
        n = len(keys)
        if len(vals) != n or vals.null_count:
            raise InvalidInputError(f"state {name!r}, key group {kg}: keys and values must be "
                                    "non-null and pair up")
        self._check_keys(table, kg, keys)
        width = self._value_width(table)
        if width is not None:
            voffs = np.frombuffer(vals.buffers()[1], np.int32)[vals.offset:vals.offset + n + 1]
            if np.any(np.diff(voffs) != width):
                raise InvalidInputError(
                    f"state {name!r}, key group {kg}: {table.value_ser.name} values must be "
                    f"{width} bytes")

    @staticmethod
    def _value_width(table: NativeTable):
        """Bytes of every stored value of a value/reducing state of a fixed-width type (the TTL
        timestamp suffix included), else None."""
        width = table.value_ser.fixed_width
        if width is None or table.kind not in ("value", "reducing"):
            return None
        return width + 8 if table.ttl else width

    def _check_keys(self, table: NativeTable, kg: int, keys: pa.Array) -> None:
        """The key half of :meth:`_check_entries`: non-null, longer than the key-group prefix,
        carrying the prefix of ``kg``."""
        name = table.name
        keys = keys.cast(pa.binary()) if keys.type != pa.binary() else keys
        w = len(S.key_group_prefix(kg, self.max_parallelism))
        n = len(keys)
        if keys.null_count:
            raise InvalidInputError(f"state {name!r}, key group {kg}: keys must be non-null")
        if n == 0:
            return
        offs = np.frombuffer(keys.buffers()[1], np.int32)[keys.offset:keys.offset + n + 1]
        if np.any(np.diff(offs) <= w):
            raise InvalidInputError(
                f"state {name!r}: an encoded key of key group {kg} is too short")
        data = np.frombuffer(keys.buffers()[2], np.uint8)
        starts = offs[:-1]
        got = data[starts].astype(np.int32) if w == 1 else \
            (data[starts].astype(np.int32) << 8) | data[starts + 1].astype(np.int32)
        if np.any(got != kg):
            raise InvalidInputError(
                f"state {name!r}: entries listed under key group {kg} carry another key-group "
                "prefix")

    # ------------------------------------------------------------------ accounting
    def num_entries(self) -> int:
        return sum(len(t.native) for t in self._tables.values())

    def state_bytes(self) -> int:
        return sum(t.native.nbytes for t in self._tables.values())

    def removal_log_sizes(self) -> dict:
        """``{state name: records in its maps' removal logs}`` (bounded by the removals since the
        last completed checkpoint)."""
        return {name: t.native.removal_log_size for name, t in self._tables.items()}

    def copy_on_write_stats(self) -> dict:
        """Copy-on-write counters of every state's maps (entry/page/directory copies, entries
        retired for live snapshots, maps in the middle of an incremental rehash)."""
        return {name: t.native.stats() for name, t in self._tables.items()}


# --------------------------------------------------------------------------- batch fast paths

_COUNT_KERNEL_TYPES = (pa.int64(), pa.float64(), pa.int32(), pa.uint64(), pa.bool_(), pa.string(),
                       pa.large_string(), pa.binary(), pa.large_binary())


def _count_kernel_ok(t: pa.DataType) -> bool:
    # The Count kernel reads only validity, of any flat type the native ArrayView parses.
    return t in _COUNT_KERNEL_TYPES or pa.types.is_timestamp(t) or pa.types.is_fixed_size_binary(t)


def _kernel_ok(state, namespaces) -> bool:
    # namespaces on a void state: the per-row path raises its error.
    return (state._ser.kind in _native.BATCH_VALUE_KINDS
            and (namespaces is None or state.namespace_type != "void"))


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
        return batch_namespace_array(namespaces, ns_type, length)
    ns = (state._require_namespace() if namespaces is None
          else S.key_serializer(ns_type).check(namespaces))
    return pa.repeat(pa.scalar(ns, state._ns_ser.key_type.arrow_type), length)


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
    read in place (see _kernel_chunks)."""
    return coerce_key_array(keys, state.backend.key_type, combine=False)


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

    def _ttl_args(self, rows: int):
        """The kernels' ``ttl`` argument: None here; TTL states override it (_TtlKernel)."""
        return None

    def get_batch(self, keys, namespaces=None) -> pa.Array:
        if not _kernel_ok(self, namespaces):
            return super().get_batch(keys, namespaces)
        b = self.backend
        b._check_open()
        arr = _key_array(self, keys)
        ns = _ns_column(self, namespaces, len(arr))
        ttl = self._ttl_args(len(arr))
        (kc,) = _keyed_chunks(arr, ns)
        out = self._table.native.get_batch(kc, b.key_type, b.assigner, b.max_parallelism,
                                           self._ser.name, ttl=ttl,
                                           count_expired=_count_read(b) if ttl else None,
                                           namespace_type=self.namespace_type)
        return _cast_out(out, self._ser)


class _KernelClear:
    """clear_batch through the clear kernel (batch_reads.h), any namespace: it only removes
    entries, so every state kind and value type (pickle included) is served. Counts one TTL
    access per row first, as the per-row path's ``_batch_slots``."""

    def clear_batch(self, keys, namespaces=None) -> None:
        if namespaces is not None and self.namespace_type == "void":
            return super().clear_batch(keys, namespaces)  # its error
        b = self.backend
        b._check_open()
        arr = _key_array(self, keys)
        ns = _ns_column(self, namespaces, len(arr))
        cfg = self.descriptor.ttl_config
        if cfg is not None:
            b._ttl_accessed(self._table, cfg, len(arr))
        (kc,) = _keyed_chunks(arr, ns)
        self._table.native.clear_batch(kc, b.key_type,
                                       b.assigner, b.max_parallelism,
                                       namespace_type=self.namespace_type)


_STALE = object()  # a _NativeState cache that matches no current key


class _NativeState(states.TableState):
    """Per-record slots of native states: ``(key group, encoded key)``, cached per state object
    for the backend's current key (``NativeBackend._ckey``, compared by identity) and the
    state's current namespace, so that repeated accesses for one record encode nothing.
    set_current_key, set_current_namespace and close invalidate it; the encoded key depends on
    nothing else (restore, clear and snapshots leave it valid)."""

    _ck = _STALE  # the backend's _ckey the cached slot was built for
    _cslot = None
    _ns_part = b"\x00"  # ser(namespace) [| len bytes] of the current namespace (void: 00)

    def __init__(self, *a):
        super().__init__(*a)
        # Encoded keys carry length bytes when both key and namespace are variable-width.
        self._ambiguous = (self.backend._key_ser.fixed_width is None
                           and self._ns_ser.fixed_width is None)

    def set_current_namespace(self, namespace) -> None:
        old = self._namespace
        super().set_current_namespace(namespace)
        if type(self._namespace) is type(old) and self._namespace == old:
            # Equal canonical namespaces of one type serialize alike: the cached slot holds
            # (operators often set the same namespace for every record).
            return
        kt = self._ns_ser.key_type  # None for void
        ns = b"\x00" if kt is None else kt.serialize_checked(self._namespace)
        if self._ambiguous:
            ns += S.len_bytes(len(ns))
        self._ns_part = ns
        self._ck = _STALE

    def _slot(self):
        if self._row_slot is not None:
            return self._row_slot
        if self._ck is self.backend._ckey:
            return self._cslot
        b = self.backend
        b._check_open()
        _, kg = b._require_key()
        self._require_namespace()
        ck = b._ckey
        if self._ambiguous:
            e = ck + S.len_bytes(len(ck) - b._keys.prefix_width) + self._ns_part
        else:
            e = ck + self._ns_part
        self._cslot = (kg, e)
        self._ck = ck
        return self._cslot


class _FastValue(_KernelClear, _KernelGet, states.TableValueState, _NativeState):
    def put_batch(self, keys, values, namespaces=None) -> None:
        if not _kernel_ok(self, namespaces):
            return super().put_batch(keys, values, namespaces)
        b = self.backend
        b._check_open()
        arr = _key_array(self, keys)
        vals = coerce_value_array(values, self._ser.name, len(arr), combine=False)
        ns = _ns_column(self, namespaces, len(arr))
        kc, vc = _keyed_chunks(arr, ns, vals)
        self._table.native.put_batch(kc, vc, b.key_type, b.assigner, b.max_parallelism,
                                     self._ser.name, ttl=self._ttl_args(len(arr)),
                                     namespace_type=self.namespace_type)


def _reducer_kernel_ok(state, namespaces) -> bool:
    # Every fixed-width type has kernels for the reducers its descriptor allows.
    return (_kernel_ok(state, namespaces)
            and state.descriptor.reducer.name in _native.BATCH_REDUCERS
            and state._ser.fixed_width is not None)


class _FastReducing(_KernelClear, _KernelGet, states.TableReducingState, _NativeState):
    def add_batch(self, keys, values, namespaces=None) -> pa.Array:
        if not _reducer_kernel_ok(self, namespaces):
            return super().add_batch(keys, values, namespaces)
        b = self.backend
        b._check_open()
        arr = _key_array(self, keys)
        is_count = self.descriptor.reducer.name == "count"
        vals = coerce_value_array(values, self._ser.name, len(arr), any_type=is_count,
                                       combine=False)
        if is_count and not _count_kernel_ok(vals.type):
            return super().add_batch(arr, vals, namespaces)
        ns = _ns_column(self, namespaces, len(arr))
        ttl = self._ttl_args(len(arr))
        # An integer sum's overflow rollback covers one kernel call: its batch is one chunk.
        kc, vc = _keyed_chunks(arr, ns, vals, single=self.descriptor.reducer.name == "sum"
                               and self._ser.name in ("int64", "int32", "uint64"))
        out = self._table.native.add_batch(kc, vc, b.key_type, b.assigner, b.max_parallelism,
                                           self._ser.name, self.descriptor.reducer.name, ttl=ttl,
                                           count_expired=_count_read(b) if ttl else None,
                                           namespace_type=self.namespace_type)
        return _cast_out(out, self._ser)


def _list_values(state, values, length: int):
    """append_batch values checked as the per-row path checks them
    (``TableListState.append_batch``: the element type's Arrow type or a list of it, ``length``
    rows, no null element), as
    ``(elements, parents)``: a flat array of one element a row with ``parents`` None, or a
    list array's elements (null rows hold none) with ``parents`` the row of each element.
    InvalidInputError otherwise."""
    t = state._typed("append_batch")
    name = state._ser.name

    def is_list(typ):
        return pa.types.is_list(typ) or pa.types.is_large_list(typ)

    vals = import_arrow(values, "values", lambda typ: arrow_type_ok(name, typ) or (
        is_list(typ) and arrow_type_ok(name, typ.value_type)))
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
        return elements, pa.array(np.repeat(np.arange(len(vals)), lengths))
    check_arrow_type(vals, name, f"values (or a list<{t}> array)")
    if vals.null_count:
        raise InvalidInputError(f"values contain {vals.null_count} null(s); list state elements "
                                "must not be null")
    return vals, None


class _NativeList(_KernelClear, states.TableListState, _NativeState):
    def _ttl_args(self, rows: int):
        return None  # TTL lists override it (_TtlKernel)

    def append_batch(self, keys, values, namespaces=None) -> None:
        """The list kernel (batch_collections.h) for the void namespace and every typed element
        type; a list<T> array is flattened first (its elements in row order, each row's
        elements after the previous row's: appending them one by one gives what one add_all per
        row gives, all rows sharing the batch's one clock reading under TTL). Else the
        per-row path."""
        if not _kernel_ok(self, namespaces):
            return super().append_batch(keys, values, namespaces)
        b = self.backend
        b._check_open()
        arr = _key_array(self, keys)
        rows = len(arr)
        elements, parents = _list_values(self, values, rows)
        ns = _ns_column(self, namespaces, rows)
        if parents is not None:
            arr = combined(arr).take(parents)
            ns = None if ns is None else combined(ns).take(parents)
        kc, vc = _keyed_chunks(arr, ns, elements)
        self._table.native.append_batch(kc, vc, b.key_type, b.assigner, b.max_parallelism,
                                        self._ser.name, ttl=self._ttl_args(rows),
                                        namespace_type=self.namespace_type)

    def get_batch(self, keys, namespaces=None) -> pa.Array:
        """The list read kernel (batch_reads.h) for any namespace and every typed element
        type: a ``list<T>`` array, one row per key, ``[]`` for an absent key (as ``get()``);
        under TTL expired elements are dropped, removed and counted as ``TtlListState.get``.
        Else the per-row path."""
        if not _kernel_ok(self, namespaces):
            return super().get_batch(keys, namespaces)
        b = self.backend
        b._check_open()
        arr = _key_array(self, keys)
        ns = _ns_column(self, namespaces, len(arr))
        ttl = self._ttl_args(len(arr))
        (kc,) = _keyed_chunks(arr, ns)
        return self._table.native.list_get_batch(
            kc, b.key_type, b.assigner, b.max_parallelism, self._ser.name, ttl=ttl,
            count_expired=_count_read(b) if ttl else None, namespace_type=self.namespace_type)


def _map_kernel_ok(state, namespaces) -> bool:
    return _kernel_ok(state, namespaces) and state._uks.name != "pickle"


def _map_user_keys(state, user_keys, length: int):
    """The user keys of a map batch checked as the per-row path checks them
    (``TableMapState._user_keys``: the user key type's Arrow type, ``length`` rows, no nulls), as
    imported (pa.Array or pa.ChunkedArray); InvalidInputError otherwise."""
    uk_name = state._uks.name
    uks = import_arrow(user_keys, "user_keys", lambda t: arrow_type_ok(uk_name, t))
    if len(uks) != length:
        raise InvalidInputError(f"user_keys have {len(uks)} rows but keys have {length}")
    check_arrow_type(uks, uk_name, "user_keys")
    if uks.null_count:
        raise InvalidInputError(f"user_keys contain {uks.null_count} null(s); map user keys "
                                "must not be null")
    return uks


class _NativeMap(_KernelClear, states.TableMapState, _NativeState):
    def _ttl_args(self, rows: int):
        return None  # TTL maps override it (_TtlKernel)

    def put_batch(self, keys, user_keys, values, namespaces=None) -> None:
        """The map kernel (batch_collections.h) for the void namespace, typed user keys and
        typed values; else the per-row path. Checks as ``TableMapState.put_batch``: user keys of
        the user key type's Arrow type, no null user key or value, equal lengths."""
        if not _map_kernel_ok(self, namespaces):
            return super().put_batch(keys, user_keys, values, namespaces)
        b = self.backend
        b._check_open()
        self._typed("put_batch")
        arr = _key_array(self, keys)
        uk_name = self._uks.name
        uks = _map_user_keys(self, user_keys, len(arr))
        vals = coerce_value_array(values, self._ser.name, len(arr), combine=False)
        if vals.null_count:
            raise InvalidInputError(f"values contain {vals.null_count} null(s); use remove_batch "
                                    "to remove user keys")
        ns = _ns_column(self, namespaces, len(arr))
        kc, uc, vc = _keyed_chunks(arr, ns, uks, vals)
        self._table.native.map_put_batch(kc, uc, vc, b.key_type, b.assigner, b.max_parallelism,
                                         uk_name, self._ser.name, ttl=self._ttl_args(len(arr)),
                                         namespace_type=self.namespace_type)

    def _read_kernel(self, method: str, keys, user_keys, namespaces):
        # get_batch / contains_batch through the map read kernels (see get_batch).
        b = self.backend
        b._check_open()
        self._typed(method)
        arr = _key_array(self, keys)
        uks = _map_user_keys(self, user_keys, len(arr))
        ns = _ns_column(self, namespaces, len(arr))
        ttl = self._ttl_args(len(arr))
        kc, uc = _keyed_chunks(arr, ns, uks)
        fn = getattr(self._table.native, "map_" + method)
        return fn(kc, uc, b.key_type, b.assigner,
                  b.max_parallelism, self._uks.name, self._ser.name, ttl=ttl,
                  count_expired=_count_read(b) if ttl else None, namespace_type=self.namespace_type)

    def get_batch(self, keys, user_keys, namespaces=None) -> pa.Array:
        """The map read kernel (batch_reads.h) for any namespace, typed user keys and
        values: the value of each (key, user key), null where absent; under TTL as
        ``TtlMapState.get`` (an expired pair removed and counted, shown once under
        return_expired, renewed under update_on_read). Else the per-row path."""
        if not _map_kernel_ok(self, namespaces):
            return super().get_batch(keys, user_keys, namespaces)
        return _cast_out(self._read_kernel("get_batch", keys, user_keys, namespaces), self._ser)

    def contains_batch(self, keys, user_keys, namespaces=None) -> pa.Array:
        """As get_batch (the same reads, TTL effects included), a bool array: true where a
        value is shown."""
        if not _map_kernel_ok(self, namespaces):
            return super().contains_batch(keys, user_keys, namespaces)
        return self._read_kernel("contains_batch", keys, user_keys, namespaces)

    def remove_batch(self, keys, user_keys, namespaces=None) -> None:
        """The map removal kernel (batch_reads.h): removes each (key, user key) in row order,
        a map left empty is removed; with TTL nothing is read or counted (as ``remove``)."""
        # Value bytes are skipped, not decoded: any value type, pickle included.
        if ((namespaces is not None and self.namespace_type == "void")
                or self._uks.name == "pickle"):
            return super().remove_batch(keys, user_keys, namespaces)
        b = self.backend
        b._check_open()
        arr = _key_array(self, keys)
        uks = _map_user_keys(self, user_keys, len(arr))
        ns = _ns_column(self, namespaces, len(arr))
        self._ttl_args(len(arr))  # the TTL accesses of the rows (the kernel reads no timestamp)
        kc, uc = _keyed_chunks(arr, ns, uks)
        self._table.native.map_remove_batch(kc, uc, b.key_type, b.assigner, b.max_parallelism,
                                            self._uks.name, namespace_type=self.namespace_type)


class _NativeAggregating(_KernelClear, states.TableAggregatingState, _NativeState):
    pass


NativeBackend.state_classes = dict(value=_FastValue, list=_NativeList, map=_NativeMap,
                                   reducing=_FastReducing, aggregating=_NativeAggregating)


# TTL-enabled states: ttl_states.py's classes (per-record calls and the batch calls
# the kernels do not serve) with the batch calls the kernels serve run natively, TTL on. The
# clock is read once per batch (ttl_now, ms): the Python path stamps its writes with one reading
# too, and re-reads it per present row for expiry decisions, which is the same reading unless the
# clock moves during the call.

class _TtlKernel:
    """The kernels run with TTL on: the incremental cleanup step of the batch's rows first (one
    access per row, as the Python path), then ``ttl = (ttl_ms, now, update_on_read,
    return_expired)``; expired entries the kernels remove are counted as ``read``. On an int64
    sum overflow the aggregates are unchanged while expired entries removed by earlier null
    rows stay removed (and counted), as in ``TtlReducingState.add_batch``."""

    def _ttl_args(self, rows: int):
        self.backend._ttl_accessed(self._table, self._cfg, rows)
        return _ttl_kernel_args(self)


def _ttl_kernel_args(state) -> tuple:
    cfg = state._cfg
    return (cfg.ttl_ms, state.backend.ttl_now(cfg), cfg.update_on_read, cfg.return_expired)


def _count_read(backend):
    return lambda n: backend._count_expired("read", n)


# MRO: the kernel methods first; their fallbacks (super()) reach ttl_states' Python TTL paths.
class _NativeTtlValue(_TtlKernel, _FastValue, ttl_states.TtlValueState):
    pass


class _NativeTtlReducing(_TtlKernel, _FastReducing, ttl_states.TtlReducingState):
    pass


class _NativeTtlList(_TtlKernel, _NativeList, ttl_states.TtlListState):
    pass


class _NativeTtlMap(_TtlKernel, _NativeMap, ttl_states.TtlMapState):
    pass


class _NativeTtlAggregating(_KernelClear, ttl_states.TtlAggregatingState, _NativeState):
    pass


NativeBackend.ttl_state_classes = dict(value=_NativeTtlValue, list=_NativeTtlList,
                                       map=_NativeTtlMap, reducing=_NativeTtlReducing,
                                       aggregating=_NativeTtlAggregating)

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
object caches its encoded key for the current key and its current namespace
(:class:`statecore.backends.native_states.NativeState`); stored values of every state kind are
converted in Cython (``NativeStateTable.get_stored`` / ``put_stored``).

What differs is where the bytes live and the batch paths: the state classes of
:mod:`statecore.backends.native_states` run most batch calls as C++ kernels over the Arrow
buffers, with the GIL released (that module's docstring lists what runs as a kernel and what
falls back to the per-row path, which behaves identically).

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
import os
from threading import get_ident

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statecore import _native
from statecore import serializers as S
from statecore.backends import base, native_states, states
from statecore.backends.table_backend import TableBackend
from statecore.errors import InvalidInputError, StateError, StateMigrationError
from statecore.key_groups import KeyGroupRange
from statecore.operator_state import is_operator_state_meta
from statecore.timers import TIMERS_STATE_NAME
from statecore.ttl import entry_layout

__all__ = ["NativeBackend", "NativeSnapshot", "NativeTable"]


#: Marks a staged part that spans several key groups (``NativeStateTable.load_range``).
_RANGE = object()

#: Decoded bytes per chunk of a restore loaded as it is decoded (``run_chunks``' ``max_bytes``):
#: the decode buffers of a chunk and of the one before it (its runs' keys, values and offsets,
#: about three times this) stay within what statecore.buffer_pool keeps for reuse, so a
#: restore rewrites the same mapped memory instead of faulting in fresh pages for every run.
_STREAM_CHUNK_BYTES = 8 << 20

#: Decoded bytes per chunk of a restore whose blocks load without decoding to arrays
#: (``run_blocks``' ``max_bytes``): a chunk costs one ranged read (into reused memory,
#: statecore.buffer_pool) and one native call per run, and only its stored bytes are held.
_RUN_BLOCK_BYTES = 32 << 20

#: Threads loading one chunk of stored blocks of a remote store's reader (its ``remote``;
#: ``_native.load_blocks``' ``threads``: slices of disjoint key groups loaded at once), and the
#: fewest stored bytes worth a thread of their own. The loading is a restore's largest CPU cost,
#: and what is left of it when the last piece arrives is the restore's tail. Twice the cores
#: used (at most two): on 2 cores four slices loaded a chunk faster than two (docs/deploy.md
#: "Checkpoints on object storage"). A local restore loads on its own thread: an executor's
#: other cores run other tasks.
_LOAD_THREADS = 2 * min(2, os.cpu_count() or 1)
_LOAD_SLICE_BYTES = 1 << 20


class NativeTable(states.StateTable):
    """The :class:`~statecore.backends.states.StateTable` interface over a native StateTable.

    ``get/put/remove(kg, k)`` take the encoded key as ``k`` (bytes: the native backend's slots,
    :meth:`NativeBackend.batch_slots` and ``NativeState._slot``) and take and return the
    reference backend's stored forms; bytes in the map are the encoded key and the serialized
    value.

    A map state's entries are ``prefix | ser(key) | ser(namespace) | ser(user key)`` -> the
    user value's bytes (docs/formats.md "Map state"); the map calls take ``k`` = the encoded
    key of the (key, namespace) and the user key's bytes. The index of each map's user keys
    (native collection_index.h, insertion ordered) is kept by the native map calls and map
    kernels, by the C++ TTL cleanup steps (they report the entries they remove), by restores
    and change sets (:meth:`index_loaded`, :meth:`index_removed`) and after a TTL migration
    (``index_prune``). With TTL it also tolerates an entry gone without notice (a cleanup step
    that failed part way): reads of a whole map (``map_items``) check each user key and unlist
    such ones, and a put of one moves it last, the order the reference backend's index gives.

    A list state's chunks are ``prefix | ser(key) | ser(namespace) | seq`` -> up to
    ``LIST_CHUNK_ELEMENTS`` elements in the list-blob layout (docs/formats.md "List state");
    the list calls take ``k`` and a chunk's sequence number. The index of each list's chunks
    (native list_index.h; a list of chunk 0 alone is not listed) is kept the same ways as the
    map index (list calls and kernels, TTL cleanup steps, restores and change sets,
    ``list_index_prune`` after a TTL migration); reads of a whole list unlist chunks gone
    without notice.
    """

    def __init__(self, meta: dict, backend: "NativeBackend"):
        super().__init__(meta)
        r = backend.key_group_range
        self.native = _native.NativeStateTable(r.start, r.end)
        self._ttl_cursor = None  # (key group, bucket) where the next cleanup step starts
        self.entry_kind = entry_layout(self.kind)
        if self.kind == "map":
            self.native.enable_map_index(backend.key_type, self.namespace_type,
                                         backend.max_parallelism)
        elif self.kind == "list":
            self.native.enable_list_index(backend.key_prefix_width)
        self._use_stored_format()

    def _use_stored_format(self) -> None:
        # Stored forms are converted in Cython (NativeStateTable.get_stored / put_stored, the
        # layouts of PythonTable.encode_value): the methods are bound on the instance so that an
        # access is one call into the extension, without a Python frame in between.
        self.native.set_value_format(self.entry_kind, self.value_ser.name, self.ttl)
        self.get = self.native.get_stored
        self.put = self.native.put_stored
        self.remove = self.native.remove_key
        if self.kind == "map":
            self.map_get = self.native.map_get
            self.map_put = self.native.map_put
            self.map_remove = self.native.map_remove
            self.map_items = self.native.map_items
            self.map_clear = self.native.map_clear
            if not self.ttl:
                self.map_size = self.native.map_size
            else:
                self.__dict__.pop("map_size", None)
        elif self.kind == "list":
            self.list_chunks = self.native.list_chunks
            self.list_append = self.native.list_append
            self.list_put_chunk = self.native.list_put_chunk
            self.list_size = self.native.list_size
            self.list_clear = self.native.list_clear

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

    # ---- map state (StateTable.map_get ...): the native map calls, entry key = k | user key
    # bytes; bound per instance in _use_stored_format.
    def map_get(self, kg: int, k: bytes, ukb: bytes):
        return self.native.map_get(kg, k, ukb)

    def map_put(self, kg: int, k: bytes, ukb: bytes, stored) -> None:
        self.native.map_put(kg, k, ukb, stored)

    def map_remove(self, kg: int, k: bytes, ukb: bytes) -> None:
        self.native.map_remove(kg, k, ukb)

    def map_items(self, kg: int, k: bytes) -> list:
        return self.native.map_items(kg, k)

    def map_size(self, kg: int, k: bytes) -> int:
        # With TTL count what is there (the index may list an entry gone without notice).
        return len(self.native.map_items(kg, k)) if self.ttl else self.native.map_size(kg, k)

    def map_clear(self, kg: int, k: bytes) -> None:
        self.native.map_clear(kg, k)

    # ---- list state (StateTable.list_chunks ...): the native list calls, chunk entry key =
    # k | seq (8 bytes big-endian); bound per instance in _use_stored_format.
    def list_chunks(self, kg: int, k: bytes) -> list:
        return self.native.list_chunks(kg, k)

    def list_append(self, kg: int, k: bytes, stored: list) -> None:
        self.native.list_append(kg, k, stored)

    def list_put_chunk(self, kg: int, k: bytes, seq: int, stored: list) -> None:
        self.native.list_put_chunk(kg, k, seq, stored)

    def list_size(self, kg: int, k: bytes) -> int:
        return self.native.list_size(kg, k)

    def list_clear(self, kg: int, k: bytes) -> None:
        self.native.list_clear(kg, k)

    def index_loaded(self, keys: pa.Array) -> None:
        """List the user keys of map entries / the chunks of list entries just loaded
        (encoded entry keys, sorted): a new user key goes last in its map, a present one keeps
        its place; a chunk takes its place by sequence number. No-op for other kinds."""
        if self.kind == "map" and len(keys):
            self.native.index_entry_keys(keys, True)
        elif self.kind == "list" and len(keys):
            self.native.list_index_entry_keys(keys, True)

    def index_removed(self, keys: pa.Array) -> None:
        """Unlist the user keys of removed map entries / removed list chunks (encoded entry
        keys)."""
        if self.kind == "map" and len(keys):
            self.native.index_entry_keys(keys, False)
        elif self.kind == "list" and len(keys):
            self.native.list_index_entry_keys(keys, False)

    # TTL cleanup passes run in C++ over the stored bytes (ttl.h cleanup_step); the cursor is
    # a key group and a bucket of its map (StateMap::collect_buckets survives rehashes).
    def ttl_cleanup_step(self, kgs, min_entries: int, ttl_ms: int, now: int, steps: int = 1):
        kg, bucket = self._ttl_cursor or (kgs.start, 0)
        visited, expired, kg, bucket, wrapped = self.native.ttl_cleanup_table_step(
            kg, bucket, min_entries, self.entry_kind, self.value_ser.fixed_width, ttl_ms, now,
            steps)
        self._ttl_cursor = (kg, bucket)
        return visited, expired, wrapped

    def kernel_cleanup(self, kgs, min_entries: int, steps_per_row: int, ttl_ms: int, now: int,
                       on_expired):
        """The ``cleanup`` argument of a batch kernel (NativeStateTable._cleanup_begin):
        ``steps_per_row`` steps of :meth:`ttl_cleanup_step` before each row, from and back to
        this table's cursor over the key groups ``kgs``; ``on_expired(n)`` receives the
        expired things they removed (n > 0) when the kernel call ends."""
        return _KernelCleanup(self, kgs, min_entries, steps_per_row, ttl_ms, now, on_expired)

    def ttl_restamp(self, ts_from: int, ts_to: int) -> int:
        return self.native.ttl_restamp(self.entry_kind, self.value_ser.fixed_width, ts_from,
                                       ts_to)

    def ttl_migrate(self, ttl_meta, ts: int, ttl_ms: int, now: int) -> int:
        """StateTable.ttl_migrate over the stored bytes, in C++ (ttl.h ``migrate``: all or
        nothing, copy-on-write aware). StateMigrationError, with the state unchanged, for a
        value whose layout is broken (bytes restored without decoding)."""
        try:
            _, _, expired = self.native.ttl_migrate(self.entry_kind, self.value_ser.fixed_width,
                                                    ttl_meta is not None, ts, ttl_ms, now)
        except InvalidInputError as e:
            raise StateMigrationError(
                f"state {self.name!r}: TTL migration failed, the state is unchanged: {e}") from e
        self.set_ttl_meta(ttl_meta)
        if expired and self.kind == "map":
            self.native.index_prune()
        elif expired and self.kind == "list":
            self.native.list_index_prune()
        return expired

    def ttl_cleanup_key_group(self, kg: int, ttl_ms: int, now: int) -> int:
        return self.native.ttl_cleanup_step(kg, 0, 2**62, self.entry_kind,
                                            self.value_ser.fixed_width, ttl_ms, now)[1]


class _KernelCleanup:
    """NativeTable.kernel_cleanup: what a kernel call's incremental cleanup starts from
    (``start()``) and ends with (``end(key group, bucket, expired)``)."""

    __slots__ = ("table", "args", "on_expired")

    def __init__(self, table, kgs, min_entries, steps_per_row, ttl_ms, now, on_expired):
        self.table = table
        kg, bucket = table._ttl_cursor or (kgs.start, 0)
        self.args = (kg, bucket, min_entries, steps_per_row, table.entry_kind,
                     table.value_ser.fixed_width, ttl_ms, now)
        self.on_expired = on_expired

    def start(self):
        return self.args

    def end(self, kg: int, bucket: int, expired: int) -> None:
        self.table._ttl_cursor = (kg, bucket)
        if expired:
            self.on_expired(expired)


class NativeSnapshot:
    """StateSnapshot over native table snapshots (see ``base.StateSnapshot``).

    Taking it costs O(states x key groups); ``entries(name, kg)`` serializes one key group on
    demand, sorted by encoded key. ``release()`` is idempotent and lets the maps stop copying.
    """

    def __init__(self, backend: "NativeBackend", tables: dict, timer_data: dict,
                 snapshot_id: int = 0, incremental: bool = False,
                 operator_data: dict | None = None):
        self.max_parallelism = backend.max_parallelism
        self.key_group_range = backend.key_group_range
        self.key_type = backend.key_type
        self.assigner = backend.assigner
        self.snapshot_id = snapshot_id
        self.incremental = incremental
        self.ttl_expired: dict = {}  # TTL cleanup counts since the previous snapshot
        op_metas = backend.operator_state.metas()
        self._metas = ([dict(t.meta) for t in tables.values()] + [backend.timers.meta()]
                       + op_metas)
        self._snaps = {name: t.native.snapshot() for name, t in tables.items()}
        # TTL full-snapshot cleanup: entries expired at snapshot time are left out when read.
        self._ttl_filters = {} if incremental else {
            name: f for name, t in tables.items()
            if (f := backend.full_snapshot_ttl_filter(t)) is not None}
        self._count_expired = backend.count_expired
        # The pseudo-states held in Python ({name: {kg: (keys, values)}}): the timers and the
        # operator states, both complete in every snapshot.
        self._python_data = {TIMERS_STATE_NAME: timer_data,
                             **{m["name"]: (operator_data or {}).get(m["name"], {})
                                for m in op_metas}}
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
        held = self._python_data.get(state_name)
        if held is not None:
            return held.get(key_group, empty)
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

    def changes_since_base(self, state_name: str, key_group: int):
        """(keys, values) ``pa.binary()`` arrays of a keyed state's changes in ``key_group``
        since its map's change-tracking base when the snapshot was taken, sorted by key bytes,
        a removed key as a NULL value (tombstone) -- whether the snapshot is incremental or
        not. StateError after release, InvalidInputError for an unknown keyed state or a key
        group outside the snapshot's range."""
        if self._released:
            raise StateError("snapshot was released")
        snap = self._snaps.get(state_name)
        if snap is None:
            raise InvalidInputError(f"snapshot has no keyed state named {state_name!r}")
        if key_group not in self.key_group_range:
            raise InvalidInputError(
                f"key group {key_group} outside the snapshot's range {self.key_group_range}")
        return snap.changes(key_group, snap.base_version)

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
            self._python_data = {n: {} for n in self._python_data}

    # ---- what the asynchronous checkpoint writer needs (CheckpointStore.write_snapshot_async)
    def block_sources(self) -> list[tuple]:
        """Sources of ``statecore._native.SnapshotBlockSerializer``, one per state in
        :meth:`state_metas` order: ``(name, NativeTableSnapshot, incremental, base version,
        None, ttl filter or None)`` for native states (TTL full-snapshot cleanup runs in the
        serializer thread, the same ttl.h filter as :meth:`entries`), ``(name, None, False, 0,
        {kg: (keys, values)})`` for the timers and operator states. Raises StateError after
        release."""
        if self._released:
            raise StateError("snapshot was released")
        out = []
        for m in self._metas:
            name = m["name"]
            if name in self._python_data:
                out.append((name, None, False, 0, dict(self._python_data[name])))
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
    :class:`statecore.backends.base.KeyedStateBackend`).

    Besides what every :class:`~statecore.backends.table_backend.TableBackend` offers its
    states, the native state objects (:mod:`statecore.backends.native_states`) read two plain
    attributes: ``encoded_current_key`` (``prefix | ser(current key)`` as bytes, a new object
    per :meth:`set_current_key`, so a state compares it by identity to know whether its cached
    slot is current; None while there is no current key or the backend is closed) and
    ``key_prefix_width`` (bytes of the key-group prefix: 1 up to max_parallelism 128, else 2).
    """

    state_classes = native_states.STATE_CLASSES
    ttl_state_classes = native_states.TTL_STATE_CLASSES

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
        self.key_prefix_width = self._keys.prefix_width
        # KeyEncoder.encode's bytes for the current key (class docstring).
        self.encoded_current_key = None

    def set_current_key(self, key) -> None:
        """As :meth:`KeyedStateBackend.set_current_key`, validating the key and computing its
        key group once, in one native call."""
        self.check_open()
        self._current_key, self._current_key_group, self.encoded_current_key = \
            self._keys.encode(key)
        self.current_key_thread = get_ident()
        if self._every_record_ttl:
            for table, cfg in self._every_record_ttl.values():
                self.ttl_state_accessed(table, cfg)

    def dispose(self) -> None:
        self.encoded_current_key = None
        super().dispose()

    def _clear_current_key(self) -> None:
        super()._clear_current_key()
        self.encoded_current_key = None

    def batch_slots(self, state, keys, namespaces):
        # The native tables address entries by encoded key (see NativeTable).
        mp, ks, ns_ser = self.max_parallelism, self.key_serializer, state.table.ns_ser
        return [(kg, S.encode_key(kg, mp, k, ks, ns, ns_ser))
                for kg, (k, ns) in super().batch_slots(state, keys, namespaces)]

    def _new_table(self, meta: dict) -> NativeTable:
        return NativeTable(meta, self)

    # ------------------------------------------------------------------ snapshot / restore
    def snapshot(self, incremental: bool = False) -> NativeSnapshot:
        self.check_open()
        op_data = self.operator_state.snapshot_data(self.key_group_range, self.max_parallelism)
        timer_data = self.timers.snapshot_all()
        sid = self._next_snapshot_id()
        snap = NativeSnapshot(self, self._tables, timer_data, sid,
                              self._snapshot_incremental(incremental), operator_data=op_data)
        snap.ttl_expired = self._take_ttl_delta()
        snap.base_version = self.base_version if snap.incremental else None
        snap.base_commit_id = self.base_commit_id if snap.incremental else None
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
        self.check_open()
        base.check_snapshot_compatible(self, snapshot_like)
        kgs = list(self.key_group_range.intersection(
            KeyGroupRange.of(snapshot_like.key_group_range)))
        staged = []
        migrated, expired = False, 0
        for meta in snapshot_like.state_metas():
            if meta["kind"] == "timers" or is_operator_state_meta(meta):
                continue  # not keyed state: the timer service / operator_state restore them
            table = self._table_for_restore(meta)
            migration = self._restore_migration(table, meta)
            src = table if migration is None else NativeTable(meta, self)
            staged.append((table, None, None, None))  # registers a state even without entries
            if (migration is None and kgs and table.kind not in ("map", "list")
                    and hasattr(snapshot_like, "run_chunks")):
                # The oldest run loads into empty maps and each newer one is upserted (its
                # tombstones removing) over it: no merge of the runs first. Map and list
                # states take the merged path: their index lists keys in the order the
                # merged entries give.
                if (self._tables.get(table.name) is not table
                        and hasattr(snapshot_like, "run_blocks")):
                    # A new table, registered only once everything is staged: each run's
                    # blocks decoded and inserted in one native call per chunk, no arrays in
                    # between (an error discards the table, the backend stays unchanged).
                    self._load_run_blocks(table, snapshot_like, kgs)
                    continue
                if self._tables.get(table.name) is not table:
                    # A new table, registered only once everything is staged: loaded chunk by
                    # chunk as it is decoded (an error discards the table, the backend stays
                    # unchanged). Small chunks reuse their decode buffers instead of holding
                    # the whole run as Arrow arrays in fresh memory.
                    for parts in snapshot_like.run_chunks(table.name, kgs[0], kgs[-1],
                                                          _STREAM_CHUNK_BYTES):
                        for keys, vals in self._checked_parts(table, parts, kgs,
                                                              tombstones=True):
                            table.native.load_range(keys, vals, self.key_prefix_width)
                    continue
                pairs = (p for parts in snapshot_like.run_chunks(table.name, kgs[0], kgs[-1])
                         for p in parts)
                staged.extend((table, _RANGE, keys, vals) for keys, vals in
                              self._checked_parts(table, pairs, kgs, tombstones=True))
                continue
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
                    src.native.load(kg, keys, vals, self.key_prefix_width)
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
                table.native.load_range(keys, vals, self.key_prefix_width)
            elif kg is not None:
                table.native.load(kg, keys, vals, self.key_prefix_width)
            if kg is not None:
                table.index_loaded(keys)
        self.timers.apply_restore(timers)
        # The restored state is the base: the bulk load is not a change.
        self._contents_are_base(version=base.checkpoint_version(snapshot_like),
                                commit_id=base.checkpoint_commit_id(snapshot_like))
        if migrated:
            self._migrated(expired)

    def _load_run_blocks(self, table: NativeTable, reader, kgs: list) -> None:
        """Restore ``table``'s state over key groups ``kgs`` (consecutive, inside this
        backend's range) from ``reader.run_blocks`` into ``table``, a new table not yet
        registered: per chunk the oldest run's blocks into the (empty) maps, the newer runs'
        upserted over them, tombstones removing (:func:`statecore._native.load_blocks`, which
        checks what :meth:`_checked_parts` checks and that keys are strictly ascending within a
        key group). CorruptCheckpointError naming the file, state, key group and block for
        damaged blocks, InvalidInputError naming the state and key group for an entry that
        breaks the state's rules."""
        width = self._value_width(table)
        key_width = S.encoded_key_width(table.kind, self.key_serializer, table.ns_ser,
                                        self.max_parallelism)
        with _native.PagePrefault(self._table_bytes(reader, table.name, kgs, key_width, width)):
            self._load_blocks_of(table, reader, kgs, key_width, width)

    @staticmethod
    def _table_bytes(reader, name: str, kgs: list, key_width, width) -> int:
        """About the bytes of flat-map slots a restore of state ``name`` over key groups
        ``kgs`` fills (0 unless keys and values have fixed widths): per key group the table
        capacity its entries pre-size (the smallest power of two whose 3/4 holds them,
        StateMap::reserve) times the slot (docs/state-map.md "Flat engine": a 4-byte meta, the
        key without its first byte, the value)."""
        if key_width is None or width is None or not hasattr(reader, "key_group_entries"):
            return 0
        _, n = reader.key_group_entries(name, kgs[0], kgs[-1])
        n = n[n > 3]
        if not len(n):
            return 0
        cap = np.left_shift(1, np.ceil(np.log2(np.ceil(n * 4 / 3))).astype(np.int64))
        cap[(cap >> 1) + (cap >> 2) < n] <<= 1
        return int(cap.sum()) * (4 + key_width - 1 + width)

    def _load_blocks_of(self, table: NativeTable, reader, kgs: list, key_width, width) -> None:
        # Chunks in the order their bytes arrive (a remote prefetch), each its own key groups:
        # loading what arrived overlaps the download of the rest.
        threads = _LOAD_THREADS if getattr(reader, "remote", False) else 1
        for parts in reader.run_blocks(table.name, kgs[0], kgs[-1], _RUN_BLOCK_BYTES,
                                       as_fetched=True):
            for i, run in enumerate(parts):
                _, bad, why, corrupt = _native.load_blocks(
                    table.native, run.data, run.blocks, run.key_groups, run.base,
                    run.incremental, self.key_prefix_width,
                    -1 if key_width is None else key_width, -1 if width is None else width,
                    into_empty=i == 0, threads=threads,
                    min_slice_bytes=_LOAD_SLICE_BYTES,
                    # Slices already keep the cores busy; one slice opens blocks ahead.
                    open_ahead=threads <= 1)
                if bad is None:
                    continue
                if corrupt:
                    raise run.corrupt(bad, why)
                raise InvalidInputError(
                    f"state {table.name!r}, key group {run.key_group_of(bad)}: {why}")

    def _range_parts(self, table: NativeTable, reader, kgs: list, tombstones: bool) -> list:
        """``reader.entries_chunks`` of ``table``'s state over key groups ``kgs`` (consecutive,
        inside this backend's range), each ``(keys, values)`` pair checked in one native scan
        (:func:`statecore._native.check_entry_range`: what :meth:`_check_entries` checks per key
        group, and that the pairs are sorted by key group; NULL values are tombstones only with
        ``tombstones``). A partition read as a few large pairs instead of one per key group
        saves the per-call costs of every key group (a catch-up touches them all)."""
        return self._checked_parts(table, reader.entries_chunks(table.name, kgs[0], kgs[-1]),
                                   kgs, tombstones)

    def _checked_parts(self, table: NativeTable, pairs, kgs: list, tombstones: bool) -> list:
        """``(keys, values)`` pairs of ``table``'s state over key groups ``kgs`` (consecutive,
        inside this backend's range), each checked as :meth:`_range_parts` says; returned as a
        list. InvalidInputError naming the state and key groups for the first bad pair."""
        lo, hi = kgs[0], kgs[-1]
        width = self._value_width(table)
        parts = []
        for keys, vals in pairs:
            try:
                err = _native.check_entry_range(keys, vals, lo, hi, self.key_prefix_width,
                                                -1 if width is None else width, tombstones)
            except InvalidInputError as exc:
                err = str(exc)
            if err is not None:
                raise InvalidInputError(f"state {table.name!r}, key groups {lo}..{hi}: {err}")
            self._check_key_width(table, keys, f"key groups {lo}..{hi}")
            self._check_map_keys(table, keys)
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
            table.native.load_range(keys, vals, self.key_prefix_width)
            if table.kind in ("map", "list") and vals.null_count:
                dead = vals.is_null()
                gone = keys.filter(dead)
                keys = keys.filter(pc.invert(dead))
        elif len(keys):
            table.native.load(kg, keys, vals, self.key_prefix_width)
        if gone is not None and kg is not _RANGE:
            table.native.remove_keys(kg, gone)
        table.index_loaded(keys)
        if gone is not None:
            table.index_removed(gone)

    def _contents_are_base(self, applied_changes: bool = False, version=None,
                           commit_id=None) -> None:
        # The bulk load is not a change; snapshots issued before it can no longer move the base.
        for table in self._tables.values():
            table.native.rebase(applied_changes)
        self._pending.clear()
        self._restored_is_base(version, applied_changes, commit_id)

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
        self._check_key_width(table, keys, f"key group {kg}")
        width = self._value_width(table)
        if width is not None:
            voffs = np.frombuffer(vals.buffers()[1], np.int32)[vals.offset:vals.offset + n + 1]
            if np.any(np.diff(voffs) != width):
                raise InvalidInputError(
                    f"state {name!r}, key group {kg}: {table.value_ser.name} values must be "
                    f"{width} bytes")

    def _check_key_width(self, table: NativeTable, keys: pa.Array, where: str) -> None:
        """Every encoded key of a state whose keys have one width (key and namespace types
        fixed-width: serializers.encoded_key_width) must have it: the bulk load does not decode
        keys, and a truncated one would sit in the map as a key nothing can address or list.
        InvalidInputError naming the state and ``where`` otherwise."""
        kw = S.encoded_key_width(table.kind, self.key_serializer, table.ns_ser,
                                 self.max_parallelism)
        problem = None if kw is None else S.encoded_key_problem(keys, self.max_parallelism,
                                                                width=kw)
        if problem is not None:
            raise InvalidInputError(f"state {table.name!r}, {where}: {problem}")

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
        if keys.null_count:
            raise InvalidInputError(f"state {name!r}, key group {kg}: keys must be non-null")
        problem = S.encoded_key_problem(keys, self.max_parallelism, key_group=kg)
        if problem is not None:
            raise InvalidInputError(f"state {name!r}, key group {kg}: {problem}")
        self._check_map_keys(table, keys)

    def _check_map_keys(self, table: NativeTable, keys: pa.Array) -> None:
        """For a map state: every key parses as a map entry's (docs/formats.md "Map state"),
        as the index needs them, its user key exactly one serialized user key, as the Python
        restore decodes it (InvalidInputError naming the state, and the key group and reason
        for a user key, otherwise); for a list state: every key is longer than the key-group
        prefix and a sequence number, which is not 2**64 - 1 ("List state"; InvalidInputError
        naming the state otherwise)."""
        if table.kind == "list":
            if len(keys) and pc.min(pc.binary_length(keys)).as_py() <= (
                    self.key_prefix_width + S.LIST_SEQ_BYTES):
                raise InvalidInputError(
                    f"state {table.name!r}: a list chunk key holds no (key, namespace) part "
                    f"before its {S.LIST_SEQ_BYTES}-byte sequence number")
            if len(keys) and pc.any(pc.equal(
                    pc.binary_slice(keys, -S.LIST_SEQ_BYTES),
                    pa.scalar(S.MAX_LIST_SEQ_BYTES, pa.binary()))).as_py():
                raise InvalidInputError(
                    f"state {table.name!r}: a list chunk key ends in sequence number 2**64 - 1, "
                    "which no list reaches")
            return
        if table.kind != "map":
            return
        try:
            table.native.check_entry_keys(keys, table.user_key_ser.name)
        except InvalidInputError as exc:
            raise InvalidInputError(f"state {table.name!r}: {exc}") from exc

    def _key_namespaces(self, state_name: str, kgs: KeyGroupRange):
        # The entries are read from one map snapshot of the table (the keys are collected
        # before anyone writes), taken only when a key group of the range holds entries.
        table = self._tables[state_name]
        native, mp, ks, ns_ser = table.native, self.max_parallelism, self.key_serializer, \
            table.ns_ser
        busy = [kg for kg in kgs if native.key_group_size(kg)]
        if not busy:
            return
        snap = native.snapshot()
        try:
            groups = [(kg, snap.entries(kg)[0].to_pylist()) for kg in busy]
        finally:
            snap.release()
        pw, read = self.key_prefix_width, ks.read
        for kg, encoded in groups:
            if ns_ser.name == "void":
                # prefix | ser(key) | 00: the map's own bytes, so only the key needs reading.
                rows = []
                for kb in encoded:
                    key, end = read(kb, pw)
                    rows.append((kb[pw:end], key, None))
            else:
                if table.kind == "map":  # the (key, namespace) part of each map entry's key
                    encoded = [kb[:S.encoded_prefix_size(kb, mp, ks, ns_ser)] for kb in encoded]
                elif table.kind == "list":  # each list chunk's key ends in its seq
                    encoded = [kb[:-S.LIST_SEQ_BYTES] for kb in encoded]
                rows = [(ks.serialize(key), key, ns) for _, key, ns, _ in
                        (S.decode_key(kb, mp, ks, ns_ser) for kb in encoded)]
            yield kg, rows

    # ------------------------------------------------------------------ accounting
    def num_entries(self) -> int:
        return sum(len(t.native) for t in self._tables.values())

    def state_bytes(self) -> int:
        return sum(t.native.nbytes for t in self._tables.values())

    def map_index_stats(self) -> dict:
        """``{state name: {"maps", "user_keys", "bytes"}}`` of every map state's index of user
        keys (collection_index.h; ``bytes`` estimated from its hash nodes, buckets and order
        slots), beside the table's own key and value bytes (:meth:`state_bytes`)."""
        return {name: t.native.index_stats() for name, t in self._tables.items()
                if t.kind == "map"}

    def list_index_stats(self) -> dict:
        """``{state name: {"lists", "chunks", "bytes"}}`` of every list state's index of chunks
        (list_index.h: the lists of more than chunk 0 and their chunks; ``bytes`` estimated from
        its hash nodes, buckets and sequence vectors), beside the table's own key and value
        bytes (:meth:`state_bytes`)."""
        return {name: t.native.list_index_stats() for name, t in self._tables.items()
                if t.kind == "list"}

    def removal_log_sizes(self) -> dict:
        """``{state name: records in its maps' removal logs}`` (bounded by the removals since the
        last completed checkpoint)."""
        return {name: t.native.removal_log_size for name, t in self._tables.items()}

    def copy_on_write_stats(self) -> dict:
        """Copy-on-write counters of every state's maps (entry/page/directory copies, entries
        retired for live snapshots, maps in the middle of an incremental rehash)."""
        return {name: t.native.stats() for name, t in self._tables.items()}

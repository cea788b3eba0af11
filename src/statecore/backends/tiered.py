"""TieredBackend: the native backend with state larger than memory (docs/tiered.md).

After Flink 2.0's disaggregated state backend (ForSt): the checkpoint store holds the whole
state, as the runs of the last committed version; memory holds a bounded working set, the
native state maps of :class:`~statecore.backends.native.NativeBackend` -- the entries changed
since that version plus a cache of unchanged ones. ``create_backend("native",
memory_budget="512MiB", checkpoint=store_or_uri)`` makes one.

Design (the class comments of ``StateMap`` -- native/include/statecore/state_map.h -- and
docs/state-map.md "Change tracking" state the rules this builds on):

* **The store.** The backend is *attached* to one committed version V: a
  :class:`~statecore.checkpoint.lookup.RunLookup` over V's chain of runs for the backend's key
  groups. It attaches by :meth:`TieredBackend.restore` (of a ``CheckpointReader``: nothing is
  loaded; the first record is served at once) and moves to version W whenever a checkpoint
  completes (:meth:`TieredBackend.notify_checkpoint_complete` with W, Flink's
  ``notifyCheckpointComplete``), at the moment the maps' base moves to that snapshot
  (``mark_base``). A fresh backend is attached to nothing: memory is then the whole state.
* **Clean and dirty.** An entry with ``modified < base`` is *clean*: its bytes are V's. An
  entry with ``modified >= base`` is *dirty*: written since V; the next incremental snapshot
  lists it. Because the base is V's snapshot version, "clean" and "held by V's runs with these
  bytes" are the same thing (invariant T1 below).
* **Load before touch.** Every read, read-modify-write or removal of a key first loads the key
  from V's runs into memory when memory lacks it, as a clean entry
  (``StateMap::insert_clean``: stamped ``base - 1``, logged as no write). Then the native
  kernels and the shared per-record classes run unchanged over a map that holds the key exactly
  as the whole state would, so change tracking keeps producing correct incremental runs: a
  write stamps the entry dirty as any write does, a removal of a loaded key is logged (the
  removal log logs removals of present keys only), so the snapshot lists a tombstone that
  shadows V's value. A blind write (``put_batch`` of non-null values, ``update``) loads
  nothing: the new entry is dirty either way.
* **Absent vs evicted.** Memory lacking a key means: evicted (V holds it), never written, or
  removed since V. The last case must not read V's stale value, so each removal's key is kept
  in a *removed set* (per state) until a checkpoint that holds its tombstone completes: the
  set of the current epoch moves to the snapshot taken next and is dropped when that snapshot
  (or a later one) completes, when V advances past it. A key is absent when memory lacks it and
  it is in a removed set, or when neither memory nor V's runs hold it. A batch read of a
  TTL'd state records as removed every row key memory lacks after it (the kernels remove the
  expired entries they read without saying which). A removed key written
  again is in memory (dirty) and memory answers first.
* **Eviction.** After each batch call and each per-record access, when the states' key and
  value bytes (``state_bytes``) exceed the budget, clean entries are dropped
  (``StateTable::evict_clean``: a clock hand over key groups and buckets, no change logged)
  until they fit in the budget less 1/:data:`EVICT_SLACK_FRACTION` of it (a low watermark:
  one-entry loads evict once in many calls), those not touched in the last epoch first -- a
  clean entry's stamp is the epoch of its last write, or the one before the base when loaded
  since it, so a key a stream touches every interval gets a second chance, as CLOCK's
  reference bit gives one. Snapshots are copy-on-write views (state-map.md "Snapshots are
  versions"), so an eviction -- a removal from the live map -- never changes what a running
  snapshot lists.
* **Spill.** Dirty entries exist nowhere else until the next checkpoint completes; when they
  alone exceed the budget, every change since the maps' base is written to a local spill run
  and the base moves to it (:mod:`statecore.backends.tiered_spill`), so they become clean and
  evictable. Reads then consult memory, the spill runs newest first, then V; a removal records
  the number of runs written before it, and a run older than the removal never decides the key.
  Snapshots merge the spill runs under memory's changes, so the published run is the one an
  unspilled backend writes; a completed checkpoint retires the runs its snapshot merged. From
  the first spill on, "clean" means: the bytes of the newest spill run holding the key, or of V.
  Every keyed state spills: a list's chunks and a map's user keys, with their tombstones, as
  any entry (their collections then become evictable whole, below).
* **Lists and maps.** A list's chunks and a map's user keys are entries of their own
  (docs/formats.md "List state", "Map state"), all under the collection's ``key |
  namespace`` prefix. The unit of loading and eviction is the whole collection: the first
  touch of one (any read, append, put, removal or clear, per record or in a batch) loads every
  entry V holds under its prefix as clean entries (:meth:`RunLookup.prefix_entries`) and lists
  them in the table's list or map index, and the backend records the prefix as *held*
  (:meth:`TieredBackend.touch_collections`); eviction drops a held collection only when all
  its entries are clean and no removal from it was recorded after the newest spill run, all of
  them at once (``NativeStateTable.evict_collection``: ``StateMap::evict`` of each, unlisted
  together), so memory never holds part of one. A load merges: V's entries under the prefix,
  then each spill run's, oldest to newest (a value replaces, a tombstone deletes;
  :meth:`SpillRuns.prefix_entries`). An append therefore sees the list's last chunk and
  continues its sequence numbers as in memory, and a clear removes (and logs) every chunk V
  and the spill runs hold. T2 for collections: memory holds a collection whole when its prefix
  is held; otherwise memory holds none of its entries and V's entries with the spill runs'
  over them are the collection. A call that may remove entries (a clear, a map removal, a
  TTL'd state's reads) records the prefix as removed with the spill count, as a value key's
  removal: the removals (the chunks' and user keys' tombstones: the collection was loaded
  whole first) are then in memory only, which keeps it held until a spill run written after
  them or a completed checkpoint holding them; a spill that finds no change at all proves
  them held by the runs already (:meth:`TieredBackend._removals_spilled`). A TTL cleanup step
  removes expired entries without naming their collections: it holds every collection of its
  state the same way (:meth:`TieredBackend.note_cleanup`).
* **Snapshots.** Once attached, every snapshot is incremental on top of V (a full one would
  need the whole state in memory): ``snapshot(incremental=False)`` takes an incremental one.
* **Background compaction.** Each checkpoint adds a run to V's chains, and a lookup of a key
  memory lacks consults every run of its chain. When the chain of the backend's key groups is
  longer than ``compact_max_runs`` after an attach, and the backend's store object committed V
  (so that the compaction publishes under the commits' lock and lease; a Spark task's store
  commits nothing, the driver's compacts), the store's compactor compacts V's top runs of
  those key groups in its background thread (``CheckpointStore.compact_async`` with
  ``key_groups``: the manifest of V is replaced by one restoring the same state from one full
  run per top run, the TTL compaction filter applied), as Flink 2.0's ForSt compacts a task's
  files in the background. Processing goes on meanwhile against V's old runs, which the
  backend's reader pins (statecore.checkpoint.pins: retention keeps them). At the next safe
  point after it finished -- the end of a call (:meth:`TieredBackend.evict`) or
  ``notify_checkpoint_complete`` -- the backend re-attaches to its version's manifest when the
  compaction replaced it (V's, or that of a later version still chained onto the runs it
  merged: the checkpoints taken while it ran) and it is still the same commit; the block
  cache keeps the blocks of the files V still lists (its keys name immutable files) and drops
  the replaced runs' ones. Same
  content, so T1 and T2 hold across the switch, except for entries the TTL filter dropped: V
  no longer holds those, and a clean copy in memory is expired, which every read treats as
  absent.

Invariants:

* T1 while attached to V (of the maps' base b): every clean entry's bytes are its key's value in
  the newest spill run holding it, or else V's; every dirty entry has ``modified >= b``.
* T2 a key whose entry is absent from memory and in no removed set has the value of the newest
  spill run holding it, or else V's (or is absent from both); a key in a removed set is absent
  unless memory or a spill run written after the removal holds it.
* T3 a key is loaded (when V holds it) before any read or removal touches it, so every removal
  of a key present in the logical state is a logged removal of a present entry.
* T4 eviction removes clean entries only, without logging.
* T5 (lists and maps) memory holds every entry of a held collection and no entry of another;
  a collection is evicted whole, only when all its entries are clean and every removal from it
  (a removed set's entry of its prefix, or of a cleanup step of its state) was recorded before
  the newest spill run, so that the spill runs hold its tombstones.
* T6 a spill run is referenced by no manifest; it is retired only when a checkpoint whose
  snapshot merged it completes.

Scope: value, reducing, aggregating, list and map states (TTL'd or not; the stored bytes, TTL
suffix included, are what the runs hold, and expired values read from V are treated as the
kernels treat expired entries in memory; incremental TTL cleanup visits the entries memory
holds, so what it removes and counts in ``ttl_statistics`` -- and hence the expired entries
``keys`` still lists, and with ``ReturnExpiredIfNotCleanedUp`` those reads still return --
depends on what was evicted). An aggregating state's accumulator is one entry per
key and namespace, as a reducing state's value: ``add`` and ``add_batch`` are
read-modify-writes that load first; its batch calls take the shared per-row path over the table
(no kernel), so they load the rows' keys in one lookup and hold eviction until the last row is
applied (:meth:`TieredBackend.eviction_held`). ``merge_namespaces`` reads and removes through
the same per-record table calls. ``keys`` and ``apply_to_all_keys`` merge V's keys with memory
one key group at a time (:meth:`TieredBackend._key_namespaces`). List and map states cost a
whole collection per first touch (above): a map's single-key ``get`` or ``put`` loads the map,
and a map loaded from V iterates in its user keys' byte order (as after a restore), not in the
order they were first put. Their ``merge_namespaces`` and batch calls load the collections of
their rows first. TTL migrations and ``apply_changes`` are refused (InvalidInputError). Timers
and operator state are held in memory as in the native backend. A batch call of a value,
reducing or aggregating state takes a constant number of Python steps whatever its rows (a list
or map batch checks its rows' prefixes against the held ones in Python): one native call
encodes the rows' keys with the kernels' encoder and returns those memory lacks, each once
(``NativeStateTable.batch_encoded_keys``); one :meth:`RunLookup.lookup_batch` fetches them
(blocks read together on its thread pool, opened and searched natively with the GIL released);
one native call loads them as clean entries (``load_clean``); then the native kernel applies
the batch. A per-record read of a key memory lacks fetches it with
:meth:`RunLookup.lookup_one` (on the calling thread, no batch arrays).

Thread contract: the native backend's.
"""

from __future__ import annotations

import contextlib
import itertools
import re
from bisect import bisect_left
from collections import OrderedDict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statecore import serializers as S
from statecore.arrow_input import (
    batch_namespace_array,
    coerce_key_array,
    coerce_value_array,
    combined,
    is_arrow_input,
)
from statecore.backends import base, native_states
from statecore.backends.native import NativeBackend, NativeSnapshot, NativeTable
from statecore.backends.tiered_spill import SpilledSnapshot, SpillRuns
from statecore.checkpoint.compaction import check_max_runs
from statecore.checkpoint.lookup import DEFAULT_CACHE_BYTES, RunLookup
from statecore.checkpoint.readers import merge_newest_wins
from statecore.checkpoint.runs import plan_chains
from statecore.checkpoint.store import CheckpointStore
from statecore.errors import CheckpointError, CorruptCheckpointError, InvalidInputError
from statecore.key_groups import KeyGroupRange
from statecore.operator_state import is_operator_state_meta
from statecore.serializers import key_serializer

__all__ = ["TieredBackend", "TieredTable", "parse_bytes", "TIERED_KINDS", "COLLECTION_KINDS",
           "DEFAULT_COMPACT_MAX_RUNS"]

#: State kinds a tiered backend holds.
TIERED_KINDS = ("value", "reducing", "aggregating", "list", "map")
#: ... of which these are collections: a list's chunks or a map's user keys are entries of
#: their own, loaded and evicted together (module docstring).
COLLECTION_KINDS = ("list", "map")

#: The block size (bytes) of the runs a tiered backend's own store writes when it is given a
#: URI or path (``checkpoint=``) and of a tiered operator's (``StatefulOperator``
#: ``memory_budget`` without ``block_target_bytes``): a lookup that misses the cache opens one
#: block per run, so the runs the tiered mode reads key by key are cut as RocksDB cuts its
#: (``block_size``, 4 KiB by default), not at the in-memory restores' 64 KiB
#: (docs/tiered.md "Block size").
TIERED_BLOCK_TARGET_BYTES = 4 << 10

#: Runs of the attached chain above which a tiered backend has it compacted in the background
#: (below the store's own ``DEFAULT_MAX_RUNS``, which compacts inside the commit).
DEFAULT_COMPACT_MAX_RUNS = 4

#: The removed-set entry of a TTL cleanup step's removals from a list or map state: they name
#: no collection, so they hold every one (TieredBackend.note_cleanup; no encoded key is empty).
_CLEANUP = b""
#: Collections one native call of the collection eviction tries at most (its Python side
#: builds lists of that length).
_EVICT_RUN = 256

#: Eviction frees down to the budget less 1/EVICT_SLACK_FRACTION of it (TieredBackend.
#: _evict_clean).
EVICT_SLACK_FRACTION = 64

_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_bytes(value, what: str = "memory_budget") -> int:
    """A byte count from an int (bytes) or a string such as ``"512MiB"``, ``"64 KiB"``,
    ``"2GB"`` (units B, KiB, MiB, GiB, TiB powers of 1024; KB, MB, GB, TB powers of 1000; case
    ignored). InvalidInputError naming ``what`` for anything else or a negative count."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        n = int(value)
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", value)
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise InvalidInputError(
                f"{what} must be bytes as an int or a string like '512MiB', got {value!r}")
        n = int(float(m.group(1)) * _UNITS[unit])
    else:
        raise InvalidInputError(
            f"{what} must be bytes as an int or a string like '512MiB', got {value!r}")
    if n < 0:
        raise InvalidInputError(f"{what} must not be negative, got {value!r}")
    return n


class TieredTable(NativeTable):
    """A :class:`~statecore.backends.native.NativeTable` whose per-record accesses go through
    the tiered backend: ``get`` and ``remove`` load the key from the attached version first
    (module docstring, T3), ``remove`` records the key as removed, and every access ends with
    the backend's eviction check."""

    def __init__(self, meta: dict, backend: "TieredBackend"):
        self._tiered = backend
        super().__init__(meta, backend)

    def _use_stored_format(self) -> None:
        super()._use_stored_format()
        # NativeTable binds the native calls on the instance; these wrap them.
        native, backend = self.native, self._tiered
        get_stored, put_stored, remove_key = native.get_stored, native.put_stored, \
            native.remove_key

        def get(kg: int, k):
            out = get_stored(kg, k)
            if out is None and not backend.rows_loaded:  # memory lacks the key: load it
                if backend.load_one(self, kg, k):
                    out = get_stored(kg, k)
            backend.evict()
            return out

        def put(kg: int, k, stored) -> None:
            put_stored(kg, k, stored)
            backend.evict()

        def remove(kg: int, k) -> None:
            if not backend.rows_loaded and get_stored(kg, k) is None:
                backend.load_one(self, kg, k)
            remove_key(kg, k)
            backend.note_removed(self, [k])
            backend.evict()

        self.get, self.put, self.remove = get, put, remove
        if self.kind in COLLECTION_KINDS:
            self._wrap_collection_calls()

    # A TTL cleanup step removes expired entries of collections it does not name: for a list
    # or map state the backend records that they await a spill run or checkpoint
    # (TieredBackend.note_cleanup), so that no collection is evicted and reloaded with them.
    def ttl_cleanup_step(self, kgs, min_entries: int, ttl_ms: int, now: int, steps: int = 1):
        out = super().ttl_cleanup_step(kgs, min_entries, ttl_ms, now, steps)
        if out[1]:
            self._tiered.note_cleanup(self)
        return out

    def kernel_cleanup(self, kgs, min_entries: int, steps_per_row: int, ttl_ms: int, now: int,
                       on_expired):
        def expired(n: int) -> None:
            self._tiered.note_cleanup(self)
            on_expired(n)
        return super().kernel_cleanup(kgs, min_entries, steps_per_row, ttl_ms, now, expired)

    def ttl_cleanup_key_group(self, kg: int, ttl_ms: int, now: int) -> int:
        n = super().ttl_cleanup_key_group(kg, ttl_ms, now)
        if n:
            self._tiered.note_cleanup(self)
        return n

    def _wrap_collection_calls(self) -> None:
        """The list or map calls (bound per instance by NativeTable) wrapped: the collection
        is loaded whole first (TieredBackend.touch_collections), the calls that may remove
        entries record it as removed, and the call ends with the eviction check."""
        backend = self._tiered
        names = (("list_chunks", "read"), ("list_append", "write"), ("list_put_chunk", "remove"),
                 ("list_size", "read"), ("list_clear", "remove")) if self.kind == "list" else \
            (("map_get", "read"), ("map_put", "write"), ("map_remove", "remove"),
             ("map_items", "read"), ("map_size", "read"), ("map_clear", "remove"))
        for name, mode in names:
            setattr(self, name, self._touching(backend, getattr(self, name), mode))

    def _touching(self, backend: "TieredBackend", call, mode: str):
        def touched(kg: int, k: bytes, *args):
            backend.touch_collections(self, [k], mode)
            out = call(kg, k, *args)
            backend.evict()
            return out
        return touched


class _TieredBatch:
    """Batch calls of the tiered states: the rows' keys are loaded (those memory lacks, in one
    lookup) before the native kernel runs, removals are recorded, and the call ends with the
    eviction check. Keys (and namespaces given as Arrow) are imported once and handed on, so
    a stream is read once."""

    def _load_rows(self, keys, namespaces, rows=None, removing: bool = False):
        """Load the keys of the rows (all, or those where the numpy bool array ``rows`` is
        true) that memory lacks; with ``removing`` return the encoded keys of those rows
        (``pa.binary()``, each once), which the caller records as removed. While the attached
        version holds nothing of the state (memory holds all of it then) nothing is loaded,
        and unless ``removing`` (a snapshot taken before may still complete and hold the keys)
        nothing is encoded either. One native call finds the keys (tiered_batch.h), validating
        them as the kernels do."""
        b = self.backend
        reads = b.reads_runs(self.table)
        if removing:
            enc = self._batch_keys(keys, namespaces, rows, only_absent=False)
            if reads:
                b.load_keys(self.table, enc)
            return enc
        if reads:
            b.load_keys(self.table, self._batch_keys(keys, namespaces, rows, only_absent=True),
                        absent=True)
        return None

    def _batch_keys(self, keys, namespaces, rows, only_absent: bool) -> pa.Array:
        """NativeStateTable.batch_encoded_keys of the batch (the kernels' key chunks: a struct
        {key, namespace} per chunk for a namespaced state, as the native states build them)."""
        b = self.backend
        chunks = keys.chunks if isinstance(keys, pa.ChunkedArray) else [keys]
        if self.namespace_type != "void":
            if namespaces is not None and is_arrow_input(namespaces):
                ns = namespaces  # one array a row (_inputs)
            else:
                one = (self.require_current_namespace() if namespaces is None
                       else key_serializer(self.namespace_type).check(namespaces))
                ns = pa.repeat(pa.scalar(one, self.namespace_serializer.key_type.arrow_type),
                               len(keys))
            ns = ns.combine_chunks() if isinstance(ns, pa.ChunkedArray) else ns
            keys = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
            chunks = [pa.StructArray.from_arrays([keys, ns], names=["key", "namespace"])]
        return self.table.native.batch_encoded_keys(
            chunks, b.key_type, b.assigner, b.max_parallelism, rows=rows,
            only_absent=only_absent, namespace_type=self.namespace_type)

    def _inputs(self, keys, namespaces):
        b = self.backend
        b.check_open()
        keys = coerce_key_array(keys, b.key_type, combine=True)
        if (namespaces is not None and is_arrow_input(namespaces)
                and self.namespace_type != "void"):
            namespaces = combined(batch_namespace_array(namespaces, self.namespace_type,
                                                        len(keys)))
        return keys, namespaces

    def _loaded_call(self, call, keys, namespaces, *args):
        """``call(keys, *args, namespaces)`` after loading the rows' keys, with eviction held
        until it returns (a per-row path reads the keys one access at a time: evicting between
        rows would drop keys loaded for later rows) and the per-record loads skipped (the rows'
        keys are loaded), then the eviction check."""
        keys, namespaces = self._inputs(keys, namespaces)
        b = self.backend
        try:
            with b.eviction_held():
                self._load_rows(keys, namespaces)
                with b.rows_held():
                    out = call(keys, *args, namespaces)
                if self.descriptor.ttl_config is not None:
                    # A TTL read removes the expired entries it finds (a logged removal); the
                    # batch kernels do not say which, so every row key memory lacks now
                    # (nothing was evicted meanwhile) is recorded as removed (T2): absent
                    # either way, and V's expired value must not be read again.
                    b.note_removed(self.table, self._batch_keys(keys, namespaces, None,
                                                                only_absent=True))
                return out
        finally:
            b.evict()

    def get_batch(self, keys, namespaces=None) -> pa.Array:
        return self._loaded_call(super().get_batch, keys, namespaces)

    def clear_batch(self, keys, namespaces=None) -> None:
        keys, namespaces = self._inputs(keys, namespaces)
        enc = self._load_rows(keys, namespaces, removing=True)
        super().clear_batch(keys, namespaces)
        self.backend.note_removed(self.table, enc)
        self.backend.evict()


class _TieredValue(_TieredBatch):
    def put_batch(self, keys, values, namespaces=None) -> None:
        keys, namespaces = self._inputs(keys, namespaces)
        values = coerce_value_array(values, self.serializer.name, len(keys), combine=True)
        # A NULL value removes its row's key: those keys are loaded and recorded as removed.
        # Other rows are blind writes and need nothing loaded.
        enc = None
        if values.null_count:
            enc = self._load_rows(keys, namespaces,
                                  rows=values.is_null().to_numpy(zero_copy_only=False),
                                  removing=True)
        super().put_batch(keys, values, namespaces)
        if enc is not None:
            self.backend.note_removed(self.table, enc)
        self.backend.evict()

    def contains_batch(self, keys, namespaces=None) -> pa.Array:
        return self._loaded_call(super().contains_batch, keys, namespaces)


class _TieredMerging(_TieredBatch):
    """``add_batch`` of reducing and aggregating states: a read-modify-write of each row's key,
    so the rows' keys are loaded first (an aggregating state's accumulator is stored as a
    reducing state's value, one entry a key and namespace; its ``add_batch`` folds the rows
    in Python over ``table.get`` and writes the staged accumulators at the end)."""

    def add_batch(self, keys, values, namespaces=None) -> pa.Array:
        return self._loaded_call(super().add_batch, keys, namespaces, values)


class _TieredCollection(_TieredBatch):
    """Batch calls of list and map states: the collections of the rows (their ``key |
    namespace`` prefixes, from the kernels' key encoder) are loaded whole before the kernel
    runs (:meth:`TieredBackend.touch_collections`, one range lookup for those memory does not
    hold), with eviction held until it returns, then the eviction check."""

    def _touch_call(self, call, mode: str, keys, namespaces, *args):
        keys, namespaces = self._inputs(keys, namespaces)
        b = self.backend
        try:
            with b.eviction_held():
                prefixes = self._batch_keys(keys, namespaces, None, only_absent=False)
                b.touch_collections(self.table, prefixes.to_pylist(), mode)
                return call(keys, *args, namespaces)
        finally:
            b.evict()

    def clear_batch(self, keys, namespaces=None) -> None:
        return self._touch_call(super(_TieredBatch, self).clear_batch, "remove", keys,
                                namespaces)


class _TieredList(_TieredCollection):
    def append_batch(self, keys, values, namespaces=None) -> None:
        return self._touch_call(super().append_batch, "write", keys, namespaces, values)

    def get_batch(self, keys, namespaces=None) -> pa.Array:
        return self._touch_call(super(_TieredBatch, self).get_batch, "read", keys, namespaces)


class _TieredMap(_TieredCollection):
    def put_batch(self, keys, user_keys, values, namespaces=None) -> None:
        return self._touch_call(super().put_batch, "write", keys, namespaces, user_keys, values)

    def get_batch(self, keys, user_keys, namespaces=None) -> pa.Array:
        return self._touch_call(super(_TieredBatch, self).get_batch, "read", keys, namespaces,
                                user_keys)

    def contains_batch(self, keys, user_keys, namespaces=None) -> pa.Array:
        return self._touch_call(super().contains_batch, "read", keys, namespaces, user_keys)

    def remove_batch(self, keys, user_keys, namespaces=None) -> None:
        return self._touch_call(super().remove_batch, "remove", keys, namespaces, user_keys)


class TieredListState(_TieredList, native_states.NativeListState):
    """List state of a tiered backend (module docstring)."""


class TieredTtlListState(_TieredList, native_states.NativeTtlListState):
    """TTL'd list state of a tiered backend (module docstring)."""


class TieredMapState(_TieredMap, native_states.NativeMapState):
    """Map state of a tiered backend (module docstring)."""


class TieredTtlMapState(_TieredMap, native_states.NativeTtlMapState):
    """TTL'd map state of a tiered backend (module docstring)."""


class TieredValueState(_TieredValue, native_states.NativeValueState):
    """Value state of a tiered backend (module docstring)."""


class TieredReducingState(_TieredMerging, native_states.NativeReducingState):
    """Reducing state of a tiered backend (module docstring)."""


class TieredTtlValueState(_TieredValue, native_states.NativeTtlValueState):
    """TTL'd value state of a tiered backend (module docstring)."""


class TieredTtlReducingState(_TieredMerging, native_states.NativeTtlReducingState):
    """TTL'd reducing state of a tiered backend (module docstring)."""


class TieredAggregatingState(_TieredMerging, native_states.NativeAggregatingState):
    """Aggregating state of a tiered backend (module docstring)."""


class TieredTtlAggregatingState(_TieredMerging, native_states.NativeTtlAggregatingState):
    """TTL'd aggregating state of a tiered backend (module docstring)."""


class TieredBackend(NativeBackend):
    """The native backend with a bounded working set over the runs of a checkpoint store
    (module docstring; docs/tiered.md).

    ``memory_budget`` (int bytes or a string such as ``"512MiB"``): the key and value bytes of
    the states' entries held in memory (what :meth:`state_bytes` counts; the maps' slots and
    indexes come on top, docs/tiered.md "Memory"). ``checkpoint``: the
    :class:`~statecore.checkpoint.store.CheckpointStore` (or its URI or local path, opened
    with ``block_target_bytes`` :data:`TIERED_BLOCK_TARGET_BYTES`) whose versions the backend
    attaches to. ``cache_bytes``: the block cache of the run lookups
    (decoded blocks, outside the budget; default 64 MiB). ``compact_max_runs`` (int >= 1 or
    None): when the attached version's chains for the backend's key groups hold more runs than
    this, they are compacted in the store's background thread and the backend re-attaches to
    the compacted manifest (module docstring, "Background compaction"; default
    :data:`DEFAULT_COMPACT_MAX_RUNS`; None: never). Only versions the store object committed
    are compacted so: a backend whose versions another process commits (a Spark task's) leaves
    compaction to that process (docs/tiered.md "Compaction and retention"). Other options as
    :class:`~statecore.backends.native.NativeBackend`. ``spill_dir``: the local directory
    under which the spill runs' private directory is made (None: the system's temporary
    directory; :mod:`statecore.backends.tiered_spill`). InvalidInputError for a bad budget,
    ``compact_max_runs`` or a missing store.
    """

    #: Restores attach the version's runs instead of reading them
    #: (CheckpointStore.restore then prefetches nothing).
    attaches_runs = True

    state_classes = {"value": TieredValueState, "reducing": TieredReducingState,
                     "aggregating": TieredAggregatingState, "list": TieredListState,
                     "map": TieredMapState}
    ttl_state_classes = {"value": TieredTtlValueState, "reducing": TieredTtlReducingState,
                         "aggregating": TieredTtlAggregatingState, "list": TieredTtlListState,
                         "map": TieredTtlMapState}

    def __init__(self, *, memory_budget, checkpoint=None, cache_bytes: int = DEFAULT_CACHE_BYTES,
                 compact_max_runs: int | None = DEFAULT_COMPACT_MAX_RUNS,
                 spill_dir: str | None = None, **options):
        self.memory_budget = parse_bytes(memory_budget)
        self.cache_bytes = parse_bytes(cache_bytes, "cache_bytes")
        if compact_max_runs is not None:
            try:
                check_max_runs(compact_max_runs)
            except InvalidInputError:
                raise InvalidInputError(f"compact_max_runs must be an int >= 1 or None, got "
                                        f"{compact_max_runs!r}") from None
        self.compact_max_runs = compact_max_runs
        if checkpoint is None:
            raise InvalidInputError("a tiered backend (memory_budget) needs checkpoint=: the "
                                    "CheckpointStore, URI or path holding its state")
        super().__init__(**options)
        self.store = checkpoint if isinstance(checkpoint, CheckpointStore) \
            else CheckpointStore(checkpoint, block_target_bytes=TIERED_BLOCK_TARGET_BYTES)
        self._lookup: RunLookup | None = None
        self._reader = None
        self._lookup_states: frozenset = frozenset()
        self.attached_version: int | None = None
        self._evict_holds = 0  # eviction_held() depth: evict() drops nothing while > 0
        #: rows_held() depth: while > 0 the per-record table calls load nothing (a batch call
        #: loaded the keys of its rows, and eviction is held)
        self.rows_loaded = 0
        #: this epoch's removed keys (and list or map prefixes) per state, each with the spill
        #: count at its removal
        self._removed: dict[str, dict[bytes, int]] = {}
        self._removed_pending: dict[int, dict[str, dict]] = {}  # snapshot id -> removed keys
        self._spills = SpillRuns(spill_dir, self.store.compression)
        self._snapshot_spill_seq: dict[int, int] = {}  # snapshot id -> newest spill run merged
        #: per list or map state: the ``key | namespace`` prefixes of the collections memory
        #: holds whole (every entry of V's and every change since), least recently used first,
        #: with their key groups
        self._held: dict[str, OrderedDict] = {}
        self._stats = {"loaded": 0, "fetched_keys": 0, "fetch_batches": 0, "evicted": 0,
                       "evicted_collections": 0, "over_budget_batches": 0,
                       "dirty_bytes_peak": 0, "compactions": 0, "compaction_failures": 0,
                       "spills": 0, "spilled_entries": 0, "spilled_bytes": 0}
        #: (version, Future) of the background compaction asked for and not yet seen done
        self._compaction = None
        #: "ExceptionName: message" of the last failed background compaction (None: none)
        self.last_compaction_error: str | None = None

    # ------------------------------------------------------------------ registration
    def get_state(self, descriptor, namespace_type: str = "void"):
        kind = getattr(descriptor, "kind", None)
        if kind is not None and kind not in TIERED_KINDS:
            raise InvalidInputError(
                f"state {descriptor.name!r}: {kind} state is not supported by the tiered mode "
                f"(memory_budget) yet; it holds {', '.join(TIERED_KINDS)} states")
        return super().get_state(descriptor, namespace_type)

    def _new_table(self, meta: dict) -> TieredTable:
        return TieredTable(meta, self)

    def _migrate_on_register(self, descriptor, table) -> None:
        raise InvalidInputError(
            f"state {table.name!r}: TTL migration is not supported by the tiered mode")

    def apply_changes(self, changes) -> None:
        raise InvalidInputError("apply_changes is not supported by the tiered mode: restore "
                                "(attach) the version instead")

    def _key_namespaces(self, state_name: str, kgs: KeyGroupRange):
        """The keys of ``keys()`` / ``apply_to_all_keys()`` (Flink ``getKeys``,
        ``applyToAllKeys``): per key group, the attached version's keys merged with memory --
        every entry memory holds (dirty or clean), plus each key of V's runs that was not
        removed since V. The removals are the maps' own removal log (the tombstones of the
        changes since the base, which is V's snapshot): it holds every removal of a key present
        in the logical state (T3) -- those of TTL reads and cleanup steps included -- and no
        eviction (T4). One key group at a time: V's entries of the group, merged newest-wins
        over its runs (``CheckpointReader.entries``), and memory's keys and tombstones of the
        group, read from one copy-on-write snapshot of the map; nothing is loaded into
        memory. With spill runs, each run's changes apply over V's keys, oldest first, and the
        maps' changes (since the newest spill) last. Unattached without spill runs (or V
        without the state): memory alone, as the native backend."""
        table = self._tables.get(state_name)
        if table is None or not self.reads_runs(table) or not len(kgs):
            yield from super()._key_namespaces(state_name, kgs)
            return
        if table.kind in COLLECTION_KINDS:
            yield from self._collection_key_namespaces(table, kgs)
            return
        native = table.native
        in_v = set(self._reader.key_groups_holding(state_name, kgs.start, kgs.end)) \
            if self._attached_holds(table) else set()
        spilled = list(self._spills.runs) if self._spills.holds(state_name) else []
        in_runs = in_v | (self._spills.key_groups(state_name, kgs.start, kgs.end)
                          if spilled else set())
        busy = in_runs | {kg for kg in kgs if native.key_group_size(kg)}
        if not busy:
            return
        snap = native.snapshot()
        readers: dict = {}
        try:
            for kg in sorted(busy):
                held = set(snap.entries(kg)[0].to_pylist()) if native.key_group_size(kg) \
                    else set()
                if kg in in_runs:
                    # V's keys, then each spill run's and memory's changes over them, oldest
                    # first: a value adds its key, a tombstone removes it.
                    live = set(self._reader.entries(state_name, kg)[0].to_pylist()) \
                        if kg in in_v else set()
                    parts = self._spills.entries(state_name, kg, spilled, readers)[::-1]
                    parts.append(snap.changes(kg, snap.base_version))
                    for keys, values in parts:
                        valid = values.is_valid()
                        live.difference_update(keys.filter(pc.invert(valid)).to_pylist())
                        live.update(keys.filter(valid).to_pylist())
                    held |= live
                if held:
                    yield kg, self._decoded_rows(table, held)
        finally:
            snap.release()
            for rd in readers.values():
                rd.close()

    def _collection_key_namespaces(self, table: TieredTable, kgs: KeyGroupRange):
        """:meth:`_key_namespaces` of a list or map state: per key group, the collections
        memory holds entries of (those it holds whole, module docstring), plus those with a
        live entry in the runs that memory does not hold: the attached version's entries with
        each spill run's over them, oldest to newest (a tombstone deletes), are then the whole
        collection (T5). A collection memory holds without entries was emptied: absent."""
        native, name = table.native, table.name
        held = self._held.get(name, {})
        in_v = set(self._reader.key_groups_holding(name, kgs.start, kgs.end)) \
            if self._attached_holds(table) else set()
        spilled = list(self._spills.runs) if self._spills.holds(name) else []
        in_runs = in_v | (self._spills.key_groups(name, kgs.start, kgs.end) if spilled
                          else set())
        busy = in_runs | {kg for kg in kgs if native.key_group_size(kg)}
        if not busy:
            return
        if table.kind == "list":
            def prefix(kb):
                return kb[:-S.LIST_SEQ_BYTES]
        else:
            mp, ks, ns_ser = self.max_parallelism, self.key_serializer, table.ns_ser

            def prefix(kb):
                return kb[:S.encoded_prefix_size(kb, mp, ks, ns_ser)]
        snap = native.snapshot()
        readers: dict = {}
        try:
            for kg in sorted(busy):
                found = {prefix(kb) for kb in snap.entries(kg)[0].to_pylist()} \
                    if native.key_group_size(kg) else set()
                if kg in in_runs:
                    parts = self._spills.entries(name, kg, spilled, readers)
                    if kg in in_v:
                        parts.append(self._reader.entries(name, kg))
                    stored, _ = merge_newest_wins(parts)
                    found.update(p for p in {prefix(kb) for kb in stored.to_pylist()}
                                 if p not in held)
                yield kg, self._decoded_rows(table, found)
        finally:
            snap.release()
            for rd in readers.values():
                rd.close()

    def _decoded_rows(self, table: TieredTable, encoded) -> list:
        """``[(serialized key, key, namespace)]`` of the encoded keys ``encoded`` of a value,
        reducing or aggregating state (namespace None for void)."""
        ks, ns_ser, pw = self.key_serializer, table.ns_ser, self.key_prefix_width
        if ns_ser.name == "void":
            # prefix | ser(key) | 00: only the key needs reading.
            rows = []
            for kb in encoded:
                key, end = ks.read(kb, pw)
                rows.append((kb[pw:end], key, None))
            return rows
        return [(ks.serialize(key), key, ns) for _, key, ns, _ in
                (S.decode_key(kb, self.max_parallelism, ks, ns_ser) for kb in encoded)]

    # ------------------------------------------------------------------ loads, removals, eviction
    def encode_current_key_bytes(self, key) -> bytes:
        """``prefix | ser(key)`` of ``key`` (what ``set_current_key`` builds, without making it
        current). InvalidInputError for a key of another type or outside the key groups."""
        return self._keys.encode(key)[2]

    def reads_runs(self, table: TieredTable) -> bool:
        """Whether keys of ``table``'s state may be loaded: from a spill run that holds the
        state, or from the attached version (one is attached and holds the state)."""
        return self._attached_holds(table) or self._spills.holds(table.name)

    def _attached_holds(self, table: TieredTable) -> bool:
        return self._lookup is not None and table.name in self._lookup_states

    def load_keys(self, table: TieredTable, encoded, absent: bool = False) -> int:
        """Load the keys of ``encoded`` (encoded keys of ``table``'s state and this backend's
        key groups: a list of bytes or a ``pa.binary()`` array; repeats allowed) that memory
        lacks from the spill runs (newest first) and then the attached version, as clean
        entries, with one lookup of each (:meth:`_fetch`). ``absent``: the keys are unique and
        memory lacks each (batch_encoded_keys said so). Returns the entries loaded (0 when
        neither a spill run nor the attached version holds the state)."""
        if not len(encoded) or not self.reads_runs(table):
            return 0
        keys = encoded if isinstance(encoded, pa.Array) else pa.array(encoded, pa.binary())
        if not absent:
            keys = pc.unique(keys)
            keys = keys.filter(table.native.absent_keys(keys, self.key_prefix_width))
        removed = self._removals_of(table)
        since = None
        if removed and len(keys):
            # The spill count at each key's last removal (-1: not removed since V). A key
            # removed after the newest spill is absent: nothing to fetch.
            since = np.array([max(s.get(k, -1) for s in removed) for k in keys.to_pylist()],
                             dtype=np.int64)
            keep = since < self._spills.last_seq
            if not keep.all():
                keys, since = keys.filter(pa.array(keep)), since[keep]
        if not len(keys):
            return 0
        values = self._fetch(table, keys, since)
        n = table.native.load_clean(keys, values, self.key_prefix_width)
        st = self._stats
        st["fetch_batches"] += 1
        st["fetched_keys"] += len(keys)
        st["loaded"] += n
        return n

    def load_one(self, table: TieredTable, kg: int, key: bytes) -> bool:
        """:meth:`load_keys` of the one encoded key ``key`` (bytes) of key group ``kg``, which
        memory lacks, for the per-record reads: no arrays, the spill runs searched and the
        attached version looked up for this key alone (``RunLookup.lookup_one``). Returns
        whether an entry was loaded."""
        if not self.reads_runs(table):
            return False
        since = max((r.get(key, -1) for r in self._removals_of(table)), default=-1)
        if since >= self._spills.last_seq:  # removed after the newest spill: absent
            return False
        value = None
        seq = 0
        if self._spills.holds(table.name):
            seq, value = self._spills.lookup_one(table.name, key, kg)
            if 0 < seq <= since:  # a run older than the removal: absent
                value = None
        if seq == 0 and since < 0 and self._attached_holds(table):
            value = self._lookup.lookup_one(table.name, key)
        st = self._stats
        st["fetch_batches"] += 1
        st["fetched_keys"] += 1
        if value is None or not table.native.load_clean_one(kg, key, value):
            return False
        st["loaded"] += 1
        return True

    def _removals_of(self, table: TieredTable) -> list[dict]:
        """The removal records of ``table``'s state ({encoded key: spill count at its
        removal}; module docstring, T2), current and of the snapshots still pending."""
        return [s[table.name] for s in (self._removed, *self._removed_pending.values())
                if table.name in s]

    def _fetch(self, table: TieredTable, keys: pa.Array, since) -> pa.Array:
        """The stored values of the encoded keys ``keys`` (NULL: absent). ``since`` (None, or
        per key the spill count at its last removal since V, -1 for none): a spill run written
        after a key's last removal decides it with its value or tombstone; a key removed since
        V that no such run holds is absent (T2); the attached version answers the others."""
        n = len(keys)
        if self._spills.holds(table.name):
            seq, values = self._spills.lookup(table.name, keys, self.key_prefix_width)
        else:
            seq, values = np.zeros(n, dtype=np.int64), pa.nulls(n, pa.binary())
        if since is not None:
            stale = (seq > 0) & (seq <= since)  # a run older than the removal: absent
            if stale.any():
                values = pc.if_else(pa.array(stale), pa.scalar(None, pa.binary()), values)
            ask = (seq == 0) & (since < 0)
        else:
            ask = seq == 0
        if not ask.any() or not self._attached_holds(table):
            return values
        rest = np.flatnonzero(ask)
        if len(rest) == 1:  # a per-record read: no thread pool, no batch arrays
            one = self._lookup.lookup_one(table.name, keys[int(rest[0])].as_py())
            older = pa.array([one], pa.binary())
        else:
            older = self._lookup.lookup_batch(table.name, keys.take(pa.array(rest)))
        if len(rest) == n:
            return older
        pick = np.arange(n, dtype=np.int64)
        pick[rest] = n + np.arange(len(rest), dtype=np.int64)
        return pa.concat_arrays([values, older]).take(pa.array(pick))

    def note_removed(self, table: TieredTable, encoded) -> None:
        """Record removals of the keys of ``encoded`` (a list of bytes or a ``pa.binary()``
        array) from ``table``'s state (module docstring, T2), attached or not, with the spill
        count at the removal: a snapshot taken before the removal may complete later, and the
        version it becomes holds the keys; a spill run written before it holds them too, one
        written after it the key's newer entry."""
        if isinstance(encoded, pa.Array):
            encoded = encoded.to_pylist()
        if encoded:
            self._removed.setdefault(table.name, {}).update(
                dict.fromkeys(encoded, self._spills.last_seq))

    def note_cleanup(self, table: TieredTable) -> None:
        """Record that a TTL cleanup step removed expired entries of ``table`` without naming
        them: for a list or map state, as a removal from every collection (:data:`_CLEANUP` in
        the removed set), so none is evicted until a spill run or a completed checkpoint holds
        the tombstones (T5)."""
        if table.kind in COLLECTION_KINDS:
            self._removed.setdefault(table.name, {})[_CLEANUP] = self._spills.last_seq

    def touch_collections(self, table: TieredTable, prefixes, mode: str = "read") -> None:
        """Make memory hold whole the lists or maps of ``table`` (a list or map state) named by
        ``prefixes`` (their encoded ``key | namespace`` prefixes, bytes; repeats allowed)
        before a call touches them: those memory does not hold are loaded from the attached
        version and the spill runs, every entry as a clean one (:meth:`_load_collections`) and
        listed in the table's index. ``mode``: ``"read"`` (a collection found nowhere is not
        recorded), ``"write"`` (it is: the call creates it) or ``"remove"`` (the call may
        remove entries: the prefixes are recorded as removed, T2, so that they stay in memory
        until a spill run written after the removals, or a completed checkpoint, holds them).
        A TTL'd state's reads remove the expired entries they find: any mode counts as
        ``"remove"`` there."""
        held = self._held.setdefault(table.name, OrderedDict())
        missing = []
        for p in prefixes:
            if p in held:
                held.move_to_end(p)
            else:
                missing.append(p)
        if table.ttl:
            mode = "remove"
        if missing:
            missing = list(dict.fromkeys(missing))
            found = self._load_collections(table, missing) if self.reads_runs(table) \
                else set()
            pw = self.key_prefix_width
            for p in missing:
                if mode != "read" or p in found:
                    held[p] = int.from_bytes(p[:pw], "big")
        if mode == "remove":
            self.note_removed(table, prefixes)

    def _load_collections(self, table: TieredTable, prefixes: list) -> set:
        """Load every entry under ``prefixes`` (collections memory holds none of, so every
        removal from them is in a spill run, T5) as clean entries and list them in the table's
        index: the attached version's entries (:meth:`RunLookup.prefix_entries`) with each
        spill run's entries over them, oldest to newest (a value replaces, a tombstone deletes;
        :meth:`SpillRuns.prefix_entries`); returns the prefixes that had entries."""
        parts = []
        if self._spills.holds(table.name):
            parts.append(self._spills.prefix_entries(table.name, prefixes,
                                                     self.key_prefix_width))
        if self._attached_holds(table):
            parts.append(self._lookup.prefix_entries(table.name, prefixes))
        keys, values = merge_newest_wins(parts)
        st = self._stats
        st["fetch_batches"] += 1
        st["fetched_keys"] += len(prefixes)
        if not len(keys):
            return set()
        st["loaded"] += table.native.load_clean(keys, values, self.key_prefix_width)
        table.index_loaded(keys)
        got = keys.to_pylist()
        found = set()
        for p in prefixes:
            i = bisect_left(got, p)
            if i < len(got) and got[i].startswith(p):
                found.add(p)
        return found

    def _evict_collections(self, table: TieredTable, target: int) -> int:
        """Evict whole lists or maps of ``table``, least recently touched first, until its
        bytes are at most ``target``: those whose entries are all clean and that were not
        removed from since the newest spill run (``evict_collection``; others go to the back).
        A removal recorded before a spill run was written is in that run (its tombstones: the
        collection was loaded whole before it, T3), so loads merging the runs see it (T5).
        Returns how many."""
        held = self._held.get(table.name)
        if not held:
            return 0
        last = self._spills.last_seq
        removed = self._removals_of(table)
        if any(s.get(_CLEANUP, -1) >= last for s in removed):
            return 0  # a TTL cleanup step since the newest run holds every collection (T5)
        native, n, left = table.native, 0, len(held)
        # In runs of the least recently used: one native call per run, which stops at the
        # target; those it kept or skipped go to the back, so each is tried once per call.
        while left > 0:
            run = list(itertools.islice(held.items(), min(left, _EVICT_RUN)))
            left -= len(run)
            skip = [bool(removed) and any(s.get(p, -1) >= last for s in removed)
                    for p, _ in run]
            got = native.evict_collections([kg for _, kg in run], [p for p, _ in run], skip,
                                           max(target, 0))
            for (p, _), g in zip(run, got):
                if g < 0:
                    held.move_to_end(p)
                else:
                    del held[p]
                    n += 1
            if len(got) < len(run):
                break  # the target was reached
        return n

    @contextlib.contextmanager
    def eviction_held(self):
        """A context in which :meth:`evict` drops nothing (nestable): a batch call that reads
        its rows one access at a time keeps the keys it loaded together until it is done, and
        calls :meth:`evict` after."""
        self._evict_holds += 1
        try:
            yield
        finally:
            self._evict_holds -= 1

    @contextlib.contextmanager
    def rows_held(self):
        """A context, inside :meth:`eviction_held`, in which the per-record table calls of
        the tiered tables load nothing: the batch call running in it loaded the keys of its
        rows, and its per-row path touches those keys only."""
        self.rows_loaded += 1
        try:
            yield
        finally:
            self.rows_loaded -= 1

    def evict(self) -> int:
        """Drop clean entries until :meth:`state_bytes` fits the budget; when the changed
        entries alone exceed it, spill them first (:meth:`spill`) and drop them too. Returns how
        many entries were dropped (0 inside :meth:`eviction_held`). Counted in
        :meth:`tiered_statistics`. CheckpointIOError when a spill run cannot be written: the
        entries stay in memory, over the budget, and the next checkpoint publishes them. Every
        call ends here, outside any batch: the safe point where a finished background
        compaction is taken up (:meth:`poll_compaction`)."""
        if self._evict_holds:
            return 0
        if self._compaction is not None:
            self.poll_compaction()
        total = self.state_bytes()
        if total <= self.memory_budget:
            return 0
        n = self._evict_clean(total)
        total = self.state_bytes()
        if total > self.memory_budget:
            # Even a spill that finds no change frees collections (_removals_spilled).
            self.spill()
            n += self._evict_clean(total)
            total = self.state_bytes()
        st = self._stats
        st["evicted"] += n
        if total > self.memory_budget:
            st["over_budget_batches"] += 1
            st["dirty_bytes_peak"] = max(st["dirty_bytes_peak"], total)
        return n

    def spill(self) -> int:
        """Write every change since the maps' base (values and tombstones of every keyed
        state: values, accumulators, list chunks and map user keys) as a spill run and move the
        maps' base to it, so the changed entries become clean
        (:mod:`statecore.backends.tiered_spill`) and the collections holding them evictable
        whole; returns the entries written (0: no change). The next snapshots merge the run
        until a checkpoint holding it completes."""
        names = list(self._tables)
        if not names:
            return 0
        snap = NativeSnapshot(self, {n: self._tables[n] for n in names}, {}, 0, True)
        try:
            run = self._spills.write(snap, names)
            versions = snap.table_versions()
        finally:
            snap.release()
        if run is None:
            self._removals_spilled()
            return 0
        for name, version in versions.items():
            self._tables[name].native.mark_base(version)
        st = self._stats
        st["spills"] += 1
        st["spilled_entries"] += run.entries
        st["spilled_bytes"] += run.file_bytes
        return run.entries

    def _removals_spilled(self) -> None:
        """A spill found no change: every removal from a list or map recorded so far is then in
        the runs already (one that removed an entry a run or V holds is a logged change), so
        those recorded after the newest run are restamped as before it: they hold their
        collections no longer (T5)."""
        last = self._spills.last_seq
        for removed in (self._removed, *self._removed_pending.values()):
            for name, keys in removed.items():
                table = self._tables.get(name)
                if table is not None and table.kind in COLLECTION_KINDS:
                    for k, seq in keys.items():
                        if seq >= last:
                            keys[k] = last - 1

    def _evict_clean(self, total: int) -> int:
        """Drop clean entries, state by state, until ``total`` (the bytes held) fits the
        budget less :data:`EVICT_SLACK_FRACTION` of it (a low watermark: per-record reads that
        load one entry each then evict once in many calls, not at every call); returns how
        many."""
        n, st = 0, self._stats
        target = self.memory_budget - self.memory_budget // EVICT_SLACK_FRACTION
        for table in self._tables.values():
            excess = total - target
            if excess <= 0:
                break
            before = table.native.nbytes
            if table.kind in COLLECTION_KINDS:
                st["evicted_collections"] += self._evict_collections(table, before - excess)
            else:
                n += table.native.evict_clean(max(0, before - excess))
            total -= before - table.native.nbytes
        return n

    def tiered_statistics(self) -> dict:
        """Counters of the tiered mode: ``loaded`` (entries loaded from the attached version),
        ``fetched_keys`` / ``fetch_batches`` (keys asked of the run lookups and the lookups
        made; for lists and maps, the collections asked), ``evicted`` (clean entries of
        value, reducing and aggregating states dropped), ``evicted_collections`` (lists and
        maps dropped whole), ``spills`` / ``spilled_entries`` / ``spilled_bytes`` (spill runs
        written, their entries and file bytes), ``spill_runs`` (live now),
        ``over_budget_batches`` (eviction checks that ended above the budget even after a
        spill), ``dirty_bytes_peak`` (the most bytes held after such a check),
        ``memory_budget``, ``state_bytes`` (now), ``attached_version`` (None: not attached),
        ``attached_runs`` (the most runs a key group's chain holds in the attached version; 0
        when not attached), ``compactions`` (re-attaches to a compacted manifest),
        ``compaction_failures`` (background compactions that raised;
        :attr:`last_compaction_error` says what), ``compacting`` (one is in flight) and the
        lookup's own statistics under ``lookup`` (RunLookup.statistics; {} when not
        attached)."""
        return dict(self._stats, memory_budget=self.memory_budget,
                    spill_runs=len(self._spills.runs),
                    state_bytes=self.state_bytes(), attached_version=self.attached_version,
                    attached_runs=self.attached_runs(), compacting=self._compaction is not None,
                    lookup=self._lookup.statistics() if self._lookup is not None else {})

    # ------------------------------------------------------------------ background compaction
    def attached_runs(self) -> int:
        """The most runs the chain of one of the backend's key groups holds in the attached
        version (what a lookup of a key memory lacks consults at most); 0 when not attached."""
        if self._lookup is None:
            return 0
        segs = plan_chains(self._reader.manifest["files"], (self._lookup.start, self._lookup.end),
                           CorruptCheckpointError, f"manifest of version {self.attached_version}")
        return max((len(chain) for _, _, chain in segs), default=0)

    def _maybe_compact(self) -> None:
        """Ask the store's compactor for a background compaction of the attached version's
        top runs of this backend's key groups when their chains are longer than
        ``compact_max_runs``, none is in flight, and the store object made that commit
        (``CheckpointStore.committed_here``: compaction publishes under the commits' lock and
        lease; a version another process committed is left to it)."""
        if (self.compact_max_runs is None or self._lookup is None
                or self._compaction is not None
                or not self.store.committed_here(self.attached_version, self._reader.commit_id)
                or self.attached_runs() <= self.compact_max_runs):
            return
        version = self.attached_version
        future = self.store.compact_async(version, self.compact_max_runs,
                                          key_groups=(self._lookup.start, self._lookup.end))
        self._compaction = (version, future)

    def poll_compaction(self, wait: bool = False) -> bool:
        """Take up the background compaction when it finished (with ``wait``: after waiting
        for it): re-attach to the attached version's manifest when the compaction replaced it
        (module docstring, "Background compaction") and it is the same commit, then ask for
        the next compaction if the chains are still too long. A compaction that raised is
        counted (``compaction_failures``, :attr:`last_compaction_error`) and changes nothing:
        the backend stays on the runs it reads. Returns True when the backend re-attached.
        Called at every safe point (:meth:`evict`, ``notify_checkpoint_complete``); public for
        callers that want to wait (tests, a shutdown)."""
        pending = self._compaction
        if pending is None or not (wait or pending[1].done()):
            return False
        self._compaction = None
        version, future = pending
        try:
            future.result()
        except Exception as exc:  # noqa: BLE001 - a background failure is reported, not raised
            self._stats["compaction_failures"] += 1
            self.last_compaction_error = f"{type(exc).__name__}: {exc}"
            return False
        switched = False
        old = self._reader
        # The compaction replaced the manifest of its version and of the later versions still
        # chained onto the runs it merged: re-read the attached one when it is one of those.
        if old is not None and version <= self.attached_version:
            try:
                switched = self._attach(self.attached_version, commit_id=old.commit_id,
                                        unless_checksum=old.manifest["checksum_xxh64"])
            except (CheckpointError, OSError) as exc:  # gone or unreadable: stay on the old runs
                self._stats["compaction_failures"] += 1
                self.last_compaction_error = f"{type(exc).__name__}: {exc}"
            if switched:
                self._stats["compactions"] += 1
        self._maybe_compact()
        return switched

    def _attach(self, version: int, commit_id: str | None = None,
                unless_checksum: str | None = None) -> bool:
        """Open the run lookup of committed ``version`` for this backend's key groups, keeping
        the previous lookup's cached blocks of the files the version still lists
        (RunLookup.take_cache). With ``commit_id`` only a manifest of that commit is attached,
        with ``unless_checksum`` only one whose ``checksum_xxh64`` differs (False, nothing
        changed, otherwise)."""
        reader = self.store.open(version)
        if ((commit_id is not None and reader.commit_id != commit_id)
                or (unless_checksum is not None
                    and reader.manifest["checksum_xxh64"] == unless_checksum)):
            reader.release()
            return False
        try:
            r = KeyGroupRange.of(reader.key_group_range)
            mine = self.key_group_range.intersection(r)
            lookup = RunLookup(reader, (mine.start, mine.end) if len(mine) else None,
                               cache_bytes=self.cache_bytes)
        except BaseException:
            reader.release()
            raise
        old, old_reader = self._lookup, self._reader
        if old is not None:
            lookup.take_cache(old)
        self._lookup, self._reader = lookup, reader
        self._lookup_states = frozenset(m["name"] for m in reader.state_metas())
        self.attached_version = version
        if old is not None:
            old.close()
            old_reader.release()
        return True

    def _detach(self) -> None:
        if self._lookup is not None:
            self._lookup.close()
            self._reader.release()
        self._lookup = self._reader = None
        self.attached_version = None

    # ------------------------------------------------------------------ snapshots
    def snapshot(self, incremental: bool = False):
        """As :meth:`NativeBackend.snapshot`; once attached always incremental on top of the
        attached version (memory does not hold the whole state)."""
        snap = super().snapshot(incremental or self._lookup is not None)
        if self._removed:
            self._removed_pending[snap.snapshot_id] = self._removed
            self._removed = {}
        if self._spills.runs:
            snap = SpilledSnapshot(snap, self._spills.runs, self._spills, set(self._tables))
            self._snapshot_spill_seq[snap.snapshot_id] = snap.spill_seq
        return snap

    def notify_checkpoint_complete(self, snapshot_id: int, version: int | None = None,
                                   commit_id: str | None = None) -> None:
        """As :meth:`KeyedStateBackend.notify_checkpoint_complete`; the backend then attaches
        to ``version`` (the state's runs now include the snapshot's changes), which it needs:
        InvalidInputError without it (nothing changed then)."""
        self.check_open()
        if version is None:
            raise InvalidInputError("a tiered backend needs the committed version in "
                                    "notify_checkpoint_complete: it attaches to its runs")
        before = self.base_snapshot_id
        super().notify_checkpoint_complete(snapshot_id, version, commit_id)
        if self.base_snapshot_id != before:
            self._attach(int(version))
            # A compaction of the version left behind is no use to this backend any more.
            self.poll_compaction()
            self._maybe_compact()
            self._removed_pending = {sid: s for sid, s in self._removed_pending.items()
                                     if sid > snapshot_id}
            # The version holds the spill runs the snapshot merged (and older ones).
            merged = [seq for sid, seq in self._snapshot_spill_seq.items() if sid <= snapshot_id]
            if merged:
                self._spills.retire_through(max(merged))
            self._snapshot_spill_seq = {sid: seq for sid, seq in
                                        self._snapshot_spill_seq.items() if sid > snapshot_id}

    def restore(self, snapshot_like) -> None:
        """Attach to the committed version of ``snapshot_like`` (a ``CheckpointReader`` of this
        backend's store): its states are registered, its timers and nothing else loaded; reads
        fetch entries from the version's runs from then on. InvalidInputError for another kind
        of source, a backend holding entries already, or a state kind the tiered mode does not
        hold; StateMigrationError as NativeBackend.restore for incompatible states."""
        self.check_open()
        version = base.checkpoint_version(snapshot_like)
        if version is None:
            raise InvalidInputError("a tiered backend restores by attaching a committed "
                                    "version: pass a CheckpointReader (CheckpointStore.open)")
        if self._lookup is not None or self.num_entries() or self._spills.runs:
            raise InvalidInputError("a tiered backend attaches one version, into an empty "
                                    "backend")
        base.check_snapshot_compatible(self, snapshot_like)
        tables = []
        for meta in snapshot_like.state_metas():
            if meta["kind"] == "timers" or is_operator_state_meta(meta):
                continue
            if meta["kind"] not in TIERED_KINDS:
                raise InvalidInputError(
                    f"state {meta['name']!r}: {meta['kind']} state is not supported by the "
                    "tiered mode yet")
            table = self._table_for_restore(meta)
            if self._restore_migration(table, meta) is not None:
                raise InvalidInputError(
                    f"state {meta['name']!r}: TTL migration is not supported by the tiered mode")
            tables.append(table)
        timers = self.timers.stage_restore(snapshot_like)
        self._attach(version)
        self._maybe_compact()
        for table in tables:
            self._tables.setdefault(table.name, table)
        self.timers.apply_restore(timers)
        self._removed, self._removed_pending, self._held = {}, {}, {}
        self._contents_are_base(version=version,
                                commit_id=base.checkpoint_commit_id(snapshot_like))

    def dispose(self) -> None:
        # A background compaction in flight finishes in the store's thread (CheckpointStore.
        # close waits for it); its manifest serves later restores.
        self._compaction = None
        self._detach()
        self._spills.close()
        super().dispose()

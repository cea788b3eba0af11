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
  until they fit, those not touched in the last epoch first -- a clean entry's stamp is the
  epoch of its last write, or the one before the base when loaded since it, so a key a stream
  touches every interval gets a second chance, as CLOCK's reference bit gives one.
  Dirty entries are never evicted: they exist nowhere else until the next
  checkpoint completes. Snapshots are copy-on-write views (state-map.md "Snapshots are
  versions"), so an eviction -- a removal from the live map -- never changes what a running
  snapshot lists. Dirty entries beyond the budget are not spilled: memory grows past the
  budget until the next completed checkpoint makes them clean; ``tiered_statistics()`` reports
  it (``over_budget_batches``, ``dirty_bytes_peak``).
* **Snapshots.** Once attached, every snapshot is incremental on top of V (a full one would
  need the whole state in memory): ``snapshot(incremental=False)`` takes an incremental one.

Invariants:

* T1 while attached to V (of the maps' base b): every clean entry's bytes are V's value of its
  key; every dirty entry has ``modified >= b``.
* T2 a key whose entry is absent from memory and in no removed set has V's value (or is absent
  from V too); a key in a removed set is absent unless memory holds it.
* T3 a key is loaded (when V holds it) before any read or removal touches it, so every removal
  of a key present in the logical state is a logged removal of a present entry.
* T4 eviction removes clean entries only, without logging.

Scope: value, reducing and aggregating states (TTL'd or not; the stored bytes, TTL suffix
included, are what the runs hold, and expired values read from V are treated as the kernels
treat expired entries in memory). An aggregating state's accumulator is one entry per key and
namespace, as a reducing state's value: ``add`` and ``add_batch`` are read-modify-writes that
load first; its batch calls take the shared per-row path over the table (no kernel), so they
load the rows' keys in one lookup and hold eviction until the last row is applied
(:meth:`TieredBackend.eviction_held`). ``merge_namespaces`` reads and removes through the
same per-record table calls. ``keys`` and ``apply_to_all_keys`` merge V's keys with memory
one key group at a time (:meth:`TieredBackend._key_namespaces`). List and map states are
refused at registration (InvalidInputError naming the kind), as are TTL migrations and
``apply_changes``. Timers and operator state are held in
memory as in the native backend. A batch call takes a constant number of Python steps whatever
its rows: one native call encodes the rows' keys with the kernels' encoder and returns those
memory lacks, each once (``NativeStateTable.batch_encoded_keys``); one
:meth:`RunLookup.lookup_batch` fetches them (blocks read together on its thread pool, opened and
searched natively with the GIL released); one native call loads them as clean entries
(``load_clean``); then the native kernel applies the batch.

Thread contract: the native backend's.
"""

from __future__ import annotations

import contextlib
import re

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
from statecore.backends.native import NativeBackend, NativeTable
from statecore.checkpoint.lookup import DEFAULT_CACHE_BYTES, RunLookup
from statecore.checkpoint.store import CheckpointStore
from statecore.errors import InvalidInputError
from statecore.key_groups import KeyGroupRange
from statecore.operator_state import is_operator_state_meta
from statecore.serializers import key_serializer

__all__ = ["TieredBackend", "TieredTable", "parse_bytes", "TIERED_KINDS"]

#: State kinds a tiered backend holds.
TIERED_KINDS = ("value", "reducing", "aggregating")

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
            if not backend.rows_loaded:
                backend.load_keys(self, [k])
            out = get_stored(kg, k)
            backend.evict()
            return out

        def put(kg: int, k, stored) -> None:
            put_stored(kg, k, stored)
            backend.evict()

        def remove(kg: int, k) -> None:
            if not backend.rows_loaded:
                backend.load_keys(self, [k])
            remove_key(kg, k)
            backend.note_removed(self, [k])
            backend.evict()

        self.get, self.put, self.remove = get, put, remove


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
    :class:`~statecore.checkpoint.store.CheckpointStore` (or its URI or local path) whose
    versions the backend attaches to. ``cache_bytes``: the block cache of the run lookups
    (decoded blocks, outside the budget; default 64 MiB). Other options as
    :class:`~statecore.backends.native.NativeBackend`. InvalidInputError for a bad budget or a
    missing store.
    """

    #: Restores attach the version's runs instead of reading them
    #: (CheckpointStore.restore then prefetches nothing).
    attaches_runs = True

    state_classes = {"value": TieredValueState, "reducing": TieredReducingState,
                     "aggregating": TieredAggregatingState}
    ttl_state_classes = {"value": TieredTtlValueState, "reducing": TieredTtlReducingState,
                         "aggregating": TieredTtlAggregatingState}

    def __init__(self, *, memory_budget, checkpoint=None, cache_bytes: int = DEFAULT_CACHE_BYTES,
                 **options):
        self.memory_budget = parse_bytes(memory_budget)
        self.cache_bytes = parse_bytes(cache_bytes, "cache_bytes")
        if checkpoint is None:
            raise InvalidInputError("a tiered backend (memory_budget) needs checkpoint=: the "
                                    "CheckpointStore, URI or path holding its state")
        super().__init__(**options)
        self.store = checkpoint if isinstance(checkpoint, CheckpointStore) \
            else CheckpointStore(checkpoint)
        self._lookup: RunLookup | None = None
        self._reader = None
        self._lookup_states: frozenset = frozenset()
        self.attached_version: int | None = None
        self._evict_holds = 0  # eviction_held() depth: evict() drops nothing while > 0
        #: rows_held() depth: while > 0 the per-record table calls load nothing (a batch call
        #: loaded the keys of its rows, and eviction is held)
        self.rows_loaded = 0
        self._removed: dict[str, set] = {}  # this epoch's removed keys, per state
        self._removed_pending: dict[int, dict[str, set]] = {}  # snapshot id -> removed keys
        self._stats = {"loaded": 0, "fetched_keys": 0, "fetch_batches": 0, "evicted": 0,
                       "over_budget_batches": 0, "dirty_bytes_peak": 0}

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
        memory. Unattached (or V without the state): memory alone, as the native backend."""
        table = self._tables.get(state_name)
        if table is None or not self.reads_runs(table) or not len(kgs):
            yield from super()._key_namespaces(state_name, kgs)
            return
        native = table.native
        in_runs = set(self._reader.key_groups_holding(state_name, kgs.start, kgs.end))
        busy = in_runs | {kg for kg in kgs if native.key_group_size(kg)}
        if not busy:
            return
        snap = native.snapshot()
        try:
            for kg in sorted(busy):
                held = set(snap.entries(kg)[0].to_pylist()) if native.key_group_size(kg) \
                    else set()
                if kg in in_runs:
                    keys, values = snap.changes(kg, snap.base_version)
                    gone = set(keys.filter(values.is_null()).to_pylist())
                    held.update(k for k in self._reader.entries(state_name, kg)[0].to_pylist()
                                if k not in gone)
                yield kg, self._decoded_rows(table, held)
        finally:
            snap.release()

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
        """Whether keys of ``table``'s state may be loaded from the attached version (one is
        attached and holds the state)."""
        return self._lookup is not None and table.name in self._lookup_states

    def load_keys(self, table: TieredTable, encoded, absent: bool = False) -> int:
        """Load the keys of ``encoded`` (encoded keys of ``table``'s state and this backend's
        key groups: a list of bytes or a ``pa.binary()`` array; repeats allowed) that memory
        lacks and no removed set holds from the attached version, as clean entries, with one
        lookup. ``absent``: the keys are unique and memory lacks each (batch_encoded_keys said
        so). Returns the entries loaded (0 when not attached)."""
        if not len(encoded) or not self.reads_runs(table):
            return 0
        keys = encoded if isinstance(encoded, pa.Array) else pa.array(encoded, pa.binary())
        if not absent:
            keys = pc.unique(keys)
            keys = keys.filter(table.native.absent_keys(keys, self.key_prefix_width))
        removed = [s[table.name] for s in (self._removed, *self._removed_pending.values())
                   if table.name in s]
        if removed and len(keys):
            keep = [not any(k in s for s in removed) for k in keys.to_pylist()]
            keys = keys.filter(pa.array(keep, pa.bool_()))
        if not len(keys):
            return 0
        values = self._lookup.lookup_batch(table.name, keys)
        n = table.native.load_clean(keys, values, self.key_prefix_width)
        st = self._stats
        st["fetch_batches"] += 1
        st["fetched_keys"] += len(keys)
        st["loaded"] += n
        return n

    def note_removed(self, table: TieredTable, encoded) -> None:
        """Record removals of the keys of ``encoded`` (a list of bytes or a ``pa.binary()``
        array) from ``table``'s state (module docstring,
        T2), attached or not: a snapshot taken before the removal may complete later, and the
        version it becomes holds the keys."""
        if isinstance(encoded, pa.Array):
            encoded = encoded.to_pylist()
        if encoded:
            self._removed.setdefault(table.name, set()).update(encoded)

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
        """Drop clean entries until :meth:`state_bytes` fits the budget (or none is left);
        returns how many were dropped (0 inside :meth:`eviction_held`). Counted in
        :meth:`tiered_statistics`."""
        if self._evict_holds:
            return 0
        total = self.state_bytes()
        if total <= self.memory_budget:
            return 0
        n = 0
        for table in self._tables.values():
            excess = total - self.memory_budget
            if excess <= 0:
                break
            before = table.native.nbytes
            n += table.native.evict_clean(max(0, before - excess))
            total -= before - table.native.nbytes
        st = self._stats
        st["evicted"] += n
        if total > self.memory_budget:
            st["over_budget_batches"] += 1
            st["dirty_bytes_peak"] = max(st["dirty_bytes_peak"], total)
        return n

    def tiered_statistics(self) -> dict:
        """Counters of the tiered mode: ``loaded`` (entries loaded from the attached version),
        ``fetched_keys`` / ``fetch_batches`` (keys asked of the run lookups and the lookups
        made), ``evicted`` (clean entries dropped), ``over_budget_batches`` (eviction checks
        that ended above the budget: dirty entries alone exceeded it), ``dirty_bytes_peak``
        (the most bytes held after such a check), ``memory_budget``, ``state_bytes`` (now),
        ``attached_version`` (None: not attached) and the lookup's own statistics under
        ``lookup`` (RunLookup.statistics; {} when not attached)."""
        return dict(self._stats, memory_budget=self.memory_budget,
                    state_bytes=self.state_bytes(), attached_version=self.attached_version,
                    lookup=self._lookup.statistics() if self._lookup is not None else {})

    def _attach(self, version: int) -> None:
        """Open the run lookup of committed ``version`` for this backend's key groups, keeping
        the previous lookup's block cache (its keys name immutable files)."""
        reader = self.store.open(version)
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
            lookup.cache = old.cache
        self._lookup, self._reader = lookup, reader
        self._lookup_states = frozenset(m["name"] for m in reader.state_metas())
        self.attached_version = version
        if old is not None:
            old.close()
            old_reader.release()

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
            self._removed_pending = {sid: s for sid, s in self._removed_pending.items()
                                     if sid > snapshot_id}

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
        if self._lookup is not None or self.num_entries():
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
        for table in tables:
            self._tables.setdefault(table.name, table)
        self.timers.apply_restore(timers)
        self._removed, self._removed_pending = {}, {}
        self._contents_are_base(version=version,
                                commit_id=base.checkpoint_commit_id(snapshot_like))

    def dispose(self) -> None:
        self._detach()
        super().dispose()

"""The keyed state backend protocol, the state interfaces and the StateSnapshot protocol.

Every backend (``python``: the reference; ``native``: the C++ engine) subclasses
:class:`KeyedStateBackend` and implements the state interfaces below with the same observable
behaviour; ``statecore.testing.conformance.BackendConformance`` checks that.

Common rules (both backends):

* Keys have the backend's ``key_type`` (:mod:`statecore.key_types`: int32, int64, uint64,
  float64, bool, timestamp[s|ms|us|ns], string, binary, fixed_size_binary[N], or a multi-column
  ``struct<...>`` of those, given as a tuple/list of types or a pa.struct); each key belongs to
  the key group given by the backend's assigner ("spark" or "flink", :mod:`statecore.key_groups`).
  Per record a key is its canonical Python value (an int for timestamps -- a datetime is
  accepted -- a float with -0.0 read as 0.0 and one NaN, a tuple for a multi-column key;
  ``current_key`` returns that form). A key whose key group is outside the backend's key-group
  range, a None key (or None field) or a key of the wrong type raises InvalidInputError, and
  nothing is modified.
* Every state object has its own current namespace (``set_current_namespace``). States of
  namespace type ``void`` use the VoidNamespace (None) and accept only None; for the other
  namespace types (int32, int64, string, binary) a namespace must be set before use.
  Reducing, aggregating and list states merge namespaces of the current key
  (``merge_namespaces(target, sources)``, Flink ``InternalMergingState``) for merging windows.
* Per-record reads: ``ValueState.value()`` returns a copy of the descriptor default when absent;
  ``ListState.get()`` returns ``[]``; ``MapState.get(uk)`` returns None for an absent user key;
  ``ReducingState.get()``/``AggregatingState.get()`` return None when absent.
  Map iteration (``items``/``keys``/``values``) is in insertion order (after a restore: by
  serialized user key, :class:`MapState`).
* Writes: ``ValueState.update(None)`` clears. ``ListState.add(None)`` or a None element in
  ``add_all``/``update`` raises InvalidInputError (Flink). ``ListState.update([])`` clears. Removing
  the last user key of a map clears the map (Flink heap). ``add(None)`` on reducing/aggregating
  state is a no-op. A value that does not fit the value type (e.g. an int64 sum overflow) raises
  InvalidInputError and leaves the state unchanged.

Batch API (``get_batch``/``put_batch``/``clear_batch``/``contains_batch`` on ValueState;
``get_batch``/``add_batch``/``clear_batch`` on ReducingState and AggregatingState;
``append_batch``/``get_batch``/``clear_batch`` on ListState;
``put_batch``/``get_batch``/``contains_batch``/``remove_batch``/``clear_batch`` on MapState, one
row per (key, user key)) -- does not change the backend's current key:

* Arrow inputs (keys, values, namespaces, map user keys, timer timestamps) are read through
  :func:`statecore.arrow_input.import_arrow`: a pa.Array, a pa.ChunkedArray, any object with
  ``__arrow_c_stream__`` (the Arrow C stream interface: pyarrow
  Table/RecordBatchReader/ChunkedArray, polars Series and DataFrames, nanoarrow streams, ...; read
  to its end before any state changes, its chunks kept as the producer's buffers) or with
  ``__arrow_c_array__`` (pa.RecordBatch, nanoarrow arrays, ...). A record batch or record-batch
  stream with exactly one column is read as that column where a column is expected (not for
  ``count`` / aggregating values, which take any type as it comes: there a struct is a value). A
  stream that fails mid-way raises InvalidInputError and changes nothing. Chunk boundaries need not
  match between the inputs of one call.
* ``keys``: such an input whose type is
  exactly the key type's Arrow type: int32, int64, uint64, float64, bool; timestamp of the key
  type's unit (any time zone); string or large_string; binary or large_binary;
  fixed_size_binary(N) of the key type's width; for a multi-column key a struct array (or a
  stream of record batches of the key columns) whose fields have those types in order (any
  names), or a list/tuple of one input per column. Sliced arrays (offset != 0) and chunked
  arrays are honoured. A null key (or a null field of a multi-column key), a wrong type, or a
  key outside the key-group range raise InvalidInputError before anything changes, in
  whichever chunk they are.
* ``values``: same length as ``keys`` (else InvalidInputError) and the value type's Arrow type
  (``ValueSerializer.accepts``: large_string/large_binary accepted, timestamps of the value
  type's unit in any time zone, fixed_size_binary of its width; another type raises naming the
  expected and the given type). For a ``count`` reducer any Arrow type is accepted. States whose
  value type is ``pickle`` do not support the batch API (InvalidInputError).
* ``namespaces``: ``None`` -> every row uses the state's current namespace (the VoidNamespace for
  void states; for other namespace types it must have been set); a pa.Array (or ChunkedArray /
  ``__arrow_c_array__``) of the namespace type's Arrow type, same length, no nulls -> one namespace
  per row; any other value -> that single namespace for every row (validated like
  ``set_current_namespace``). Void states accept only ``None``.
* ``put_batch``: a null value clears that key. ``add_batch``: a null value leaves the state
  unchanged and outputs the current aggregate (null if none). Rows with the same key apply in row
  order. ``get_batch`` returns nulls where absent (descriptor defaults are not applied).
* ``append_batch``: ``values`` of the element type (one element per row) or a list /
  large_list of it (the row's elements, appended as one ``add_all`` call: one TTL timestamp);
  null elements raise, a null or empty list row appends nothing. List ``get_batch`` returns a
  ``list<element type>`` array, ``[]`` where absent (what ``get()`` returns).
* Map batch calls take ``user_keys`` (the user key type's Arrow type, no nulls, same length);
  ``put_batch`` values must not be null (``remove_batch`` removes); ``get_batch`` returns the
  value type, null where absent; ``contains_batch`` a bool array. Pickle user keys or values do
  not support the batch API.
* Outputs: pa.Array of the value type's Arrow type (``count`` -> int64; timestamps without a
  time zone), one row per input row;
  ``add_batch`` returns the running aggregate after each row.
* A batch that raises leaves every state exactly as it was.

Thread contract (both backends): a backend -- its states, timers, ``snapshot``, ``restore``,
``dispose`` -- is used by one thread at a time. The native backend's batch kernels run without the
GIL (the Arrow import and validation in Python hold it; the kernel loops, chunk after chunk,
do not), so while one runs, other Python threads run too: they may use *other* backends (their
kernels then run in parallel: kernels share no mutable state) and read snapshots taken earlier
(copy-on-write isolates them, as for asynchronous checkpoints), but must not call anything on
this backend; a call on a state whose kernel is running in another thread raises StateError
instead of racing (a guard, not a lock: misuse across different states is not detected). The
producer's Arrow buffers are read in place until the call returns and must not be modified
meanwhile. The pure-Python backend never releases the GIL in a batch call.

Snapshots: :meth:`KeyedStateBackend.snapshot` returns a :class:`StateSnapshot` that is isolated
from later writes. :meth:`KeyedStateBackend.restore` loads the key groups of the snapshot that
fall inside the backend's key-group range and may be called several times (e.g. one operator of a
rescaled job restores from every old operator's snapshot); entries of the same key are overwritten.
It raises StateMigrationError when the key type, max parallelism or assigner differ, or when a
state's meta conflicts with an already registered state of the same name.
Incremental snapshots (docs/architecture.md "Contract: StateSnapshot"):
``snapshot(incremental=True)`` lists only what changed since the backend's *base*: for every
(state, key, namespace) written or removed since then, sorted by encoded key, either the present
value or a NULL value (tombstone: absent now). A key written and removed again after the base is
listed as a tombstone too (harmless: a merge deletes what is not there). Timers (``__timers__``)
are always complete. Every snapshot has ``snapshot_id`` (1, 2, ... per backend) and
``incremental``. After a TTL migration (``StateDescriptor.enable_ttl_migration``) an incremental
snapshot is taken as a full one (``incremental`` False) until a snapshot taken after the
migration completes: the base holds the migrated state in its old format, so changes against it
could not be merged. The base is the empty state for a fresh backend, the state right after the last
:meth:`KeyedStateBackend.restore`, or the snapshot whose id was last passed to
:meth:`KeyedStateBackend.notify_checkpoint_complete` (the base only moves forward: an id not newer
than the base is ignored; an id never issued raises InvalidInputError). An incremental snapshot
taken while earlier ones never completed holds everything since the base. Both backends list
byte-identical changes for the same history (conformance suite), except after an ``add_batch``
rejected by an int64 sum overflow: the native kernel's rollback rewrites the touched entries, so
the native backend may then list them (with their unchanged values) or tombstones for keys it
created and rolled back -- merging still gives the same state.
Enumerating keys (Flink ``getKeys`` / ``applyToAllKeys``): :meth:`KeyedStateBackend.keys` lists
the keys holding a value of a state (optionally in one namespace) by key group and serialized key
bytes, TTL-expired entries not yet cleaned up included, as Flink;
:meth:`KeyedStateBackend.apply_to_all_keys` calls a function per such key with the current key set
and restores the previous one. :meth:`KeyedStateBackend.dispose` (alias ``close``) ends the
backend: every later call on it, its states and its timers raises StateError.
``num_entries()`` counts (state, key, namespace) entries holding a value (a whole list or map is one
entry), timers excluded; ``state_bytes()`` is the size of their encoded keys plus serialized values.
Timers are counted by ``backend.timers.num_timers()``.
"""

from __future__ import annotations

import abc
import threading
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa

from statecore import key_groups as K
from statecore import serializers as S
from statecore.arrow_input import batch_namespace_array, combined, is_arrow_input
from statecore.errors import InvalidInputError, StateError, StateMigrationError
from statecore.key_groups import KeyGroupRange
from statecore.operator_state import OperatorStateStore
from statecore.timers import TimerService
from statecore.ttl import wall_clock_ms

#: Cleanup strategies counted by KeyedStateBackend.ttl_statistics().
TTL_CLEANUP_STRATEGIES = ("read", "full_snapshot", "incremental", "background", "migration")
_INT64_MIN = -(2**63)

__all__ = [
    "KeyedStateBackend",
    "State",
    "ValueState",
    "ListState",
    "MapState",
    "ReducingState",
    "AggregatingState",
    "StateSnapshot",
    "checkpoint_version",
    "checkpoint_commit_id",
    "NAMESPACE_TYPES",
    "resolve_batch_namespaces",
    "check_snapshot_compatible",
]

NAMESPACE_TYPES = ("void", "int32", "int64", "string", "binary")

def checkpoint_version(snapshot_like) -> int | None:
    """The checkpoint version a restore source holds (a ``CheckpointReader`` or
    ``ChangesReader``: their ``version``), None for other snapshot-likes."""
    v = getattr(snapshot_like, "version", None)
    return int(v) if isinstance(v, (int, np.integer)) and not isinstance(v, bool) else None


def checkpoint_commit_id(snapshot_like) -> str | None:
    """The commit id of the checkpoint version a restore source holds (a ``CheckpointReader``
    or ``ChangesReader``: their ``commit_id``, which tells two commits of the same version
    number apart), None for other snapshot-likes and versions committed without one."""
    c = getattr(snapshot_like, "commit_id", None)
    return c if isinstance(c, str) else None


@runtime_checkable
class StateSnapshot(Protocol):
    """What checkpoints write and restores read (docs/architecture.md).

    ``max_parallelism``, ``key_group_range`` (KeyGroupRange), ``key_type``, ``assigner``;
    ``state_metas()`` -> list of JSON-able dicts (name, kind, namespace_type, value_type, ...);
    ``entries(state_name, key_group)`` -> (keys: pa.BinaryArray, values: pa.BinaryArray) sorted
    ascending by key bytes; ``release()`` idempotent. Snapshots taken by a backend also carry
    ``snapshot_id`` (int) and ``incremental`` (bool): an incremental snapshot's values are NULL
    for removed keys (tombstones) and list only changes (see the module docstring); readers such
    as checkpoint readers may lack both attributes (they are then full).
    """

    max_parallelism: int
    key_group_range: KeyGroupRange
    key_type: str
    assigner: str

    def state_metas(self) -> list[dict]:
        """One JSON-able dict per state (``StateDescriptor.meta`` plus ``namespace_type``),
        the ``__timers__`` pseudo-state included; a new list on every call."""
        ...

    def entries(self, state_name: str, key_group: int) -> tuple[pa.Array, pa.Array]:
        """``(keys, values)``: two ``pa.binary()`` arrays of equal length, the encoded keys
        and serialized values (docs/formats.md) of ``state_name`` in ``key_group``, ascending
        by key bytes; an incremental snapshot's values are null for tombstones. Raises
        InvalidInputError for an unknown state or a key group outside ``[0, max_parallelism)``
        (checkpoint readers: outside ``key_group_range``), StateError (from checkpoint readers
        its subclass CheckpointError) after :meth:`release`."""
        ...

    def release(self) -> None:
        """Free what the snapshot holds (copy-on-write maps stop copying for it, readers close
        their files); idempotent."""
        ...


# --------------------------------------------------------------------------- batch helpers

def resolve_batch_namespaces(namespaces, state: "State", length: int) -> list:
    """Per-row namespaces as a Python list (see module docstring for the rules)."""
    if namespaces is None:
        return [state.require_current_namespace()] * length
    if state.namespace_type == "void":
        raise InvalidInputError("a state with the void namespace accepts only namespaces=None")
    if is_arrow_input(namespaces):
        return combined(batch_namespace_array(namespaces, state.namespace_type, length)).to_pylist()
    return [S.key_serializer(state.namespace_type).check(namespaces)] * length


def check_snapshot_compatible(backend: "KeyedStateBackend", snap) -> None:
    """Raise StateMigrationError unless ``snap`` has the backend's key type, max parallelism and
    assigner (rescaling changes parallelism, never max parallelism); InvalidInputError when it
    is no snapshot at all (e.g. None: ``CheckpointStore.open_changes`` found no change set)."""
    missing = [a for a in ("key_type", "max_parallelism", "assigner", "key_group_range",
                           "state_metas") if not hasattr(snap, a)]
    if missing:
        raise InvalidInputError(
            f"expected a snapshot or checkpoint reader, got {type(snap).__name__} (no "
            f"{', '.join(missing)})")
    for attr in ("key_type", "max_parallelism", "assigner"):
        mine, theirs = getattr(backend, attr), getattr(snap, attr)
        if mine != theirs:
            raise StateMigrationError(
                f"snapshot has {attr}={theirs!r} but the backend has {attr}={mine!r}")


# --------------------------------------------------------------------------- backend

class KeyedStateBackend(abc.ABC):
    """Keyed state of one operator instance: the key groups of ``key_group_range``.

    Args: ``key_type`` (a key type of :mod:`statecore.key_types`: a name such as ``"int64"``,
    ``"timestamp[us]"``, ``"fixed_size_binary[16]"``, a pyarrow type, or a tuple/list of them for
    a multi-column key), ``max_parallelism``
    (1..32768, number of key groups), ``key_group_range`` (KeyGroupRange or (start, end), default
    all key groups), ``assigner`` ("spark"|"flink"), ``timer_namespace_type`` (namespace type of
    timers, default "void"), ``ttl_clock`` (processing-time clock of TTL states: a callable
    returning milliseconds, default the wall clock; see :mod:`statecore.ttl`). Raises
    InvalidInputError on bad arguments.

    Attributes: ``key_type`` (the normalized key type name), ``key_serializer`` (its
    :class:`~statecore.serializers.KeySerializer`), ``max_parallelism``, ``key_group_range``,
    ``assigner``, ``timers`` (the :class:`~statecore.timers.TimerService`), ``ttl_clock``,
    ``operator_state`` (the :class:`~statecore.operator_state.OperatorStateStore`: non-keyed
    state of this operator instance, part of every snapshot; :meth:`restore` leaves it alone,
    ``operator_state.restore`` redistributes it).
    """

    def __init__(self, key_type="int64", max_parallelism: int = 128, key_group_range=None,
                 assigner: str = "spark", timer_namespace_type: str = "void", ttl_clock=None):
        self.key_type = K.normalize_key_type(key_type)
        self.max_parallelism = K.check_max_parallelism(max_parallelism)
        if key_group_range is None:
            kgr = KeyGroupRange.all(self.max_parallelism)
        else:
            kgr = KeyGroupRange.of(key_group_range)
            if not kgr.is_empty() and kgr.end >= self.max_parallelism:
                raise InvalidInputError(
                    f"key-group range {kgr} exceeds max_parallelism {self.max_parallelism}"
                )
        self.key_group_range = kgr
        if assigner not in K.ASSIGNERS:
            raise InvalidInputError(f"unknown assigner {assigner!r}; expected 'spark' or 'flink'")
        self.assigner = assigner
        self.key_serializer = S.key_serializer(self.key_type)
        self._current_key = None
        self._current_key_group = None
        #: ``threading.get_ident()`` of the thread that set the current key (None: no key):
        #: per-record calls from any other thread raise StateError (require_current_key).
        self.current_key_thread = None
        self._closed = False
        self.timers = TimerService(self, timer_namespace_type)
        self.operator_state = OperatorStateStore(self)
        # Snapshot ids: the last one issued and the base (last completed id, or the last id issued
        # before the latest restore: ids up to it are older than the restored state).
        self._last_snapshot_id = 0
        self._base_snapshot_id = 0
        self._restores = 0  # restores and applied change sets: each replaces the base
        # The checkpoint version the base is (None: unknown); whether it came from restores.
        self._base_version: int | None = None
        self._base_commit_id: str | None = None  # the base version's commit id, when known
        self._base_from_restore = False
        if ttl_clock is not None and not callable(ttl_clock):
            raise InvalidInputError(f"ttl_clock must be a callable returning ms, got {ttl_clock!r}")
        self.ttl_clock = ttl_clock or wall_clock_ms
        #: Expired entries removed, per cleanup strategy (see ttl_statistics()).
        self._ttl_removed = dict.fromkeys(TTL_CLEANUP_STRATEGIES, 0)
        # Asynchronous checkpoint writers count full-snapshot cleanup from their own thread.
        self._ttl_lock = threading.Lock()
        # {state name: (table, config)} of states cleaned up on every record (set_current_key)
        self._every_record_ttl: dict = {}
        self._bg_ttl_kg = None  # next key group of the background cleanup
        self._ttl_reported: dict = {}  # ttl_statistics() as of the last snapshot
        self._ttl_watermark = _INT64_MIN  # event time of event-time TTL (observe_watermark)
        # The last snapshot id issued before the latest TTL migration (-1: none): while the base
        # is not newer, the base has a state in its old format and snapshots must be full.
        self._ttl_migrated_at = -1

    # ------------------------------------------------------------------ TTL
    def ttl_now(self, config) -> int:
        """Current time (ms) for a state with TTL ``config``: the processing-time clock, or for
        event-time TTL the timers' current watermark (lowest int64 before the first one).
        Raises InvalidInputError when the clock returns something other than an int, or one
        outside int64 (timestamps are stored as int64): the read or write asking is refused
        before it changes anything."""
        if config.event_time:
            return self._ttl_watermark
        now = self.ttl_clock()
        if isinstance(now, bool) or not isinstance(now, int):
            try:
                now = int(now)
            except (TypeError, ValueError, OverflowError):
                raise InvalidInputError(f"ttl_clock returned {now!r}, not milliseconds") from None
        if not -(2**63) <= now < 2**63:
            raise InvalidInputError(f"ttl_clock returned {now}, outside int64 milliseconds")
        return now

    def observe_watermark(self, watermark: int) -> None:
        """Raise the event time of event-time TTL to ``watermark`` (ms) without firing timers:
        the Spark operator calls it with each micro-batch's watermark before the processor runs,
        so writes are stamped with it even on a backend restored from a checkpoint.
        ``timers.advance_watermark`` raises it too; it never moves back.

        The first watermark (the event time moving up from the lowest int64) re-stamps what was
        written before any watermark -- entries stamped with the lowest int64 -- with it, once,
        so they count as written at the first watermark instead of expiring at once (an
        operator's first micro-batch has no watermark). That costs one pass over the event-time
        TTL states, once per backend. InvalidInputError for a non-int64."""
        if isinstance(watermark, (bool, np.bool_)) or not isinstance(watermark, (int, np.integer)):
            raise InvalidInputError(f"watermark must be an int (ms), got {watermark!r}")
        wm = int(watermark)
        if not -(2**63) <= wm < 2**63:
            raise InvalidInputError(f"watermark {wm} does not fit in int64")
        if wm <= self._ttl_watermark:
            return
        first = self._ttl_watermark == _INT64_MIN
        self._ttl_watermark = wm
        if first:
            self._restamp_event_time_ttl(_INT64_MIN, wm)

    @abc.abstractmethod
    def _restamp_event_time_ttl(self, ts_from: int, ts_to: int) -> None:
        """Rewrite the TTL timestamps ``ts_from`` of every event-time TTL state (registered or
        restored) to ``ts_to`` (:meth:`observe_watermark`'s first watermark)."""

    def ttl_statistics(self) -> dict:
        """``{strategy: expired entries removed}`` since the backend was created, for the
        strategies ``read`` (an expired value, list element or map entry counts as one),
        ``full_snapshot`` (entries left out of or trimmed in full snapshots, counted as the
        snapshot is serialized: by snapshot() in the python backend, when read in the native
        one), ``incremental``, ``background`` and ``migration`` (what a TTL migration from TTL on
        to off dropped as expired, ``StateDescriptor.enable_ttl_migration``)."""
        return dict(self._ttl_removed)

    def ttl_state_accessed(self, table, config, accesses: int = 1) -> None:
        """Incremental cleanup after ``accesses`` state accesses of ``table`` (TTL ``config``
        with ``cleanup_incrementally``; a no-op otherwise): ``accesses`` steps of
        ``cleanup_size`` entries each of the table's lazy global iterator (Flink
        ``TtlIncrementalCleanup.stateAccessed``; a step ends early at the end of a pass, the
        next one starts a new pass), the expired things they remove counted as
        ``incremental``. TTL state objects call it before each per-record access, and a batch
        call before each of its rows (:meth:`ttl_batch_accessed`): row ``i`` sees the state
        after the steps of rows ``0..i`` only, as the rows one at a time."""
        if not config.cleanup_size or accesses <= 0:
            return
        _, expired, _ = table.ttl_cleanup_step(self.key_group_range, config.cleanup_size,
                                               config.ttl_ms, self.ttl_now(config), accesses)
        if expired:
            self.count_expired("incremental", expired)

    def ttl_batch_accessed(self, table, config, rows: int) -> int:
        """The incremental cleanup a batch call of ``rows`` rows on the state of ``table`` (TTL
        ``config``, or None) owes, as the same rows one at a time through the per-record API
        (``set_current_key`` and the call): a batch row is a record, so the states with
        ``run_cleanup_for_every_record`` step once a row, and the state itself, when it has
        ``cleanup_incrementally``, once a row more (its access). The steps of other tables are
        run here, ``rows`` each before the batch (the batch touches none of their entries, so
        their order against the rows changes nothing). Returns the steps of ``table`` itself
        the caller runs before each row with :meth:`ttl_state_accessed` (0: none; then the
        call can run its rows without stopping between them)."""
        own = 0
        if self._every_record_ttl:
            for t, cfg in self._every_record_ttl.values():
                if t is table:
                    own += 1
                elif rows > 0:
                    self.ttl_state_accessed(t, cfg, rows)
        if config is not None and config.cleanup_size:
            own += 1
        return own

    @abc.abstractmethod
    def run_background_ttl_cleanup(self, max_key_groups: int = 1) -> int:
        """Background cleanup: for every registered state whose TTL config has
        ``cleanup_in_background``, expire the next ``max_key_groups`` key groups of this
        backend's range entirely (round robin over the range, one cursor per backend), through
        the same copy-on-write map operations as any write (live snapshots are unaffected; the
        removals go into the next incremental checkpoint). Meant for idle time -- the Spark
        operator calls it after each micro-batch's snapshot; the caller owns the backend meanwhile
        (thread contract). Returns the expired values, list elements and map entries removed
        (also counted as ``background`` in :meth:`ttl_statistics`). InvalidInputError for
        ``max_key_groups`` < 1."""

    def _take_ttl_delta(self) -> dict:
        """``{strategy: n}`` removed since the previous call (nonzero only); snapshots carry it
        as ``ttl_expired`` into checkpoint descriptors and manifests."""
        with self._ttl_lock:
            cur = dict(self._ttl_removed)
        prev, self._ttl_reported = self._ttl_reported, cur
        return {k: v - prev.get(k, 0) for k, v in cur.items() if v - prev.get(k, 0)}

    def count_expired(self, strategy: str, n: int = 1) -> None:
        """Count ``n`` expired values, list elements or map entries removed by cleanup
        ``strategy`` (one of :data:`TTL_CLEANUP_STRATEGIES`) in :meth:`ttl_statistics`. State
        objects call it for cleanup on read (``"read"``), snapshots for full-snapshot cleanup;
        safe from an asynchronous checkpoint writer's thread."""
        with self._ttl_lock:
            self._ttl_removed[strategy] += n

    # ------------------------------------------------------------------ keys
    def key_group_of(self, key) -> int:
        """Key group of ``key`` (validated); InvalidInputError when it is not owned here."""
        k = K.check_key(key, self.key_type)
        kg = self._assign_key_group(k)
        if kg not in self.key_group_range:
            raise InvalidInputError(
                f"key {key!r} belongs to key group {kg}, outside this backend's key-group range "
                f"{self.key_group_range}"
            )
        return kg

    def _assign_key_group(self, key) -> int:
        """Key group of a validated key (the native backend computes it natively)."""
        return K.assign_key_group(key, self.key_type, self.max_parallelism, self.assigner)

    def set_current_key(self, key) -> None:
        """Make ``key`` the key of subsequent per-record state calls and timer registrations."""
        self.check_open()
        kg = self.key_group_of(key)
        self._current_key = K.check_key(key, self.key_type)
        self._current_key_group = kg
        self.current_key_thread = threading.get_ident()
        for table, cfg in self._every_record_ttl.values():
            self.ttl_state_accessed(table, cfg)

    @property
    def current_key(self):
        """The key set by :meth:`set_current_key`, in its canonical Python form (an int for a
        timestamp key, -0.0 as 0.0, a tuple for a multi-column key); None before the first."""
        return self._current_key

    @property
    def current_key_group(self):
        """The key group (an int in ``key_group_range``) of :attr:`current_key` under the
        backend's assigner; None before the first :meth:`set_current_key`."""
        return self._current_key_group

    def require_current_key(self):
        """``(current key, its key group)`` for a per-record state call; InvalidInputError when
        no key was set (:meth:`set_current_key`), StateError when another thread set it (the
        per-record API is single-threaded, as Flink's keyed state: a call from a second thread
        would read or write the other thread's key; :attr:`current_key_thread`)."""
        if self._current_key is None:
            raise InvalidInputError("no current key: call set_current_key() first")
        if self.current_key_thread != threading.get_ident():
            raise StateError(
                f"per-record state call from thread {threading.get_ident()}, but the current "
                f"key was set by thread {self.current_key_thread}: a backend serves one thread "
                "at a time; call set_current_key() in this thread first")
        return self._current_key, self._current_key_group

    def _clear_current_key(self) -> None:
        """Back to no current key (what :meth:`apply_to_all_keys` restores when none was set)."""
        self._current_key = None
        self._current_key_group = None
        self.current_key_thread = None

    # ------------------------------------------------------------------ enumerating keys
    def _key_group_subrange(self, key_group_range) -> KeyGroupRange:
        """``key_group_range`` (a KeyGroupRange or (start, end)) checked to lie inside the
        backend's range; the backend's range for None."""
        if key_group_range is None:
            return self.key_group_range
        r = KeyGroupRange.of(key_group_range)
        if not r.is_empty() and not (r.start in self.key_group_range
                                     and r.end in self.key_group_range):
            raise InvalidInputError(
                f"key-group range {r} is not inside this backend's key-group range "
                f"{self.key_group_range}")
        return r

    def keys(self, state_name: str, namespace=None, key_group_range=None) -> list:
        """The keys holding a value of state ``state_name`` (registered or restored), each once
        (Flink ``KeyedStateBackend.getKeys(state, namespace)``): with ``namespace`` only those
        holding a value in that namespace (validated against the state's namespace type; ignored
        for ``void`` states), else in any namespace. A list, ordered by key group and within one
        key group by the key's serialized bytes (the same order in every backend); keys in their
        canonical Python form, as :attr:`current_key` returns them (a tuple for a multi-column
        key, an int for a timestamp key). ``key_group_range`` (KeyGroupRange or (start, end))
        restricts the key groups; it must lie inside the backend's range. TTL: as Flink's
        ``getKeys``, entries that expired but were not cleaned up yet are listed (a read through
        the state then finds them absent and removes them). The list is collected before it is
        returned, so the caller may change state while walking it. Raises InvalidInputError for
        an unknown state, a bad namespace or range, StateError once disposed."""
        self.check_open()
        kgs = self._key_group_subrange(key_group_range)
        ns_type = self._state_namespace_type(state_name)
        if ns_type is None:
            raise InvalidInputError(f"no state named {state_name!r} in this backend")
        only = namespace is not None and ns_type != "void"
        if only:
            namespace = S.key_serializer(ns_type).check(namespace)
        out = []
        for _, rows in self._key_namespaces(state_name, kgs):
            seen = {}
            for kb, key, ns in rows:
                if not only or ns == namespace:
                    seen.setdefault(kb, key)
            out.extend(seen[kb] for kb in sorted(seen))
        return out

    def apply_to_all_keys(self, descriptor, function, namespace=None, *, namespace_type=None,
                          key_group_range=None) -> None:
        """Call ``function(key, state)`` for every key of :meth:`keys` (``descriptor.name``,
        ``namespace``, ``key_group_range``), with the backend's current key set to that key and
        ``state`` (the state object of ``descriptor``, registered on first use, as
        :meth:`get_state`) set to ``namespace`` (Flink ``KeyedStateBackend.applyToAllKeys``).
        The keys are collected first, so ``function`` may update or clear the state (or others).
        ``namespace_type``: the state's namespace type, default the one it is registered or
        restored with, else ``void``; for a state of another namespace type ``namespace`` is
        required. Afterwards the previous current key (or none) and the state object's previous
        namespace are back, also when ``function`` raises (the exception propagates). Raises
        InvalidInputError for a missing or bad namespace or range, StateMigrationError as
        :meth:`get_state`, StateError once disposed."""
        self.check_open()
        if namespace_type is None:
            namespace_type = self._state_namespace_type(descriptor.name) or "void"
        state = self.get_state(descriptor, namespace_type)
        if state.namespace_type != "void" and namespace is None:
            raise InvalidInputError(
                f"state {descriptor.name!r} has namespace type {state.namespace_type}: "
                "apply_to_all_keys needs the namespace")
        keys = self.keys(descriptor.name, namespace, key_group_range)
        prev_key, prev_ns = self._current_key, state._namespace
        try:
            if state.namespace_type != "void":
                state.set_current_namespace(namespace)
            for key in keys:
                self.set_current_key(key)
                function(key, state)
        finally:
            if not self._closed:
                state._namespace = prev_ns
                if prev_key is None:
                    self._clear_current_key()
                else:
                    self.set_current_key(prev_key)

    @abc.abstractmethod
    def _state_namespace_type(self, state_name: str):
        """The namespace type of state ``state_name`` (registered or restored); None when there
        is no such state."""

    @abc.abstractmethod
    def _key_namespaces(self, state_name: str, kgs: KeyGroupRange):
        """For each key group of ``kgs`` holding entries of the state: ``(key group,
        [(serialized key, key, namespace), ...])`` of those entries, any order, keys and
        namespaces decoded (the namespace None for ``void`` states)."""

    def check_open(self) -> None:
        """Raise StateError when the backend is disposed (:meth:`dispose`); every state call,
        timer call and backend operation checks it first."""
        if self._closed:
            raise StateError("the backend is disposed")

    # ------------------------------------------------------------------ abstract
    @abc.abstractmethod
    def get_state(self, descriptor, namespace_type: str = "void") -> "State":
        """The state for ``descriptor`` (registered on first use). Raises StateMigrationError when
        a state of the same name exists (registered or restored) with another kind, value type,
        user key type or namespace type."""

    @abc.abstractmethod
    def snapshot(self, incremental: bool = False) -> StateSnapshot:
        """A StateSnapshot of every state and timer of the key-group range, isolated from later
        writes; with ``incremental`` only the changes since the base (module docstring)."""

    @abc.abstractmethod
    def restore(self, snapshot_like) -> None:
        """Load the key groups of ``snapshot_like`` inside this backend's key-group range; the
        resulting state becomes the base of incremental snapshots."""

    # ------------------------------------------------------------------ checkpoints
    @property
    def base_snapshot_id(self) -> int:
        """Id of the snapshot incremental snapshots are relative to (0: the empty state or, after a
        restore, ids up to this one predate the restored state)."""
        return self._base_snapshot_id

    @property
    def base_version(self) -> int | None:
        """The checkpoint version the base of incremental snapshots is, when known: the
        version passed to :meth:`notify_checkpoint_complete` with the base's snapshot id, or
        the version of the checkpoint reader(s) restored or applied since (every restore since
        the last completed checkpoint from the same version; restores from different versions
        or from in-memory snapshots leave it None). An incremental snapshot records it as
        ``base_version`` and ``CheckpointStore.commit`` refuses an incremental run whose base
        version is unknown or not the version it would be chained onto."""
        return self._base_version

    @property
    def base_commit_id(self) -> str | None:
        """The commit id of :attr:`base_version` when known (from the restored or applied
        checkpoint reader, or passed to :meth:`notify_checkpoint_complete`): a commit of the
        same version number elsewhere (another store, a version committed again) has another
        id, so ``CheckpointStore.commit`` can tell the base it was taken from apart from a
        different state that happens to carry the same version number."""
        return self._base_commit_id

    @property
    def base_token(self) -> tuple[int, int]:
        """Identifies the base (:attr:`base_snapshot_id` alone does not: a restore makes the
        restored contents the base without issuing an id): equal tokens mean the same base.
        ``CheckpointStore.checkpoint`` compares it with the token it saw after committing."""
        return (self._restores, self._base_snapshot_id)

    def _snapshot_incremental(self, incremental) -> bool:
        """Whether a snapshot asked for with ``incremental`` is taken as one: not while the base
        predates a TTL migration (module docstring)."""
        return bool(incremental) and self._base_snapshot_id > self._ttl_migrated_at

    def _next_snapshot_id(self) -> int:
        self._last_snapshot_id += 1
        return self._last_snapshot_id

    def notify_checkpoint_complete(self, snapshot_id: int, version: int | None = None,
                                   commit_id: str | None = None) -> None:
        """The checkpoint holding snapshot ``snapshot_id`` is durable: it becomes the base, and
        changes up to it stop being tracked. ``version``: the checkpoint version that snapshot
        was committed as; it becomes :attr:`base_version`, which the next incremental snapshot
        records (without it the base version is unknown and a checkpoint store refuses to
        commit incremental runs relative to it). ``commit_id``: that version's commit id (the
        manifest's ``commit_id``; :attr:`base_commit_id`), so that a store refuses to chain the
        next incremental run onto another commit of the same version number. Idempotent; an id
        older than the current base is ignored (the current base's id only records ``version``
        and ``commit_id``). Raises InvalidInputError for a non-int or an id this backend never
        issued, a bad ``version`` or ``commit_id`` (or a ``commit_id`` without a version),
        StateError when closed."""
        self.check_open()
        if (isinstance(snapshot_id, (bool, np.bool_))
                or not isinstance(snapshot_id, (int, np.integer))):
            raise InvalidInputError(f"snapshot_id must be an int, got {snapshot_id!r}")
        if version is not None and (isinstance(version, (bool, np.bool_))
                                    or not isinstance(version, (int, np.integer))
                                    or version < 0):
            raise InvalidInputError(f"version must be an int >= 0 or None, got {version!r}")
        if commit_id is not None and (not isinstance(commit_id, str) or not commit_id):
            raise InvalidInputError(f"commit_id must be a non-empty str or None, got "
                                    f"{commit_id!r}")
        if commit_id is not None and version is None:
            raise InvalidInputError("commit_id names a commit of a version: pass version= too")
        sid = int(snapshot_id)
        if sid < 1 or sid > self._last_snapshot_id:
            raise InvalidInputError(
                f"unknown snapshot id {sid}: this backend issued ids 1..{self._last_snapshot_id}")
        if sid < self._base_snapshot_id or (sid == self._base_snapshot_id
                                            and (version is None or self._base_from_restore)):
            return
        if sid > self._base_snapshot_id:
            self._complete_snapshot(sid)
            self._base_snapshot_id = sid
        self._base_version = None if version is None else int(version)
        self._base_commit_id = commit_id
        self._base_from_restore = False

    @abc.abstractmethod
    def _complete_snapshot(self, snapshot_id: int) -> None:
        """Move the change tracking's base to snapshot ``snapshot_id`` (newer than the base)."""

    def _restored_is_base(self, version: int | None = None, applied_changes: bool = False,
                          commit_id: str | None = None) -> None:
        """After a restore or (``applied_changes``) a change set, of checkpoint version
        ``version`` (None when not a checkpoint's) committed as ``commit_id`` (None: unknown):
        every snapshot issued so far predates the base (:attr:`base_version`)."""
        self._base_snapshot_id = self._last_snapshot_id
        self._restores += 1
        if version is None:
            commit_id = None
        if not applied_changes and self._base_from_restore and (
                self._base_version != version or self._base_commit_id != commit_id):
            # Restored from several versions (or commits): no one version is the base.
            version = commit_id = None
        self._base_version = version
        self._base_commit_id = commit_id
        self._base_from_restore = True

    @abc.abstractmethod
    def num_entries(self) -> int:
        """Number of (state, key, namespace) entries holding a value (timers excluded)."""

    @abc.abstractmethod
    def state_bytes(self) -> int:
        """Bytes of encoded keys plus serialized values of all entries (timers excluded)."""

    def dispose(self) -> None:
        """Release the backend's memory (Flink ``KeyedStateBackend.dispose``); every later call
        -- on the backend, its state objects (per record and batch) and its timers
        (``backend.timers``) -- raises StateError. Idempotent."""
        self._closed = True
        self.timers.clear()
        self.operator_state.clear()

    def close(self) -> None:
        """Alias of :meth:`dispose`."""
        self.dispose()

    @property
    def disposed(self) -> bool:
        """True once :meth:`dispose` (or :meth:`close`) was called."""
        return self._closed


# --------------------------------------------------------------------------- states

_UNSET = object()


class State(abc.ABC):
    """Base of every state object: the descriptor, the namespace type and the current namespace.

    Attributes: ``backend`` (the KeyedStateBackend it belongs to), ``descriptor``, ``name``,
    ``namespace_type`` and ``namespace_serializer`` (the
    :class:`~statecore.serializers.KeySerializer` of the namespace type).
    """

    def __init__(self, backend: KeyedStateBackend, descriptor, namespace_type: str):
        if namespace_type not in NAMESPACE_TYPES:
            raise InvalidInputError(
                f"namespace type {namespace_type!r} not supported; "
                f"use one of {', '.join(NAMESPACE_TYPES)}"
            )
        self.backend = backend
        self.descriptor = descriptor
        self.name = descriptor.name
        self.namespace_type = namespace_type
        self.namespace_serializer = S.key_serializer(namespace_type)
        self._namespace = None if namespace_type == "void" else _UNSET

    def set_current_namespace(self, namespace) -> None:
        """Set the namespace of later calls on this state object (InvalidInputError when it does
        not match the namespace type)."""
        self._namespace = self.namespace_serializer.check(namespace)

    @property
    def current_namespace(self):
        """The namespace of later per-record calls on this state object, in its canonical
        Python form: None for the ``void`` namespace type and before the first
        :meth:`set_current_namespace`."""
        return None if self._namespace is _UNSET else self._namespace

    def require_current_namespace(self):
        """The current namespace (None for the void namespace); InvalidInputError when the
        namespace type is not void and no namespace was set (:meth:`set_current_namespace`)."""
        if self._namespace is _UNSET:
            raise InvalidInputError(
                f"state {self.name!r} has namespace type {self.namespace_type}: "
                "call set_current_namespace() first"
            )
        return self._namespace

    @abc.abstractmethod
    def clear(self) -> None:
        """Remove the value of the current key and namespace."""


class ValueState(State):
    """One value per key and namespace (Flink ``ValueState``).

    Per-record calls (here and on every state kind) act on the backend's current key and this
    state's current namespace: InvalidInputError when either is unset, StateError once the
    backend is closed. With TTL (``StateDescriptor.enable_time_to_live``; Flink
    ``TtlValueState``) a write stamps the value with the TTL clock (ms); a read of an expired
    value removes it and reads as absent (``ReturnExpiredIfNotCleanedUp``: returns it this once);
    ``OnReadAndWrite`` renews what a read returns.

    Batch calls (here and on every state kind; the module docstring has the full rules) do not
    change the backend's current key and take:

    * ``keys``: a pa.Array, pa.ChunkedArray or any ``__arrow_c_array__`` /
      ``__arrow_c_stream__`` object of exactly the key type's Arrow type (a multi-column key: a
      struct array or a list of one input per column), length n, no nulls;
    * ``values``: length n, of the value type's Arrow type (large_string/large_binary accepted,
      timestamps of the value type's unit in any time zone);
    * ``namespaces``: None (every row uses the current namespace; the only choice for ``void``
      states), an Arrow array of n namespaces of the namespace type (no nulls), or one
      namespace for every row.

    Rows of one key and namespace apply in row order, exactly as the same rows one at a time
    (TTL included). Errors: InvalidInputError for a wrong Arrow type, a null key, a key outside
    the key-group range, mismatched lengths, an unset namespace, or a ``pickle`` value type
    (``clear_batch`` takes any) -- raised before anything changes, so the state is left as it
    was; StateError while another thread's native batch call runs on this state (a backend is
    used by one thread at a time) and once the backend is closed.
    """

    @abc.abstractmethod
    def value(self) -> Any:
        """The value (Flink ``value()``): the descriptor's default (None unless given; a fresh
        copy of a mutable one) when absent or expired."""

    @abc.abstractmethod
    def update(self, value) -> None:
        """Set the value (Flink ``update``); None clears it. InvalidInputError, with nothing
        changed, when ``value`` is not a value of the value type."""

    @abc.abstractmethod
    def get_batch(self, keys, namespaces=None) -> pa.Array:
        """The value of each row's key and namespace: a pa.Array of length n of the value
        type's Arrow type (timestamps without a time zone), null where absent or expired (the
        descriptor's default is not applied)."""

    @abc.abstractmethod
    def put_batch(self, keys, values, namespaces=None) -> None:
        """``update(values[i])`` for each row's key and namespace; a null value clears."""

    @abc.abstractmethod
    def clear_batch(self, keys, namespaces=None) -> None:
        """``clear()`` for each row's key and namespace (absent ones: no-op)."""

    @abc.abstractmethod
    def contains_batch(self, keys, namespaces=None) -> pa.Array:
        """Whether each row's key and namespace holds a value: a pa.bool_() array of length n,
        no nulls; a row reads as in :meth:`get_batch` (TTL cleanup on read included)."""


class ListState(State):
    """A list of elements per key and namespace (Flink ``ListState``); elements are never None.

    Per-record calls, TTL and the batch inputs and errors: see :class:`ValueState`. With TTL
    (Flink ``TtlListState``) every element carries the time (ms) of the call that wrote it; a
    read drops expired elements from the state and from what it returns
    (``ReturnExpiredIfNotCleanedUp``: returns them this once).
    """

    @abc.abstractmethod
    def get(self) -> list:
        """The elements in insertion order, as a new list (Flink ``get``); ``[]`` when absent."""

    @abc.abstractmethod
    def append_batch(self, keys, values, namespaces=None) -> None:
        """Append to each row's key and namespace: ``values`` of the element type's Arrow type
        (one element per row, no nulls) or a list / large_list array of it (the row's elements,
        appended as one ``add_all``: one TTL timestamp; a null or empty row appends nothing;
        null elements raise InvalidInputError)."""

    @abc.abstractmethod
    def get_batch(self, keys, namespaces=None) -> pa.Array:
        """What ``get()`` returns for each row's key and namespace: a ``list<element type>``
        array of length n, ``[]`` (not null) where absent."""

    @abc.abstractmethod
    def clear_batch(self, keys, namespaces=None) -> None:
        """``clear()`` (the whole list) for each row's key and namespace."""

    @abc.abstractmethod
    def add(self, value) -> None:
        """Append ``value`` (Flink ``add``). InvalidInputError, with nothing changed, for None or
        a value not of the element type."""

    @abc.abstractmethod
    def add_all(self, values) -> None:
        """Append the elements of the iterable ``values`` (Flink ``addAll``); empty: no-op.
        InvalidInputError, with nothing changed, for a None element, an element not of the
        element type, or a ``values`` that is no iterable (or a str/bytes)."""

    @abc.abstractmethod
    def update(self, values) -> None:
        """Replace the list by the elements of ``values`` (Flink ``update``); empty clears.
        Errors as :meth:`add_all`."""

    @abc.abstractmethod
    def merge_namespaces(self, target, sources) -> None:
        """Merge the lists of namespaces ``sources`` into namespace ``target``, for the current
        key (Flink ``InternalMergingState.mergeNamespaces``, merging windows): the target's
        elements first, then each source's in the order of ``sources``; the sources are
        removed. Otherwise as :meth:`ReducingState.merge_namespaces` (with TTL expired elements
        are dropped and every element of the merged list is stamped with the time of the
        merge)."""


class MapState(State):
    """A map of user keys to user values per key and namespace (Flink ``MapState``).

    User keys are of the descriptor's user key type (int32, int64, string, binary or pickle),
    equal when their serialized bytes are. Each user key is an entry of its own (Flink
    ``RocksDBMapState``'s layout, docs/formats.md "Map state"), so ``get``/``put``/``contains``/
    ``remove`` cost O(1) whatever the map's size. Iteration (``items``/``keys``/``values``) is in
    insertion order, the same in every backend: a ``put`` of a present user key keeps its place,
    a removed user key put again goes last. A restore (and a change set applied) lists each map
    in ascending order of the serialized user key, which is how checkpoints store entries: for
    int32/int64 big-endian two's complement (0, 1, ... before the negative keys), for string and
    binary keys a LEB128 length prefix first (a shorter key before a longer one), pickle keys by
    their pickle bytes. Removing the last user key clears the map (as Flink's heap
    backend). A user key or value not of its type (None included, unless pickle) raises
    InvalidInputError and changes nothing. Per-record calls, TTL and the batch inputs and
    errors: see :class:`ValueState`; batch calls take one row per (key, user key): ``user_keys``
    of length n of the user key type's Arrow type, no nulls (a pickle user key type has no batch
    API; a pickle value type allows ``contains_batch``, ``remove_batch`` and ``clear_batch``).
    With TTL (Flink ``TtlMapState``) every entry carries the time (ms) it was written; a read
    removes the expired entries it looks at.
    """

    @abc.abstractmethod
    def get(self, user_key):
        """The value of ``user_key`` (Flink ``get``); None when absent or expired."""

    @abc.abstractmethod
    def put_batch(self, keys, user_keys, values, namespaces=None) -> None:
        """``put(user_keys[i], values[i])`` for each row's key and namespace; ``values`` of the
        user value type's Arrow type, no nulls (InvalidInputError: use :meth:`remove_batch`)."""

    @abc.abstractmethod
    def get_batch(self, keys, user_keys, namespaces=None) -> pa.Array:
        """``get(user_keys[i])`` for each row's key and namespace: a pa.Array of length n of the
        user value type's Arrow type, null where absent."""

    @abc.abstractmethod
    def contains_batch(self, keys, user_keys, namespaces=None) -> pa.Array:
        """``contains(user_keys[i])`` for each row's key and namespace: a pa.bool_() array of
        length n, no nulls."""

    @abc.abstractmethod
    def remove_batch(self, keys, user_keys, namespaces=None) -> None:
        """``remove(user_keys[i])`` for each row's key and namespace (absent: no-op)."""

    @abc.abstractmethod
    def clear_batch(self, keys, namespaces=None) -> None:
        """``clear()`` (the whole map) for each row's key and namespace."""

    @abc.abstractmethod
    def put(self, user_key, user_value) -> None:
        """Map ``user_key`` to ``user_value`` (Flink ``put``)."""

    @abc.abstractmethod
    def put_all(self, mapping) -> None:
        """``put`` every pair of ``mapping`` (a dict or an iterable of (user key, value) pairs;
        Flink ``putAll``), all or nothing: one invalid pair raises and changes nothing."""

    @abc.abstractmethod
    def contains(self, user_key) -> bool:
        """Whether ``user_key`` has a value (Flink ``contains``)."""

    @abc.abstractmethod
    def remove(self, user_key) -> None:
        """Remove ``user_key`` (Flink ``remove``); absent: no-op."""

    @abc.abstractmethod
    def items(self) -> list:
        """``[(user key, value), ...]`` (Flink ``entries``); ``[]`` when absent."""

    @abc.abstractmethod
    def keys(self) -> list:
        """The user keys, as :meth:`items` orders them (Flink ``keys``)."""

    @abc.abstractmethod
    def values(self) -> list:
        """The values, as :meth:`items` orders them (Flink ``values``)."""

    @abc.abstractmethod
    def is_empty(self) -> bool:
        """True when :meth:`items` would return ``[]`` (Flink ``isEmpty``)."""

    @abc.abstractmethod
    def size(self) -> int:
        """How many user keys :meth:`items` would return (Flink has no such call). O(1) without
        TTL; with TTL it reads the whole map as :meth:`items` does (expired entries removed and
        counted, renewed under ``OnReadAndWrite``), so O(size), as Flink's ``TtlMapState.isEmpty``
        iterates."""


class ReducingState(State):
    """One aggregate per key and namespace, folded by the descriptor's
    :class:`~statecore.descriptors.Reducer` on every ``add`` (Flink ``ReducingState``).

    Per-record calls, TTL and the batch inputs and errors: see :class:`ValueState`. With TTL
    (Flink ``TtlReducingState``) an expired aggregate counts as absent for ``add``, whatever the
    visibility setting.
    """

    @abc.abstractmethod
    def get(self):
        """The aggregate (Flink ``get``); None when absent or expired."""

    @abc.abstractmethod
    def add(self, value) -> None:
        """Fold ``value`` into the aggregate (the first value starts it; Flink ``add``); None is
        a no-op. InvalidInputError, with nothing changed, when ``value`` or the new aggregate
        does not fit the value type (e.g. an int64 ``sum`` overflow) or the reducer fails."""

    @abc.abstractmethod
    def get_batch(self, keys, namespaces=None) -> pa.Array:
        """``get()`` for each row's key and namespace: a pa.Array of length n of the value
        type's Arrow type (``count``: int64), null where absent."""

    @abc.abstractmethod
    def merge_namespaces(self, target, sources) -> None:
        """Merge the aggregates of namespaces ``sources`` into namespace ``target``, for the
        current key (Flink ``InternalMergingState.mergeNamespaces``, as its heap backend's
        ``AbstractHeapMergingState``; merging windows): the sources' aggregates are removed
        and folded in the order of ``sources``, then folded into the target's (the target's
        first; ``count`` adds counts). A source equal to the target, repeated or absent adds
        nothing; when no source holds a value the target is not written. ``sources``: an
        iterable of namespaces (not a str or bytes).

        With TTL an expired source counts as absent (and is removed), an expired target too;
        the merged target is a write, stamped with the current time. InvalidInputError, with
        nothing changed, for a ``void`` namespace state (nothing to merge), a target or source
        not of the namespace type (as :meth:`set_current_namespace`), no current key, or a
        failing reducer (e.g. an int64 ``sum`` overflow); StateError once closed."""

    @abc.abstractmethod
    def add_batch(self, keys, values, namespaces=None) -> pa.Array:
        """``add(values[i])`` for each row's key and namespace (``count``: ``values`` of any
        Arrow type, only validity counts); returns the running aggregate after each row, a
        pa.Array of length n as :meth:`get_batch`'s; a null value adds nothing and yields the
        current aggregate (null if none). A rejected row (overflow, a failing reducer) leaves
        every aggregate as it was."""

    @abc.abstractmethod
    def clear_batch(self, keys, namespaces=None) -> None:
        """``clear()`` for each row's key and namespace."""


class AggregatingState(State):
    """One accumulator per key and namespace of the descriptor's
    :class:`~statecore.descriptors.AggregateFunction`; reads return its ``get_result``
    (Flink ``AggregatingState``).

    Per-record calls, TTL and the batch inputs and errors: see :class:`ValueState`, except that
    the batch calls accept any ``values`` and a ``pickle`` accumulator type. With TTL (Flink
    ``TtlAggregatingState``) an expired accumulator counts as absent for ``add``.
    """

    @abc.abstractmethod
    def get(self):
        """``get_result(accumulator)`` (Flink ``get``); None when absent or expired."""

    @abc.abstractmethod
    def add(self, value) -> None:
        """``accumulator = add(value, accumulator)``, starting from ``create_accumulator()``
        when absent (Flink ``add``); None is a no-op. InvalidInputError, with nothing changed,
        when the accumulator does not fit the accumulator type."""

    @abc.abstractmethod
    def add_batch(self, keys, values, namespaces=None) -> pa.Array:
        """``add(values[i])`` for each row's key and namespace (``values``: length n, any Arrow
        type, handed over as Python values; a null row adds nothing); returns ``get()`` after
        each row as a pa.Array of length n of the descriptor's ``result_type`` (else inferred),
        null where there is no accumulator. InvalidInputError, with nothing changed, when the
        function fails or the results form no such array."""

    @abc.abstractmethod
    def get_batch(self, keys, namespaces=None) -> pa.Array:
        """``get()`` for each row's key and namespace, as :meth:`add_batch` returns results."""

    @abc.abstractmethod
    def merge_namespaces(self, target, sources) -> None:
        """Merge the accumulators of namespaces ``sources`` into namespace ``target``, for the
        current key (Flink ``InternalMergingState.mergeNamespaces``, merging windows), with
        the function's ``merge(a, b)`` (:meth:`statecore.descriptors.AggregateFunction.merge`):
        the sources' accumulators merged in the order of ``sources``, then the target's merged
        with that (``merge(target, merged sources)``). Otherwise as
        :meth:`ReducingState.merge_namespaces`; InvalidInputError, with nothing changed, too
        when the function does not implement ``merge`` or it fails."""

    @abc.abstractmethod
    def clear_batch(self, keys, namespaces=None) -> None:
        """``clear()`` for each row's key and namespace."""

"""The store-independent part of external keyed state (docs/external-state.md): an in-memory
backend in front of a store, reading committed state through by key group and collecting each
epoch's changes from the cache's change tracking; :class:`CachedExternalBackend`, the base of
:class:`~statecore.external.redis_backend.RedisBackend` and
:class:`~statecore.external.postgres_backend.PostgresBackend`.

An in-memory backend (``cache="python"`` or ``"native"``) holds what the task has read and
written: it is the read-through cache and the epoch's write buffer, and it serves every state
call, so the state API and its semantics are exactly the in-memory backends'. The unit of
read-through is a key group: the first access to a key group (``set_current_key``, a batch call
holding one of its keys, key enumeration, firing timers) reads that key group's committed
entries of every state, all missing key groups of a batch in one request, and restores them
into the cache (map and list states keep one entry per user key or chunk, so the entries of one
key are not addressable by name; a key group is also what a task owns). The changes since the
last hand-over are the cache's incremental snapshot (its change tracking); they are collected
before each read-through restore (which makes the cache's contents the base) and at pre-commit.

The cache is bounded (``cache_entries``): past the bound, whole key groups (the read-through
unit) whose entries equal the committed store state are evicted, least recently used first;
the key groups holding changes not committed yet (collected, in a log not known committed, or
still in the cache's change tracking) are the epoch's write buffer and stay. An evicted key
group is read through again on its next access. Timers are never evicted (they are what firing
needs for every key group, and small).

Operator state (:meth:`CachedExternalBackend.open_operator_state`) is kept beside the cache
and committed with the epoch as pseudo-states of the task's first key group
(docs/external-state.md "Operator state").

A store implements six hooks: ``_store_state_metas``, ``_store_read``,
``_store_read_operator_state``, ``_store_committed_epoch``, ``_store_write_log`` and
``_store_close`` (their docstrings).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from statecore.arrow_input import coerce_key_array
from statecore.errors import (
    EpochCommitError,
    InvalidInputError,
    StateError,
    StateMigrationError,
)
from statecore.key_groups import KeyGroupRange, assign_key_groups
from statecore.operator_state import (
    OPERATOR_STATE_PREFIX,
    UNION_LIST,
    OperatorStateStore,
    OperatorStateWriter,
    is_operator_state_meta,
)
from statecore.serializers import value_serializer
from statecore.timers import TIMERS_STATE_NAME
from statecore.ttl import INT64_MIN, StateTtlConfig

__all__ = ["CachedExternalBackend", "DEFAULT_CACHE_ENTRIES", "DEFAULT_TTL_SWEEP_KEY_GROUPS",
           "OPERATOR_WRITERS_STATE",
           "check_cache_entries", "check_ttl_sweep_key_groups", "check_epoch", "check_task"]

#: Default bound of the cache in entries (``cache_entries``): about 2M small entries, within
#: the memory a Spark executor's Python worker has room for (docs/external-state.md).
DEFAULT_CACHE_ENTRIES = 2_000_000
#: Default number of key groups of a task's range whose expired TTL entries each of its
#: commits removes from the store (``ttl_sweep_key_groups``), round robin over the range.
DEFAULT_TTL_SWEEP_KEY_GROUPS = 16
#: The pseudo-state recording, in the first key group of each task that wrote operator state,
#: its key-group range (docs/external-state.md "Operator state"): one entry, key empty, value
#: the range's last key group in decimal ASCII.
OPERATOR_WRITERS_STATE = "__operator_writers__"
#: An eviction frees the cache down to this fraction of its bound, so that a cache at the bound
#: does not evict on every read-through.
_EVICT_TO = 0.75

_EMPTY = pa.array([], pa.binary())
#: A batch of at least this many keys per key group not read yet reads every key group of the
#: range through instead of computing the keys' key groups.
_ALL_GROUPS_FACTOR = 8


def check_epoch(epoch) -> int:
    """``epoch`` checked: an int >= 0 (InvalidInputError otherwise)."""
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise InvalidInputError(f"epoch must be an int >= 0, got {epoch!r}")
    return epoch


def check_task(task) -> str:
    """``task`` checked: a non-empty str without spaces or control characters."""
    if not isinstance(task, str) or not task or any(ord(c) < 33 for c in task):
        raise InvalidInputError(f"task must be a non-empty str without spaces, got {task!r}")
    return task


def check_cache_entries(cache_entries, name: str = "cache_entries") -> int | None:
    """``cache_entries`` checked: an int >= 1, or None for an unbounded cache
    (InvalidInputError naming the argument ``name`` otherwise)."""
    if cache_entries is None:
        return None
    if (isinstance(cache_entries, bool) or not isinstance(cache_entries, int)
            or cache_entries < 1):
        raise InvalidInputError(f"{name} must be an int >= 1 or None, got "
                                f"{cache_entries!r}")
    return cache_entries


def check_ttl_sweep_key_groups(n, name: str = "ttl_sweep_key_groups") -> int:
    """``ttl_sweep_key_groups`` checked: an int >= 0 (InvalidInputError naming the argument
    ``name`` otherwise)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InvalidInputError(f"{name} must be an int >= 0, got {n!r}")
    return n


def _new_cache(kind: str, **options):
    """The in-memory backend of ``kind`` ("python" or "native") in front of the store."""
    if kind == "python":
        from statecore.backends.python import PythonBackend

        return PythonBackend(**options)
    from statecore.backends.native import NativeBackend

    return NativeBackend(**options)


def _ttl_mismatch(name: str, namespace: str, meta: dict, ttl: bool) -> str:
    return (f"state {name!r} of {namespace!r} is committed with TTL "
            f"{'enabled' if meta.get('ttl') else 'disabled'} and registered here with TTL "
            f"{'enabled' if ttl else 'disabled'}; external state does not migrate TTL "
            "settings (the stored values' formats differ, and a task converts only the key "
            "groups it reads while every task shares the state meta)")


def _sorted_arrays(d: dict) -> tuple[pa.Array, pa.Array]:
    """``(keys, values)`` binary arrays of ``{key: value}``, ascending by key bytes."""
    items = sorted(d.items())
    return (pa.array([k for k, _ in items], pa.binary()),
            pa.array([v for _, v in items], pa.binary()))


class _CacheInput:
    """What the cache's ``restore`` / ``apply_changes`` read besides the entries: the cache's
    key-group layout, and the state metas (``metas``) with the data behind them (``data``)."""

    def __init__(self, backend, metas, data: dict):
        self.max_parallelism = backend.max_parallelism
        self.key_group_range = backend.key_group_range
        self.key_type = backend.key_type
        self.assigner = backend.assigner
        self._metas = metas
        self._data = data


class _CommittedEntries(_CacheInput):
    """A StateSnapshot-like view of committed entries read from the store, restored into the cache:
    ``metas`` ``{state: meta}``, ``data[(state, kg)] = {encoded key: stored value}`` for the key
    groups read, nothing for the others."""

    def state_metas(self) -> list[dict]:
        return [dict(m) for m in self._metas.values()]

    def entries(self, state_name: str, key_group: int):
        if state_name not in self._metas:
            raise InvalidInputError(f"unknown state {state_name!r}")
        d = self._data.get((state_name, key_group))
        if not d:
            return _EMPTY, _EMPTY
        items = sorted(d.items())
        return (pa.array([k for k, _ in items], pa.binary()),
                pa.array([v for _, v in items], pa.binary()))

    def release(self) -> None:
        self._data = {}


class _EvictionChanges(_CacheInput):
    """A change set (for the cache's ``apply_changes``) that removes the entries of evicted key
    groups: ``metas`` a list of metas, ``data[(state, kg)] = (keys, values)``, the values NULL
    (tombstones) for keyed state, and for ``__timers__`` every timer of the range as it is (a
    change set's timers replace the range's)."""

    def state_metas(self) -> list[dict]:
        return [dict(m) for m in self._metas]

    def entries(self, state_name: str, key_group: int):
        return self._data.get((state_name, key_group), (_EMPTY, _EMPTY))


class _CachedState:
    """A state of a :class:`CachedExternalBackend`: the cache's state object, with the key
    groups of a batch call's keys read through before the call. Every attribute and method is
    the cache state's (``value``, ``update``, ``get_batch``, ``merge_namespaces``, ...)."""

    __slots__ = ("_backend", "_inner", "_generation")

    def __init__(self, backend: "CachedExternalBackend", inner, generation: int):
        self._backend = backend
        self._inner = inner
        self._generation = generation

    def _live(self):
        if self._generation != self._backend.generation:
            raise StateError(f"state {self._inner.name!r} belongs to a cache the backend "
                             "discarded (abort): get the state again with get_state")
        return self._inner

    def __getattr__(self, name):
        attr = getattr(self._live(), name)
        if not (name.endswith("_batch") and callable(attr)):
            return attr
        backend = self._backend

        def batch_call(keys, *args, **kwargs):
            self._live()
            return attr(backend.read_through_keys(keys), *args, **kwargs)

        batch_call.__doc__ = attr.__doc__
        return batch_call

    def __repr__(self) -> str:
        return f"<{type(self._backend).__name__} state {self._inner!r}>"


class _CachedTimers:
    """The timers of a :class:`CachedExternalBackend`: the cache's
    :class:`~statecore.timers.TimerService`, with read-through before the calls that need more
    than the current key's key group (firing, listing every timer, batch registrations)."""

    _WHOLE_RANGE = frozenset({"advance_watermark", "advance_processing_time", "all_timers",
                              "all_processing_time_timers", "num_timers", "num_bytes",
                              "key_groups", "snapshot_all", "snapshot_entries"})

    def __init__(self, backend: "CachedExternalBackend"):
        self._backend = backend

    def __getattr__(self, name):
        backend = self._backend
        attr = getattr(backend.cache.timers, name)
        if not callable(attr):
            return attr
        if name in self._WHOLE_RANGE:
            def whole_range_call(*args, **kwargs):
                backend.read_through_timers()
                return attr(*args, **kwargs)
            whole_range_call.__doc__ = attr.__doc__
            return whole_range_call
        if name.endswith("_batch"):
            def batch_call(keys, *args, **kwargs):
                return attr(backend.read_through_keys(keys), *args, **kwargs)
            batch_call.__doc__ = attr.__doc__
            return batch_call
        return attr


class CachedExternalBackend:
    """Keyed state of one task whose committed copy is in an external store, behind an
    in-memory cache (module docstring). Subclasses connect to their store, set
    ``self._committed`` (the committed epoch) and implement the ``_store_*`` hooks.

    ``namespace`` is the (checked) state namespace, ``cache`` ``"python"`` or ``"native"``,
    ``cache_options`` the in-memory backend's options, ``task`` the name of this task's
    write-ahead logs (default ``kg<start>-<end>`` of the key-group range), ``cache_entries``
    the bound of the cache in entries (None: unbounded; module docstring),
    ``ttl_sweep_key_groups`` the key groups per pre-commit whose expired TTL entries the
    commit removes from the store (0: none; :meth:`pre_commit`)."""

    def __init__(self, namespace: str, cache: str, cache_options: dict, task: str | None,
                 cache_entries: int | None = DEFAULT_CACHE_ENTRIES,
                 ttl_sweep_key_groups: int = DEFAULT_TTL_SWEEP_KEY_GROUPS):
        if cache not in ("python", "native"):
            raise InvalidInputError(f"cache must be 'python' or 'native', got {cache!r}")
        self._cache_entries = check_cache_entries(cache_entries)
        self._sweep_key_groups = check_ttl_sweep_key_groups(ttl_sweep_key_groups)
        self._sweep_next: int | None = None
        self._namespace = namespace
        self._cache_options = dict(cache_options)
        self._cache_kind = cache
        self._cache = _new_cache(cache, **self._cache_options)
        r = self._cache.key_group_range
        self.task = check_task(f"kg{r.start}-{r.end}" if task is None else task)
        self._committed: int | None = None
        # Key groups whose entries are in the cache, and whose timers are (never evicted).
        self._loaded: set[int] = set()
        self._timers_loaded: set[int] = set()
        # Key groups by last access, least recent first (the eviction order).
        self._recent: dict[int, None] = {}
        # Key groups with changes in the last pre-commit's log (dirty until it is committed).
        self._in_flight: set[int] = set()
        self._stats = dict.fromkeys(("hits", "misses", "key_groups_read", "evictions",
                                     "evicted_entries"), 0)
        # {(state, kg): {encoded key: stored value, or None = removed}}: changes collected
        # from the cache and not yet in a write-ahead log.
        self._stash: dict[tuple, dict] = {}
        self._states: dict[int, _CachedState] = {}
        self._last_pre_commit: int | None = None
        # {kg: {timer key: entry}}: the timers of each key group read through, as in the store
        # after the last pre-commit (timers are complete in every snapshot of the cache).
        self._timers_stored: dict[int, dict] = {}
        self._timers = _CachedTimers(self)
        #: Incremented by :meth:`abort` (state objects of an older generation refuse calls).
        self.generation = 0
        # Operator state, once open_operator_state ran: the store, (index, parallelism), and
        # {(pseudo-state, kg): {key: value}} of the key groups of the range as the store holds
        # them after the last pre-commit (what the next one writes the differences to).
        self._op_store: OperatorStateStore | None = None
        self._op_task: tuple[int, int] | None = None
        self._op_stored: dict[tuple, dict] = {}

    # ------------------------------------------------------------------ store hooks
    def _store_state_metas(self) -> dict:
        """``{state name: meta dict}`` of the committed states."""
        raise NotImplementedError

    def _store_read(self, key_groups: list[int]) -> tuple[dict, dict]:
        """``(metas, data)`` as of one committed epoch: the committed state metas and
        ``{(state, kg): {encoded key: stored value}}`` of the sorted ``key_groups``."""
        raise NotImplementedError

    def _store_committed_epoch(self) -> int | None:
        """The committed epoch read from the store (None before the first commit)."""
        raise NotImplementedError

    def _store_read_operator_state(self) -> tuple[dict, dict]:
        """``(metas, data)`` as of one committed epoch: the committed state metas (those of the
        operator states are ``__operator__.<name>``), and ``{(state, kg): {encoded key: stored
        value}}`` of the operator pseudo-states and of :data:`OPERATOR_WRITERS_STATE` in every
        key group holding any (the writer records also when there is no operator state)."""
        raise NotImplementedError

    def _store_write_log(self, epoch: int, metas: list[dict], changes: dict,
                         timers: dict, sweep: list) -> str:
        """Write epoch ``epoch``'s log of this task, all or nothing, replacing an earlier one
        of the same epoch and task; returns its name. ``metas``: the cache's state metas;
        ``changes``: ``{(state, kg): {encoded key: value or None}}``; ``timers``:
        ``{kg: (timers before, timers now)}`` of the key groups whose timers changed
        (``{timer key: entry}`` each); ``sweep``: ``[(state, cutoff, [kg, ...], width)]``, the
        committed entries of those states and key groups whose TTL timestamp (the 8-byte
        big-endian suffix) is at most ``cutoff`` -- and not INT64_MIN, an event-time entry
        never stamped -- are expired and the commit removes them; ``width`` is None for those,
        and for a list state the element width in bytes (0: variable width), whose chunks the
        commit trims of their leading expired elements, removing a chunk with none left
        (:meth:`_sweep_plan`)."""
        raise NotImplementedError

    def _store_close(self) -> None:
        """Release the connection (when the backend opened it)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ properties
    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def key_type(self) -> str:
        return self._cache.key_type

    @property
    def key_serializer(self):
        return self._cache.key_serializer

    @property
    def max_parallelism(self) -> int:
        return self._cache.max_parallelism

    @property
    def key_group_range(self) -> KeyGroupRange:
        return self._cache.key_group_range

    @property
    def assigner(self) -> str:
        return self._cache.assigner

    @property
    def ttl_clock(self):
        return self._cache.ttl_clock

    @property
    def current_key(self):
        return self._cache.current_key

    @property
    def current_key_group(self):
        return self._cache.current_key_group

    @property
    def committed_epoch(self) -> int | None:
        """The committed epoch this backend knows of: read when it opened the namespace, then
        each :meth:`notify_committed` (None: nothing committed yet)."""
        return self._committed

    @property
    def loaded_key_groups(self) -> frozenset:
        """The key groups read from the store into the cache so far."""
        return frozenset(self._loaded)

    @property
    def timers(self):
        """The timer service (:class:`statecore.timers.TimerService`'s calls)."""
        self.check_open()
        return self._timers

    @property
    def cache(self):
        """The in-memory backend in front of the store (its contents: what was read and
        written)."""
        return self._cache

    @property
    def disposed(self) -> bool:
        return self._cache.disposed

    @property
    def operator_state(self):
        """The task's operator state (non-keyed list, union list and broadcast state;
        :class:`statecore.operator_state.OperatorStateStore`), committed with each epoch
        (docs/external-state.md "Operator state"). StateError until
        :meth:`open_operator_state` read it for this task's operator index."""
        self.check_open()
        if self._op_store is None:
            raise StateError(
                f"operator state of external state ({self.namespace!r}) is committed with the "
                "epochs and redistributed by operator index: call "
                "open_operator_state(operator_index, parallelism) first")
        return self._op_store

    def open_operator_state(self, operator_index: int, parallelism: int) -> None:
        """Read the committed operator state of every task that wrote it (as of one committed
        epoch) and give this backend the part of task ``operator_index`` of ``parallelism``
        (:meth:`statecore.operator_state.OperatorStateStore.restore`: Flink's round-robin
        redistribution; every task's own lists back at an unchanged parallelism, union lists
        whole). From then on :attr:`operator_state` is available and each :meth:`pre_commit`
        writes it with the epoch. Called again (a kept backend's union lists), the state
        objects handed out stay valid and get the committed contents. InvalidInputError for
        a bad index or parallelism; the store's errors; StateMigrationError when a registered
        state has another kind or type than the committed one. Nothing changes when it
        raises."""
        self.check_open()
        metas, data = self._store_read_operator_state()
        writers = []
        for (name, kg), d in data.items():
            if name == OPERATOR_WRITERS_STATE and b"" in d:
                writers.append((kg, int(d[b""])))
        writers.sort()
        pmetas = {n: m for n, m in metas.items() if is_operator_state_meta(m)}
        sources = [OperatorStateWriter(
            pmetas, self.max_parallelism, (start, end),
            lambda name, kg=start: _sorted_arrays(data.get((name, kg), {})),
            where=f"operator state of key groups {start}..{end} of {self.namespace!r}")
            for start, end in writers]
        store = self._op_store if self._op_store is not None else OperatorStateStore(self)
        store.apply_restore(store.stage_restore(sources, operator_index, parallelism))
        r = self.key_group_range
        self._op_store = store
        self._op_task = (operator_index, parallelism)
        self._op_stored = {(name, kg): dict(d) for (name, kg), d in data.items()
                           if kg in r and d}

    def refresh_operator_state(self) -> bool:
        """Re-read the operator state when it holds union lists (a restore gives every task all
        tasks' union lists, which this backend's own epochs do not: the Spark operator calls
        this on a backend kept from the previous micro-batch, as its in-memory path restores
        union lists); returns whether it re-read. Errors as :meth:`open_operator_state`."""
        if self._op_store is None or not self._op_store.has_kind(UNION_LIST):
            return False
        self.open_operator_state(*self._op_task)
        return True

    def _operator_state_changes(self) -> dict:
        """``{(pseudo-state, kg): {key: value or None}}``: what the store must change in this
        task's range so that it holds this task's operator state complete in the range's first
        key group with its writer record (which counts the task as an old task at the next
        redistribution, with operator state or without, as a checkpoint's writer does), and no
        other operator state (written with the epoch's log); empty before
        :meth:`open_operator_state`."""
        store = self._op_store
        if store is None:
            return {}
        r = self.key_group_range
        want: dict[tuple, dict] = {}
        for name, groups in store.snapshot_data(r, self.max_parallelism).items():
            for kg, (keys, values) in groups.items():
                want[(name, kg)] = dict(zip(keys.to_pylist(), values.to_pylist()))
        if not r.is_empty():
            want[(OPERATOR_WRITERS_STATE, r.start)] = {b"": str(r.end).encode()}
        changes = {}
        for slot in set(want) | set(self._op_stored):
            have, now = self._op_stored.get(slot, {}), want.get(slot, {})
            diff = {k: None for k in have if k not in now}
            diff.update((k, v) for k, v in now.items() if have.get(k) != v)
            if diff:
                changes[slot] = diff
        return changes

    def check_open(self) -> None:
        self._cache.check_open()

    # ------------------------------------------------------------------ read-through
    def read_through(self, key_groups) -> None:
        """Read the committed entries of every state in those of ``key_groups`` (inside the
        key-group range) not in the cache into it, in one request as of one committed epoch
        (the store's ``_store_read``); then, past the bound, evict clean key groups other than
        ``key_groups`` (:meth:`evict`). Store errors leave the cache unchanged
        (statecore.errors)."""
        self.check_open()
        r = self.key_group_range
        wanted = {int(kg) for kg in key_groups if kg in r}
        missing = sorted(wanted - self._loaded)
        self._touch(wanted)
        if not missing:
            self._stats["hits"] += 1
            return
        metas, data = self._store_read(missing)
        # Operator state and its writer records are not keyed state (open_operator_state).
        metas = {n: m for n, m in metas.items() if not is_operator_state_meta(m)}
        data = {slot: d for slot, d in data.items() if slot[0] != OPERATOR_WRITERS_STATE
                and not slot[0].startswith(OPERATOR_STATE_PREFIX)}
        self._collect_changes()
        self._check_ttl_settings(metas)
        for kg in missing:
            # The cache's timers of a key group read before are its current ones (timers are
            # never evicted); the store's may be older.
            if kg in self._timers_loaded:
                data.pop((TIMERS_STATE_NAME, kg), None)
        self._cache.restore(_CommittedEntries(self, metas, data))
        self._loaded.update(missing)
        for kg in missing:
            if kg not in self._timers_loaded:
                self._timers_stored[kg] = data.get((TIMERS_STATE_NAME, kg), {})
                self._timers_loaded.add(kg)
        self._stats["misses"] += 1
        self._stats["key_groups_read"] += len(missing)
        self.evict(protect=wanted)

    def read_through_timers(self) -> None:
        """Read through every key group of the range whose timers are not in the cache (the
        calls that fire or list timers need every key group's)."""
        self.read_through(set(self.key_group_range) - self._timers_loaded)

    def _touch(self, key_groups) -> None:
        recent = self._recent
        for kg in key_groups:
            recent.pop(kg, None)
            recent[kg] = None

    def _dirty_key_groups(self) -> set[int]:
        """Key groups whose cached entries may differ from the committed store state: changes
        collected and not in a log yet, and those of the last log while it is not known
        committed (call after :meth:`_collect_changes`)."""
        dirty = {kg for (_, kg) in self._stash}
        pending = self._last_pre_commit
        if pending is not None and (self._committed is None or self._committed < pending):
            dirty |= self._in_flight
        return dirty

    def evict(self, protect=(), max_entries: int | None = None) -> int:
        """When the cache holds more than ``max_entries`` (default the bound,
        ``cache_entries``; nothing happens for an unbounded cache then), evict clean key
        groups -- least recently used first, never one in ``protect``, the current key's or a
        dirty one -- until it holds at most 3/4 of it. Clean: every entry equals the
        committed store state (no change since the last commit this backend knows of). The
        evicted key groups' entries leave the cache without becoming changes; they are read
        through again on their next access. Returns the number of key groups evicted."""
        self.check_open()
        bound = self._cache_entries if max_entries is None else max_entries
        if bound is None or not self._loaded:
            return 0
        total = self._cache.num_entries()
        if total <= bound:
            return 0
        self._collect_changes()
        keep = set(protect) | self._dirty_key_groups()
        current = self._cache.current_key_group
        if current is not None:
            keep.add(current)
        candidates = [kg for kg in self._recent if kg in self._loaded and kg not in keep]
        if not candidates:
            return 0
        target = int(bound * _EVICT_TO)
        snap = self._cache.snapshot()
        try:
            metas = snap.state_metas()
            names = [m["name"] for m in metas
                     if m["name"] != TIMERS_STATE_NAME and not is_operator_state_meta(m)]
            data, evicted, entries = {}, [], 0
            for kg in candidates:
                if total - entries <= target:
                    break
                for name in names:
                    keys, _ = snap.entries(name, kg)
                    if len(keys):
                        data[(name, kg)] = (keys, pa.nulls(len(keys), pa.binary()))
                        entries += len(keys)
                evicted.append(kg)
            if any(m["name"] == TIMERS_STATE_NAME for m in metas):
                for kg in self.key_group_range:
                    data[(TIMERS_STATE_NAME, kg)] = snap.entries(TIMERS_STATE_NAME, kg)
            # Tombstones applied as a change set become the cache's new base, not changes:
            # the store holds these entries already.
            self._cache.apply_changes(_EvictionChanges(self, metas, data))
        finally:
            snap.release()
        self._loaded.difference_update(evicted)
        for kg in evicted:
            self._recent.pop(kg, None)
        self._stats["evictions"] += len(evicted)
        self._stats["evicted_entries"] += entries
        return len(evicted)

    def cache_statistics(self) -> dict:
        """The cache's counters since the backend opened: ``hits`` (accesses -- a
        ``set_current_key``, a batch call, a call over the range -- whose key groups were all
        in the cache), ``misses`` (accesses that read key groups through), ``key_groups_read``
        (key groups read through, re-reads after eviction included), ``evictions`` (key
        groups evicted), ``evicted_entries``; and ``entries`` (in the cache now),
        ``max_entries`` (the bound, None when unbounded), ``key_groups`` (in the cache now)."""
        return dict(self._stats, entries=self._cache.num_entries(),
                    max_entries=self._cache_entries, key_groups=len(self._loaded))

    def read_through_keys(self, keys):
        """Read through the key groups of a batch's ``keys`` (the batch API's key forms): those
        of its distinct keys, or every key group of the range for a batch of at least 8 keys
        per key group not read yet. Returns the keys as a validated Arrow array to pass on (a
        stream is read once); keys the cache would refuse are returned as given, for the
        cache to raise its error."""
        r = self.key_group_range
        if len(self._loaded) == len(r):
            self._stats["hits"] += 1
            return keys
        try:
            arr = coerce_key_array(keys, self.key_type, combine=False)
        except StateError:
            return keys
        if len(arr) >= _ALL_GROUPS_FACTOR * (len(r) - len(self._loaded)):
            # Keys spread over key groups by a hash: with n keys over m key groups one is
            # missed with probability (1 - 1/m)^n < e^-8, so read them all rather than hash
            # every key in Python to find out which.
            self.read_through(r)
            return arr
        distinct = arr
        if not pa.types.is_struct(arr.type):
            distinct = pc.unique(arr)
        kgs = assign_key_groups(distinct, self.key_type, self.max_parallelism, self.assigner)
        self.read_through(set(kgs.tolist()))
        return arr

    def _check_ttl_settings(self, metas: dict, names=None) -> None:
        """StateMigrationError when a state registered in the cache (of ``names``, default all)
        has another TTL setting than its committed meta in ``metas``: a TTL migration
        (``enable_ttl_migration``) would convert only the key groups this task reads while
        the state meta is shared by every task, so external state refuses it."""
        tables = self._cache.state_tables()
        for name in (metas if names is None else names):
            meta = metas.get(name)
            if (meta is not None and name in tables and name != TIMERS_STATE_NAME
                    and bool(meta.get("ttl")) != tables[name].ttl):
                raise StateMigrationError(_ttl_mismatch(name, self.namespace, meta,
                                                        tables[name].ttl))

    def _collect_changes(self, timers: dict | None = None) -> list[dict]:
        """Move the cache's changes since the last collection into the stash (an incremental
        snapshot of the cache, then completed so that its change tracking restarts); returns
        the cache's state metas (the timers' included). ``timers``: a dict to fill with
        ``{kg: {timer key: entry}}`` of every key group read through."""
        snap = self._cache.snapshot(incremental=True)
        try:
            metas = snap.state_metas()
            for meta in metas:
                name = meta["name"]
                if name == TIMERS_STATE_NAME:
                    if timers is not None:
                        for kg in self._timers_loaded:
                            keys, vals = snap.entries(name, kg)
                            timers[kg] = dict(zip(keys.to_pylist(), vals.to_pylist()))
                    continue
                for kg in self._loaded:
                    keys, vals = snap.entries(name, kg)
                    if len(keys):
                        d = self._stash.setdefault((name, kg), {})
                        d.update(zip(keys.to_pylist(), vals.to_pylist()))
        finally:
            snap.release()
        self._cache.notify_checkpoint_complete(snap.snapshot_id)
        return metas

    # ------------------------------------------------------------------ state API
    def get_state(self, descriptor, namespace_type: str = "void"):
        """As :meth:`statecore.backends.base.KeyedStateBackend.get_state`. A state's first
        registration reads the committed state metas (one round trip) and raises
        StateMigrationError for another TTL setting (no TTL migration of external state);
        the other checks of a committed meta run when a key group is read through."""
        name = getattr(descriptor, "name", None)
        if isinstance(name, str) and name not in self._cache.state_tables():
            meta = self._store_state_metas().get(name)
            ttl = getattr(descriptor, "ttl_config", None) is not None
            if meta is not None and bool(meta.get("ttl")) != ttl:
                raise StateMigrationError(_ttl_mismatch(name, self.namespace, meta, ttl))
        inner = self._cache.get_state(descriptor, namespace_type)
        st = self._states.get(id(inner))
        if st is None or st._inner is not inner:
            st = self._states[id(inner)] = _CachedState(self, inner, self.generation)
        return st

    def key_group_of(self, key) -> int:
        return self._cache.key_group_of(key)

    def set_current_key(self, key) -> None:
        """As the in-memory backends; reads the key's key group through first (on a store
        error the current key is unchanged)."""
        kg = self._cache.key_group_of(key)
        if kg not in self._loaded:
            self.read_through((kg,))
        else:
            self._stats["hits"] += 1
            recent = self._recent
            recent.pop(kg, None)
            recent[kg] = None
        self._cache.set_current_key(key)

    def keys(self, state_name: str, namespace=None, key_group_range=None) -> list:
        """As the in-memory backends (Flink ``getKeys``); reads the key groups through first."""
        r = self.key_group_range if key_group_range is None else KeyGroupRange.of(key_group_range)
        self.read_through(r)
        return self._cache.keys(state_name, namespace, key_group_range)

    def apply_to_all_keys(self, descriptor, function, namespace=None, **kwargs):
        """As the in-memory backends (Flink ``applyToAllKeys``) over every key group."""
        self.read_through(self.key_group_range)
        return self._cache.apply_to_all_keys(descriptor, function, namespace, **kwargs)

    def observe_watermark(self, watermark: int) -> None:
        self._cache.observe_watermark(watermark)

    def ttl_statistics(self) -> dict:
        return self._cache.ttl_statistics()

    def run_background_ttl_cleanup(self, max_key_groups: int = 1) -> int:
        """As the in-memory backends, over the key groups in the cache (removals reach the
        store with the next epoch)."""
        return self._cache.run_background_ttl_cleanup(max_key_groups)

    def num_entries(self) -> int:
        """Entries in the cache (the key groups read so far and the epoch's writes)."""
        return self._cache.num_entries()

    def state_bytes(self) -> int:
        """Bytes of the entries in the cache."""
        return self._cache.state_bytes()

    def snapshot(self, incremental: bool = False):
        """A full StateSnapshot of the task's state (every key group read through first), to
        export it (e.g. to a checkpoint). Incremental snapshots are the epoch protocol here:
        InvalidInputError for ``incremental=True``."""
        if incremental:
            raise InvalidInputError("external state is checkpointed by epochs (pre_commit and "
                                    "commit_epoch), not by incremental snapshots")
        self.read_through(self.key_group_range)
        return self._cache.snapshot()

    def restore(self, snapshot_like) -> None:
        """Add the entries of a StateSnapshot-like object (a snapshot or checkpoint reader) of
        the key-group range to the state, as writes of the running epoch (they reach the
        store with its pre-commit). Errors as the in-memory backends' restore; nothing changes
        then."""
        self.read_through(self.key_group_range)
        self._collect_changes()
        self._cache.restore(snapshot_like)
        snap = self._cache.snapshot()
        try:
            for meta in snap.state_metas():
                if meta["name"] == TIMERS_STATE_NAME:
                    continue
                for kg in self.key_group_range:
                    keys, vals = snap.entries(meta["name"], kg)
                    if len(keys):
                        d = self._stash.setdefault((meta["name"], kg), {})
                        d.update(zip(keys.to_pylist(), vals.to_pylist()))
        finally:
            snap.release()
        self._cache.notify_checkpoint_complete(snap.snapshot_id)

    # ------------------------------------------------------------------ epochs
    def pre_commit(self, epoch: int, sweep_ttl: bool = True) -> str:
        """Hand over the changes made since the last pre-commit as epoch ``epoch``'s
        write-ahead log of this task, and return the log's name (for the coordinator's
        ``commit_epoch``). The log holds the state metas and every changed entry (set or
        deleted); it is written all or nothing, replacing any earlier log of the same epoch
        and task. Nothing is visible to readers until the commit. The cache keeps serving the
        state, writes after this call belong to the next epoch. The log also asks the commit to
        remove the expired entries of TTL states in the next ``ttl_sweep_key_groups`` key
        groups of the range from the store (:meth:`_sweep_plan`: expired by this task's TTL
        clock now, so never an entry this task could still read); ``sweep_ttl=False`` asks for
        no sweep (the Spark operator's end-of-input flush: its watermark jumps to the end of time,
        which would make the sweep remove every TTL entry of those key groups, and the in-memory
        backends' background cleanup skips the flush too).

        Epochs commit in order: the previous pre-commit must be committed first (read from
        the store when :meth:`notify_committed` did not say so). Raises InvalidInputError for
        a bad ``epoch``, EpochCommitError when ``epoch`` is not newer than the committed epoch
        or the last pre-committed one, or the last pre-committed one is not committed, the
        store errors of statecore.errors when the write fails (the changes stay collected:
        pre-commit the same epoch again)."""
        self.check_open()
        check_epoch(epoch)
        for what, last in (("committed", self._committed),
                           ("pre-committed", self._last_pre_commit)):
            if last is not None and epoch <= last:
                raise EpochCommitError(f"epoch {epoch} is not newer than the {what} epoch "
                                       f"{last} of {self.namespace!r}")
        timers: dict = {}
        pending = self._last_pre_commit
        if pending is not None and (self._committed is None or self._committed < pending):
            self._committed = self._store_committed_epoch()
            if self._committed is None or self._committed < pending:
                # Its log holds only the changes since the previous one: committing this epoch
                # first would make the earlier epoch's commit a no-op (older than committed).
                raise EpochCommitError(
                    f"epoch {pending} pre-committed by task {self.task!r} of "
                    f"{self.namespace!r} is not committed yet: commit it (or abort it and "
                    "call abort()) before pre-committing the next epoch")
        metas = self._collect_changes(timers)
        changed = {kg: (self._timers_stored.get(kg, {}), t) for kg, t in timers.items()
                   if t != self._timers_stored.get(kg, {})}
        sweep = self._sweep_plan() if sweep_ttl else []
        op_changes = self._operator_state_changes()
        changes = self._stash
        if op_changes:
            changes = {**self._stash, **op_changes}
        if self._op_store is not None:
            metas = metas + self._op_store.metas()
        name = self._store_write_log(epoch, metas, changes, changed, sweep)
        for slot, diff in op_changes.items():
            d = self._op_stored.setdefault(slot, {})
            for k, v in diff.items():
                if v is None:
                    d.pop(k, None)
                else:
                    d[k] = v
            if not d:
                del self._op_stored[slot]
        if sweep:
            self._sweep_next = sweep[0][2][-1] + 1
        self._in_flight = {kg for (_, kg) in self._stash}
        self._stash = {}
        self._timers_stored.update({kg: now for kg, (_, now) in changed.items()})
        self._last_pre_commit = epoch
        return name

    def _sweep_plan(self) -> list:
        """``[(state, cutoff, key groups, width)]`` for :meth:`_store_write_log`: the next
        ``ttl_sweep_key_groups`` key groups of the range (round robin, from where the last
        pre-commit's stopped) for every TTL state, ``cutoff`` = this task's TTL time now minus
        the TTL (an entry stamped at or before it is expired: ``ts + ttl <= now``, Flink
        ``TtlUtils.expired``). Value, reducing, aggregating and map state (one timestamp per
        entry or user key) expire whole entries (``width`` None); a list chunk keeps a
        timestamp per element and is filtered as the in-memory backends' compaction filter
        does (:func:`statecore.ttl.filter_expired`: the leading expired elements dropped, the
        chunk when none is left), ``width`` its element width (0: variable width). Event-time
        TTL before the first watermark sweeps nothing."""
        n = self._sweep_key_groups
        if not n:
            return []
        states = []
        for name, table in self._cache.state_tables().items():
            meta = table.meta
            if (name == TIMERS_STATE_NAME or not meta.get("ttl")
                    or is_operator_state_meta(meta)):
                continue
            cfg = StateTtlConfig.from_meta(meta["ttl"])
            now = self._cache.ttl_now(cfg)
            if now == INT64_MIN or now - cfg.ttl_ms < INT64_MIN:
                continue
            width = None
            if meta.get("kind") == "list":
                width = value_serializer(meta["value_type"]).fixed_width or 0
            states.append((name, now - cfg.ttl_ms, width))
        if not states:
            return []
        r = self.key_group_range
        start = (self._sweep_next if self._sweep_next is not None and self._sweep_next in r
                 else r.start)
        kgs = [r.start + (start - r.start + i) % len(r) for i in range(min(n, len(r)))]
        return [(name, cutoff, kgs, width) for name, cutoff, width in sorted(states)]

    def notify_committed(self, epoch: int) -> None:
        """The coordinator committed ``epoch`` (every pre-commit up to it is now committed):
        the key groups of those logs are clean now, and past the bound the cache evicts
        (:meth:`evict`)."""
        check_epoch(epoch)
        if self._committed is None or epoch > self._committed:
            self._committed = epoch
        if not self._cache.disposed:
            self.evict()

    def abort(self) -> None:
        """Discard everything not committed: the cache (the epoch's writes and everything
        read) and the collected changes. The committed epoch is read again; state objects
        handed out before must be obtained again (:meth:`get_state`), the current key set
        again. The coordinator discards the epoch's logs (``abort_epoch``); the caller
        replays from the committed epoch."""
        self.check_open()
        committed = self._store_committed_epoch()
        self._cache.dispose()
        self._cache = _new_cache(self._cache_kind, **self._cache_options)
        self._loaded = set()
        self._timers_loaded = set()
        self._recent = {}
        self._in_flight = set()
        self._stash = {}
        self._timers_stored = {}
        self._states = {}
        self._last_pre_commit = None
        self._committed = committed
        self.generation += 1
        if self._op_task is not None:
            # The operator state's uncommitted changes go with the cache's.
            self.open_operator_state(*self._op_task)

    # ------------------------------------------------------------------ lifecycle
    def dispose(self) -> None:
        """Release the cache and the connection (unless passed in as ``client``); every later
        call raises StateError. Uncommitted changes are dropped. Idempotent."""
        if not self._cache.disposed:
            self._cache.dispose()
            if self._op_store is not None:
                self._op_store.clear()
            self._store_close()

    def close(self) -> None:
        """Alias of :meth:`dispose`."""
        self.dispose()

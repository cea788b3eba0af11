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

A store implements five hooks: ``_store_state_metas``, ``_store_read``,
``_store_committed_epoch``, ``_store_write_log`` and ``_store_close`` (their docstrings).
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
from statecore.timers import TIMERS_STATE_NAME

__all__ = ["CachedExternalBackend", "check_epoch", "check_task"]

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


class _CommittedEntries:
    """A StateSnapshot-like view of committed entries read from the store, restored into the cache:
    ``data[(state, kg)] = {encoded key: stored value}`` for the key groups read, nothing for
    the others."""

    def __init__(self, backend, metas: dict, data: dict):
        self.max_parallelism = backend.max_parallelism
        self.key_group_range = backend.key_group_range
        self.key_type = backend.key_type
        self.assigner = backend.assigner
        self._metas = metas
        self._data = data

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
                backend.read_through(backend.key_group_range)
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
    write-ahead logs (default ``kg<start>-<end>`` of the key-group range)."""

    def __init__(self, namespace: str, cache: str, cache_options: dict, task: str | None):
        if cache not in ("python", "native"):
            raise InvalidInputError(f"cache must be 'python' or 'native', got {cache!r}")
        self._namespace = namespace
        self._cache_options = dict(cache_options)
        self._cache_kind = cache
        self._cache = _new_cache(cache, **self._cache_options)
        r = self._cache.key_group_range
        self.task = check_task(f"kg{r.start}-{r.end}" if task is None else task)
        self._committed: int | None = None
        self._loaded: set[int] = set()
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

    def _store_write_log(self, epoch: int, metas: list[dict], changes: dict,
                         timers: dict) -> str:
        """Write epoch ``epoch``'s log of this task, all or nothing, replacing an earlier one
        of the same epoch and task; returns its name. ``metas``: the cache's state metas;
        ``changes``: ``{(state, kg): {encoded key: value or None}}``; ``timers``:
        ``{kg: (timers before, timers now)}`` of the key groups whose timers changed
        (``{timer key: entry}`` each)."""
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

    def check_open(self) -> None:
        self._cache.check_open()

    # ------------------------------------------------------------------ read-through
    def read_through(self, key_groups) -> None:
        """Read the committed entries of every state in those of ``key_groups`` (inside the
        key-group range) not read yet into the cache, in one request as of one committed
        epoch (the store's ``_store_read``). Store errors leave the cache unchanged
        (statecore.errors)."""
        self.check_open()
        r = self.key_group_range
        missing = sorted({int(kg) for kg in key_groups if kg in r} - self._loaded)
        if not missing:
            return
        metas, data = self._store_read(missing)
        self._collect_changes()
        self._check_ttl_settings(metas)
        self._cache.restore(_CommittedEntries(self, metas, data))
        self._loaded.update(missing)
        for kg in missing:
            self._timers_stored[kg] = data.get((TIMERS_STATE_NAME, kg), {})

    def read_through_keys(self, keys):
        """Read through the key groups of a batch's ``keys`` (the batch API's key forms): those
        of its distinct keys, or every key group of the range for a batch of at least 8 keys
        per key group not read yet. Returns the keys as a validated Arrow array to pass on (a
        stream is read once); keys the cache would refuse are returned as given, for the
        cache to raise its error."""
        r = self.key_group_range
        if len(self._loaded) == len(r):
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
                        for kg in self._loaded:
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
    def pre_commit(self, epoch: int) -> str:
        """Hand over the changes made since the last pre-commit as epoch ``epoch``'s
        write-ahead log of this task, and return the log's name (for the coordinator's
        ``commit_epoch``). The log holds the state metas and every changed entry (set or
        deleted); it is written all or nothing, replacing any earlier log of the same epoch
        and task. Nothing is visible to readers until the commit. The cache keeps serving the
        state, writes after this call belong to the next epoch.

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
        name = self._store_write_log(epoch, metas, self._stash, changed)
        self._stash = {}
        self._timers_stored.update({kg: now for kg, (_, now) in changed.items()})
        self._last_pre_commit = epoch
        return name

    def notify_committed(self, epoch: int) -> None:
        """The coordinator committed ``epoch`` (every pre-commit up to it is now committed)."""
        check_epoch(epoch)
        if self._committed is None or epoch > self._committed:
            self._committed = epoch

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
        self._stash = {}
        self._timers_stored = {}
        self._states = {}
        self._last_pre_commit = None
        self._committed = committed
        self.generation += 1

    # ------------------------------------------------------------------ lifecycle
    def dispose(self) -> None:
        """Release the cache and the connection (unless passed in as ``client``); every later
        call raises StateError. Uncommitted changes are dropped. Idempotent."""
        if not self._cache.disposed:
            self._cache.dispose()
            self._store_close()

    def close(self) -> None:
        """Alias of :meth:`dispose`."""
        self.dispose()

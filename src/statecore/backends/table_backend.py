"""TableBackend: what both keyed backends share over their per-state tables.

A :class:`TableBackend` keeps one :class:`statecore.backends.states.StateTable` per state
(registered or restored: :meth:`TableBackend.state_tables`) and the state objects handed out; it
registers states (:meth:`get_state`: compatibility checks, TTL migration on registration,
state classes per kind with or without TTL), checks a snapshot's states against the registered
ones, applies change sets, and resolves the rows of a batch to slots for the generic per-row
batch path. The rest of the backend protocol -- current key, key groups, snapshot ids, the TTL
clock and cleanup bookkeeping, timers -- is :class:`statecore.backends.base.KeyedStateBackend`.

A concrete backend supplies the storage: :meth:`TableBackend._new_table` (its StateTable),
snapshots, restores, the staging and applying of change sets, accounting, and the state
classes (:attr:`TableBackend.state_classes`, :attr:`TableBackend.ttl_state_classes`).
:class:`statecore.backends.python.PythonBackend` stores entries in dicts,
:class:`statecore.backends.native.NativeBackend` in the C++ state map.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from types import MappingProxyType

import pyarrow as pa

from statecore import serializers as S
from statecore.arrow_input import coerce_key_array, key_pylist
from statecore.backends import base
from statecore.backends.states import StateTable
from statecore.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from statecore.errors import InvalidInputError, StateMigrationError
from statecore.key_groups import KeyGroupRange
from statecore.operator_state import is_operator_state_meta, writers_of
from statecore.ttl import StateTtlConfig, entry_layout

__all__ = ["TableBackend", "STATE_KINDS"]

#: The state kinds a snapshot may hold (besides the timers), with their descriptor classes.
STATE_KINDS = {
    "value": ValueStateDescriptor,
    "list": ListStateDescriptor,
    "map": MapStateDescriptor,
    "reducing": ReducingStateDescriptor,
    "aggregating": AggregatingStateDescriptor,
}


class TableBackend(base.KeyedStateBackend):
    """A keyed state backend over one :class:`StateTable` per state (module docstring;
    arguments as :class:`statecore.backends.base.KeyedStateBackend`).

    What a state may ask of its backend (the state classes of :mod:`statecore.backends.states`,
    :mod:`statecore.backends.ttl_states` and :mod:`statecore.backends.native_states` use
    nothing else):

    * :meth:`check_open` and :meth:`require_current_key` -- the per-record slot of the
      current key (StateError when closed, InvalidInputError without a current key);
    * :meth:`batch_slots` -- the slots of the rows of a batch call (keys and namespaces
      validated);
    * :meth:`ttl_batch_accessed` -- the incremental TTL cleanup of a batch call's rows (every
      batch call; the steps to run before each row);
    * with TTL: :meth:`ttl_now`, :meth:`ttl_state_accessed` (incremental cleanup before an
      access) and :meth:`count_expired` (cleanup on read);
    * the key's parameters the native kernels take: ``key_type``, ``key_serializer``,
      ``assigner``, ``max_parallelism`` (and the native backend's ``encoded_current_key`` and
      ``key_prefix_width``, :class:`statecore.backends.native.NativeBackend`).

    What the backend reads on a state (:class:`statecore.backends.states.TableState`):
    ``table``, ``descriptor``, ``namespace_type`` and, for the rows of a batch without
    namespaces, ``require_current_namespace()``.
    """

    #: ``{state kind: class}`` of the state objects of states without TTL (subclasses set it).
    state_classes: dict = {}
    #: ``{state kind: class}`` of TTL-enabled states (subclasses set it).
    ttl_state_classes: dict = {}

    def __init__(self, **options):
        super().__init__(**options)
        self._tables: dict[str, StateTable] = {}
        self._states: dict[str, base.State] = {}

    def state_tables(self) -> Mapping[str, StateTable]:
        """``{state name: StateTable}`` of every state, registered or restored (a read-only
        view: it follows registrations and restores; the tables are the live storage)."""
        return MappingProxyType(self._tables)

    # ------------------------------------------------------------------ registration
    @abc.abstractmethod
    def _new_table(self, meta: dict) -> StateTable:
        """The storage of one state of state meta ``meta``."""

    def get_state(self, descriptor, namespace_type: str = "void"):
        self.check_open()
        if not isinstance(descriptor, StateDescriptor):
            raise InvalidInputError(f"expected a state descriptor, got {descriptor!r}")
        namespace_type = S.key_serializer(namespace_type).name
        if namespace_type not in base.NAMESPACE_TYPES:
            raise InvalidInputError(f"namespace type {namespace_type!r} is not supported")
        meta = dict(descriptor.meta(), namespace_type=namespace_type)
        table = self._tables.get(descriptor.name)
        if table is None:
            table = self._tables[descriptor.name] = self._new_table(meta)
        else:
            descriptor.check_compatible(table.meta, namespace_type)
            if (descriptor.ttl_config is not None) != table.ttl:
                # check_compatible let it pass: the descriptor requested the TTL migration.
                self._migrate_on_register(descriptor, table)
            if descriptor.ttl_config is not None:
                # TTL settings may change between runs; snapshots carry the current ones.
                table.meta["ttl"] = descriptor.ttl_config.meta()
        cached = self._states.get(descriptor.name)
        if (cached is not None and cached.descriptor is descriptor
                and cached.namespace_type == namespace_type):
            return cached
        if descriptor.ttl_config is not None:
            cls = self.ttl_state_classes[descriptor.kind]
        else:
            cls = self.state_classes[descriptor.kind]
        st = cls(self, descriptor, namespace_type, table)
        self._states[descriptor.name] = st
        cfg = descriptor.ttl_config
        if cfg is not None and cfg.run_cleanup_for_every_record:
            self._every_record_ttl[descriptor.name] = (table, cfg)
        else:
            self._every_record_ttl.pop(descriptor.name, None)
        return st

    def _migrate_on_register(self, descriptor, table: StateTable) -> None:
        """TTL migration of restored, not yet registered state ``table`` to ``descriptor``'s
        TTL setting (StateDescriptor.enable_ttl_migration). StateMigrationError when the state
        is registered already (its state objects read the current format), or when the
        conversion fails (the state is then unchanged)."""
        if table.name in self._states:
            raise StateMigrationError(
                f"state {table.name!r} is registered in this backend with TTL "
                f"{'enabled' if table.ttl else 'disabled'}; a TTL migration converts restored "
                "state when a descriptor first registers it, not a state in use")
        self._migrated(table.ttl_migrate(*self._ttl_migration_args(descriptor.ttl_config,
                                                                   table.meta)))

    def _ttl_migration_args(self, new_cfg, old_meta: dict) -> tuple:
        """``(ttl_meta, ts, ttl_ms, now)`` of :meth:`StateTable.ttl_migrate`: to TTL config
        ``new_cfg`` stamped with its clock's current time, or (None) from the TTL config in
        ``old_meta`` (the checkpoint's), expiring at that config's current time."""
        if new_cfg is not None:
            return new_cfg.meta(), self.ttl_now(new_cfg), 1, 0
        old = StateTtlConfig.from_meta(old_meta["ttl"])
        return None, 0, old.ttl_ms, self.ttl_now(old)

    def _migrated(self, expired: int) -> None:
        """Bookkeeping after a TTL migration: the expired things it dropped, and snapshots are
        full until one taken from now on completes (``_snapshot_incremental``)."""
        if expired:
            self.count_expired("migration", expired)
        self._ttl_migrated_at = self._last_snapshot_id

    # ------------------------------------------------------------------ TTL passes
    def _restamp_event_time_ttl(self, ts_from: int, ts_to: int) -> None:
        for table in self._tables.values():  # registered or restored
            cfg = self._ttl_config_of(table)
            if cfg is not None and cfg.event_time:
                table.ttl_restamp(ts_from, ts_to)

    def run_background_ttl_cleanup(self, max_key_groups: int = 1) -> int:
        """As :meth:`statecore.backends.base.KeyedStateBackend.run_background_ttl_cleanup`:
        whole key groups of every registered state with ``cleanup_in_background``, through the
        tables' :meth:`~statecore.backends.states.StateTable.ttl_cleanup_key_group`."""
        self.check_open()
        if (isinstance(max_key_groups, bool) or not isinstance(max_key_groups, int)
                or max_key_groups < 1):
            raise InvalidInputError(f"max_key_groups must be an int >= 1, got {max_key_groups!r}")
        targets = [(st.table, st.descriptor.ttl_config) for st in self._states.values()
                   if st.descriptor.ttl_config is not None
                   and st.descriptor.ttl_config.cleanup_in_background]
        if not targets:
            return 0
        r = self.key_group_range
        removed = 0
        for _ in range(min(max_key_groups, len(r))):
            kg = self._bg_ttl_kg if self._bg_ttl_kg in r else r.start
            self._bg_ttl_kg = kg + 1
            for table, cfg in targets:
                removed += table.ttl_cleanup_key_group(kg, cfg.ttl_ms, self.ttl_now(cfg))
        if removed:
            self.count_expired("background", removed)
        return removed

    # ------------------------------------------------------------------ snapshot / restore
    def _ttl_config_of(self, table: StateTable):
        """The TTL config in force for ``table``: the registered descriptor's, else the one
        recorded in its meta (restored, not registered yet), else None."""
        st = self._states.get(table.name)
        if st is not None:
            return st.descriptor.ttl_config
        return StateTtlConfig.from_meta(table.meta["ttl"]) if table.meta.get("ttl") else None

    def full_snapshot_ttl_filter(self, table: StateTable):
        """``(kind, fixed_width, ttl_ms, now)`` for :func:`statecore.ttl.filter_entries` when
        ``table`` has TTL with full-snapshot cleanup (now = the time of the snapshot), else None."""
        cfg = self._ttl_config_of(table)
        if cfg is None or not cfg.cleanup_full_snapshot:
            return None
        return (entry_layout(table.kind), table.value_ser.fixed_width, cfg.ttl_ms,
                self.ttl_now(cfg))

    def _table_for_restore(self, meta: dict) -> StateTable:
        """The registered table for a snapshot's state meta (checked compatible), or a new
        unregistered one. Raises StateMigrationError on an unknown kind or a conflicting meta."""
        if meta["kind"] not in STATE_KINDS:
            raise StateMigrationError(f"unknown state kind {meta['kind']!r} in snapshot")
        existing = self._tables.get(meta["name"])
        if existing is None:
            return self._new_table(meta)
        for f in ("kind", "value_type", "user_key_type", "namespace_type"):
            if existing.meta.get(f) != meta.get(f):
                raise StateMigrationError(
                    f"state {meta['name']!r}: {f}={meta.get(f)!r} in the snapshot but "
                    f"{existing.meta.get(f)!r} here"
                )
        if bool(existing.meta.get("ttl")) != bool(meta.get("ttl")):
            st = self._states.get(meta["name"])
            if st is not None and st.descriptor.ttl_migration:
                return existing  # restore converts the entries (_restore_migration)
            raise StateMigrationError(
                f"state {meta['name']!r}: written with TTL "
                f"{'enabled' if meta.get('ttl') else 'disabled'}, "
                f"{'registered' if st is not None else 'restored'} here with TTL "
                f"{'enabled' if existing.meta.get('ttl') else 'disabled'} (the values' formats "
                "differ: 8-byte timestamp suffix); "
                + ("register the state with descriptor.enable_ttl_migration() to convert it"
                   if st is not None else
                   "restore snapshots with the same TTL setting into one backend"))
        return existing

    def _restore_migration(self, table: StateTable, meta: dict):
        """None when the snapshot's state ``meta`` has ``table``'s TTL setting, else the
        ``(ttl_meta, ts, ttl_ms, now)`` converting its entries to the registered descriptor's
        (which requested the migration: _table_for_restore checked)."""
        if bool(meta.get("ttl")) == table.ttl:
            return None
        return self._ttl_migration_args(self._states[table.name].descriptor.ttl_config, meta)

    def apply_changes(self, changes) -> None:
        """Bring this backend from the state of a committed run to a later version: ``changes``
        is a :class:`~statecore.checkpoint.store.ChangesReader` (or any StateSnapshot-like
        object whose NULL values are tombstones). Its entries are upserted and its tombstoned
        keys removed, key group by key group of the backend's range (the native backend as
        bytes, without decoding); the timers of the range are replaced by the change set's
        (complete in every run). The result is the new incremental base, as after
        :meth:`restore`. Everything is checked first: InvalidInputError for malformed entries,
        StateMigrationError for another key type / max parallelism / assigner or a state whose
        TTL setting differs (restore the version instead), the reader's CorruptCheckpointError
        -- each leaves the backend unchanged."""
        self.check_open()
        base.check_snapshot_compatible(self, changes)
        kgs = list(self.key_group_range.intersection(KeyGroupRange.of(changes.key_group_range)))
        staged = []
        for meta in changes.state_metas():
            if meta["kind"] == "timers" or is_operator_state_meta(meta):
                continue  # not keyed state: the timer service / operator_state restore them
            table = self._table_for_restore(meta)
            if self._restore_migration(table, meta) is not None:
                raise StateMigrationError(
                    f"state {meta['name']!r}: its TTL setting differs from the change set's; a "
                    "change set is applied as stored, so restore the version instead")
            staged.append((table, self._stage_change_set(table, changes, kgs)))
        timers = self.timers.stage_restore(changes)
        ops = self._stage_own_operator_state(changes)
        for table, parts in staged:
            self._tables.setdefault(table.name, table)
            for part in parts:
                self._apply_staged_changes(table, part)
        self.timers.replace_restore(kgs, timers)
        if ops is not None:
            self.operator_state.apply_restore(ops)
        self._contents_are_base(applied_changes=True, version=base.checkpoint_version(changes),
                                commit_id=base.checkpoint_commit_id(changes))

    def _stage_own_operator_state(self, changes):
        """The operator state a change set brings (staged, or None to keep the backend's): that
        of the version restored for the writer whose key-group range is exactly this backend's
        (its operator index among the version's writers, at their parallelism: its own lists
        and broadcast state, every writer's union lists; docs/formats.md "Operator state"), as
        a restore of the version would give it. When no writer has this range (the version was
        written with another parallelism) and the version holds operator state,
        StateMigrationError: only a restore for an operator index and parallelism can
        redistribute it."""
        writers = writers_of(changes)
        kgr = self.key_group_range
        own = [i for i, w in enumerate(writers) if w.key_group_range == (kgr.start, kgr.end)]
        if len(own) == 1:
            return self.operator_state.stage_restore(writers, own[0], len(writers))
        if any(w.metas for w in writers):
            raise StateMigrationError(
                f"the change set's version was written by writers of other key-group ranges "
                f"than {kgr} and holds operator state: restore the version for this operator "
                "index and parallelism instead")
        return None

    def _stage_change_set(self, table: StateTable, changes, kgs: list) -> list:
        """The checked parts of ``changes`` for ``table``'s state over key groups ``kgs``, each
        for :meth:`_apply_staged_changes`: here one per key group (:meth:`_stage_changes`)."""
        return [self._stage_changes(table, kg, *changes.entries(table.name, kg)) for kg in kgs]

    @abc.abstractmethod
    def _stage_changes(self, table: StateTable, kg: int, keys: pa.Array, vals: pa.Array):
        """A change set's entries of key group ``kg`` for ``table`` (binary arrays, NULL value
        = tombstone), checked, in the form :meth:`_apply_staged_changes` applies.
        InvalidInputError for malformed entries, before anything changes."""

    @abc.abstractmethod
    def _apply_staged_changes(self, table: StateTable, part) -> None:
        """Apply one part staged by :meth:`_stage_change_set`."""

    @abc.abstractmethod
    def _contents_are_base(self, applied_changes: bool = False, version=None,
                           commit_id=None) -> None:
        """After a restore or (``applied_changes``) a change set: the current contents are the
        incremental base; ``version``: the checkpoint version they are (None: unknown;
        :meth:`statecore.backends.base.KeyedStateBackend.base_version`), ``commit_id`` that
        version's commit id (None: unknown)."""

    # ------------------------------------------------------------------ lifecycle
    def dispose(self) -> None:
        super().dispose()
        self._tables.clear()
        self._states.clear()

    def _state_namespace_type(self, state_name: str):
        table = self._tables.get(state_name)
        return None if table is None else table.meta["namespace_type"]

    # ------------------------------------------------------------------ batch helpers
    def batch_slots(self, state, keys, namespaces) -> list:
        """The slot ``(key group, k)`` of each row of a batch call on ``state``, as a list in
        row order: ``k`` is ``(key, namespace)`` here; backends whose tables take another slot
        key convert it (the native backend: the encoded key bytes). Keys and namespaces are
        validated as the batch API says (InvalidInputError before anything changes). The
        incremental TTL cleanup of the rows is the caller's (:meth:`ttl_batch_accessed`, a
        step before each row). StateError once the backend is closed."""
        self.check_open()
        arr = coerce_key_array(keys, self.key_type)
        ks = key_pylist(arr, self.key_type)
        nss = base.resolve_batch_namespaces(namespaces, state, len(ks))
        return [(self.key_group_of(k), (k, ns)) for k, ns in zip(ks, nss)]

"""PythonBackend: the pure-Python reference backend and test oracle.

State lives in plain dicts: per state, per key group, ``{(key, namespace): stored}``. ``stored``
is the canonical Python value for typed values and the pickled bytes for ``pickle`` values (so a
caller mutating an object after ``update`` cannot change state, as with the native backend which
serializes on write). List state stores a Python list of such values; map state a dict
``{serialized user key: stored user value}`` (user-key equality is byte equality, as natively).
Snapshots serialize everything at snapshot time (O(entries), deliberately simple), so later writes
never leak into them. Semantics: see :mod:`statecore.backends.base`.

Change tracking (incremental snapshots): every table records ``changes[(kg, (key, namespace))] =
stamp`` on each put and on each removal of a present entry, where ``stamp`` is the id of the last
snapshot taken before the write (the backend's ``_ChangeClock``). With base snapshot ``b``, the
changes are the records with ``stamp >= b``: those present now are listed with their value, the
absent ones as tombstones. Completing snapshot ``b`` drops the records older than ``b``; a restore
drops them all. This is the oracle for the native engine's versioned entries and removal log.
"""

from __future__ import annotations

import copy
import pickle

import pyarrow as pa
import pyarrow.compute as pc

from statecore import arrow_input
from statecore import serializers as S
from statecore.backends import base
from statecore.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from statecore.errors import InvalidInputError, StateError, StateMigrationError
from statecore.key_groups import KeyGroupRange
from statecore.timers import TIMERS_STATE_NAME
from statecore.ttl import StateTtlConfig, filter_entries, is_expired

__all__ = ["PythonBackend", "PythonSnapshot"]

_KINDS = {
    "value": ValueStateDescriptor,
    "list": ListStateDescriptor,
    "map": MapStateDescriptor,
    "reducing": ReducingStateDescriptor,
    "aggregating": AggregatingStateDescriptor,
}


def _to_stored(ser: S.ValueSerializer, v):
    """Validated, immutable stored form of ``v``."""
    if ser.name == "pickle":
        return ser.serialize(v)
    return ser.check(v)


def _from_stored(ser: S.ValueSerializer, s):
    return pickle.loads(s) if ser.name == "pickle" else s


def _stored_bytes(ser: S.ValueSerializer, s) -> bytes:
    return s if ser.name == "pickle" else ser.serialize(s)


def _stored_from_bytes(ser: S.ValueSerializer, b: bytes):
    return bytes(b) if ser.name == "pickle" else ser.deserialize(b)


def _ts_bytes(ts: int) -> bytes:
    return ts.to_bytes(8, "big", signed=True)


def _ts_from(b: bytes, pos: int) -> int:
    return int.from_bytes(b[pos:pos + 8], "big", signed=True)


def _split_ttl(ser: S.ValueSerializer, b: bytes):
    """(stored, ts) of ``value bytes + 8-byte timestamp``."""
    if len(b) < 8:
        raise InvalidInputError(f"TTL value of {len(b)} bytes lacks its 8-byte timestamp")
    return _stored_from_bytes(ser, b[:-8]), _ts_from(b, len(b) - 8)


def _filter_stored(kind: str, stored, ttl_ms: int, now: int):
    """statecore.ttl.filter_expired_counted on the stored form of a TTL value: ``(stored,
    0)`` unchanged, ``(trimmed, n)`` or ``(None, n)``."""
    if kind == "list":
        for i, (_, ts) in enumerate(stored):
            if not is_expired(ts, ttl_ms, now):
                return (stored, 0) if i == 0 else (stored[i:], i)
        return None, len(stored)
    if kind == "map":
        kept = {uk: e for uk, e in stored.items() if not is_expired(e[1], ttl_ms, now)}
        n = len(stored) - len(kept)
        return (stored if not n else (kept or None)), n
    return (None, 1) if is_expired(stored[1], ttl_ms, now) else (stored, 0)


def _migrate_stored(kind: str, stored, add: bool, ts: int, ttl_ms: int, now: int):
    """The stored form of one value converted by a TTL migration (ttl.h ``migrate_value`` on
    the stored form): ``add`` wraps every value, list element and map entry as ``(stored,
    ts)``; otherwise those expired under ``ttl_ms`` at ``now`` are dropped and the rest
    unwrapped. Returns ``(new, expired)``, ``new`` None when nothing remains (never when
    adding)."""
    if add:
        if kind == "list":
            return [(s, ts) for s in stored], 0
        if kind == "map":
            return {uk: (s, ts) for uk, s in stored.items()}, 0
        return (stored, ts), 0
    if kind == "list":
        kept = [s for s, t in stored if not is_expired(t, ttl_ms, now)]
        return (kept or None), len(stored) - len(kept)
    if kind == "map":
        kept = {uk: s for uk, (s, t) in stored.items() if not is_expired(t, ttl_ms, now)}
        return (kept or None), len(stored) - len(kept)
    return (None, 1) if is_expired(stored[1], ttl_ms, now) else (stored[0], 0)


class _ChangeClock:
    """Snapshot epoch shared by a backend's tables: ``now`` = id of the last snapshot taken."""

    __slots__ = ("now",)

    def __init__(self):
        self.now = 0


class _Table:
    """All entries of one state: ``data[key_group][(key, namespace)] = stored``; with a ``clock``,
    ``changes[(key_group, (key, namespace))]`` = stamp of the last write or removal (see module
    docstring)."""

    def __init__(self, meta: dict, clock: _ChangeClock | None = None):
        self.meta = dict(meta)
        self.name = meta["name"]
        self.kind = meta["kind"]
        self.namespace_type = meta["namespace_type"]
        self.ns_ser = S.key_serializer(self.namespace_type)
        self.value_ser = S.value_serializer(meta["value_type"])
        self.user_key_ser = S.key_serializer(meta["user_key_type"]) if self.kind == "map" else None
        # With TTL every stored value, list element and map entry is a (stored, timestamp ms)
        # pair; the bytes carry the timestamp as an 8-byte big-endian suffix (statecore.ttl).
        self.ttl = bool(meta.get("ttl"))
        self.data: dict[int, dict] = {}
        self.clock = clock
        self.changes: dict[tuple, int] = {}
        self._ttl_cursor = None  # [key group, its keys as listed on entry, position]

    def group(self, kg: int) -> dict:
        g = self.data.get(kg)
        if g is None:
            g = self.data[kg] = {}
        return g

    def get(self, kg, k):
        g = self.data.get(kg)
        return None if g is None else g.get(k)

    def put(self, kg, k, stored):
        self.group(kg)[k] = stored
        if self.clock is not None:
            self.changes[(kg, k)] = self.clock.now

    def remove(self, kg, k):
        g = self.data.get(kg)
        if g is not None and k in g:
            del g[k]
            if not g:
                del self.data[kg]
            if self.clock is not None:
                self.changes[(kg, k)] = self.clock.now

    def drop_changes_before(self, stamp: int) -> None:
        """Forget the changes recorded before snapshot ``stamp`` (it became the base)."""
        self.changes = {ck: st for ck, st in self.changes.items() if st >= stamp}

    # ---- TTL cleanup passes (incremental and background; statecore.ttl)
    def ttl_cleanup_step(self, kgs: KeyGroupRange, min_entries: int, ttl_ms: int, now: int):
        """One step of the lazy global iterator over the key groups ``kgs`` (Flink heap
        incremental cleanup): visits at least ``min_entries`` entries from where the last step
        stopped (or up to the end of a pass) and removes or trims expired ones through
        :meth:`put`/:meth:`remove` (so they are tracked as changes). Each key group's keys are
        listed when the walk enters it, so writes meanwhile never invalidate the iterator
        (keys added after that are seen in the next pass). Returns ``(visited, expired,
        wrapped)``, ``expired`` counted as :func:`statecore.ttl.filter_expired_counted`."""
        cur = self._ttl_cursor
        if cur is None or cur[0] not in kgs:
            cur = self._ttl_cursor = [kgs.start, None, 0]
        visited = expired = 0
        while True:
            kg, keys, i = cur
            if keys is None:
                keys = cur[1] = list(self.data.get(kg, ()))
            while i < len(keys) and visited < min_entries:
                visited += 1
                expired += self._ttl_filter_one(kg, keys[i], ttl_ms, now)
                i += 1
            cur[2] = i
            if i < len(keys):
                return visited, expired, False
            if kg >= kgs.end:
                self._ttl_cursor = [kgs.start, None, 0]
                return visited, expired, True
            cur[:] = [kg + 1, None, 0]
            if visited >= min_entries:
                return visited, expired, False

    def ttl_restamp(self, ts_from: int, ts_to: int) -> int:
        """Rewrite every timestamp equal to ``ts_from`` to ``ts_to`` (through :meth:`put`);
        returns how many were rewritten."""
        n = 0
        for kg, group in list(self.data.items()):
            for k, stored in list(group.items()):
                if self.kind == "list":
                    hits = sum(ts == ts_from for _, ts in stored)
                    new = [(s, ts_to if ts == ts_from else ts) for s, ts in stored]
                elif self.kind == "map":
                    hits = sum(e[1] == ts_from for e in stored.values())
                    new = {uk: (e[0], ts_to if e[1] == ts_from else e[1]) for uk, e in stored.items()}
                else:
                    hits = int(stored[1] == ts_from)
                    new = (stored[0], ts_to)
                if hits:
                    self.put(kg, k, new)
                    n += hits
        return n

    def ttl_migrate(self, ttl_meta, ts: int, ttl_ms: int, now: int) -> int:
        """Convert every entry to the other TTL format (restoring with TTL switched on or off):
        with ``ttl_meta`` (the new TTL config's meta) every value, list element and map entry
        gets timestamp ``ts`` (ms); with None, what is expired under ``ttl_ms`` at ``now`` (ms)
        is dropped and the rest loses its timestamp. Writes go through :meth:`put`/:meth:`remove`
        (tracked as changes); the meta's ``ttl`` and :attr:`ttl` follow. Returns the expired
        things dropped. Every entry is converted before any is written, so an error leaves the
        table unchanged (decoded stored forms cannot fail here; the native table can)."""
        add = ttl_meta is not None
        staged, expired = [], 0
        for kg, group in self.data.items():
            for k, stored in group.items():
                new, n = _migrate_stored(self.kind, stored, add, ts, ttl_ms, now)
                staged.append((kg, k, new))
                expired += n
        for kg, k, new in staged:
            if new is None:
                self.remove(kg, k)
            else:
                self.put(kg, k, new)
        self._set_ttl_meta(ttl_meta)
        return expired

    def _set_ttl_meta(self, ttl_meta) -> None:
        self.ttl = ttl_meta is not None
        if self.ttl:
            self.meta["ttl"] = dict(ttl_meta)
        else:
            self.meta.pop("ttl", None)

    def ttl_cleanup_key_group(self, kg: int, ttl_ms: int, now: int) -> int:
        """Background cleanup of one whole key group; returns the expired things removed."""
        return sum(self._ttl_filter_one(kg, k, ttl_ms, now) for k in list(self.data.get(kg, ())))

    def _ttl_filter_one(self, kg: int, k, ttl_ms: int, now: int) -> int:
        cur = self.get(kg, k)
        if cur is None:
            return 0
        new, n = _filter_stored(self.kind, cur, ttl_ms, now)
        if new is None:
            self.remove(kg, k)
        elif new is not cur:
            self.put(kg, k, new)
        return n

    def encode_value(self, stored) -> bytes:
        """Bytes of a stored value (docs/architecture.md). With TTL: value bytes + 8-byte
        big-endian timestamp; list elements each ``bytes + ts`` (fixed width: a stride of
        width + 8; otherwise ``varlen(len(bytes)) + bytes + ts``); map entries ``bytes + ts``
        as the user value."""
        ser, ttl = self.value_ser, self.ttl
        if self.kind == "list":
            out = []
            for e in stored:
                s, ts = e if ttl else (e, None)
                b = _stored_bytes(ser, s)
                if not ser.fixed_width:
                    out.append(S.write_varlen(len(b)))
                out.append(b)
                if ttl:
                    out.append(_ts_bytes(ts))
            return b"".join(out)
        if self.kind == "map":
            if ttl:
                return S.encode_map_serialized(
                    {uk: _stored_bytes(ser, s) + _ts_bytes(ts) for uk, (s, ts) in stored.items()})
            return S.encode_map_serialized({uk: _stored_bytes(ser, uv) for uk, uv in stored.items()})
        if ttl:
            s, ts = stored
            return _stored_bytes(ser, s) + _ts_bytes(ts)
        return _stored_bytes(ser, stored)

    def decode_value(self, b: bytes):
        """Inverse of :meth:`encode_value`; InvalidInputError for malformed bytes."""
        ser, ttl = self.value_ser, self.ttl
        b = bytes(b)
        if self.kind == "list":
            w = ser.fixed_width
            if not ttl and ser.name != "pickle":
                return S.decode_list(b, ser)
            out, pos = [], 0
            while pos < len(b):
                if w:
                    n = w
                else:
                    n, pos = S.read_varlen(b, pos)
                end = pos + n + (8 if ttl else 0)
                if end > len(b):
                    raise InvalidInputError("truncated list element")
                s = _stored_from_bytes(ser, b[pos:pos + n])
                out.append((s, _ts_from(b, pos + n)) if ttl else s)
                pos = end
            return out
        if self.kind == "map":
            pairs = S.decode_map(b, self.user_key_ser, self.value_ser, raw=True)
            if ttl:
                return {bytes(uk): _split_ttl(ser, uv) for uk, uv in pairs}
            return {bytes(uk): _stored_from_bytes(ser, uv) for uk, uv in pairs}
        if ttl:
            return _split_ttl(ser, b)
        return _stored_from_bytes(ser, b)


_EMPTY = (pa.array([], pa.binary()), pa.array([], pa.binary()))


class PythonSnapshot:
    """StateSnapshot holding serialized entries (pa.binary arrays) taken at snapshot time: all of
    them, or with ``incremental`` the changes since the base (NULL value = tombstone)."""

    def __init__(self, max_parallelism, key_group_range, key_type, assigner, metas, data,
                 snapshot_id: int = 0, incremental: bool = False):
        self.max_parallelism = max_parallelism
        self.key_group_range = key_group_range
        self.key_type = key_type
        self.assigner = assigner
        self._metas = metas
        self._data = data  # name -> kg -> (keys, values)
        self._released = False
        self.snapshot_id = snapshot_id
        self.incremental = incremental
        self.ttl_expired: dict = {}  # TTL cleanup counts since the previous snapshot

    def state_metas(self) -> list[dict]:
        return copy.deepcopy(self._metas)

    def entries(self, state_name: str, key_group: int):
        """(keys, values) pa.binary arrays of one state and key group, sorted by key bytes; empty
        for key groups without entries. Raises StateError after release, InvalidInputError for an
        unknown state or a key group outside [0, max_parallelism)."""
        if self._released:
            raise StateError("snapshot was released")
        if state_name not in self._data:
            raise InvalidInputError(f"snapshot has no state named {state_name!r}")
        if not 0 <= key_group < self.max_parallelism:
            raise InvalidInputError(f"key group {key_group} outside [0, {self.max_parallelism - 1}]")
        got = self._data[state_name].get(key_group)
        return _EMPTY if got is None else got

    def release(self) -> None:
        self._released = True
        self._data = {n: {} for n in self._data}


class PythonBackend(base.KeyedStateBackend):
    """The pure-Python reference backend (see module docstring and :mod:`..base`)."""

    def __init__(self, **options):
        super().__init__(**options)
        self._tables: dict[str, _Table] = {}
        self._states: dict[str, base.State] = {}
        self._clock = _ChangeClock()

    # ------------------------------------------------------------------ registration
    def _new_table(self, meta: dict) -> _Table:
        """The storage of one state (the native backend substitutes its own)."""
        return _Table(meta, self._clock)

    def get_state(self, descriptor, namespace_type: str = "void"):
        self._check_open()
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
        if cached is not None and cached.descriptor is descriptor and cached.namespace_type == namespace_type:
            return cached
        if descriptor.ttl_config is not None:
            cls = self._ttl_state_classes()[descriptor.kind]
        else:
            cls = self._state_classes[descriptor.kind]
        st = cls(self, descriptor, namespace_type, table)
        self._states[descriptor.name] = st
        cfg = descriptor.ttl_config
        if cfg is not None and cfg.run_cleanup_for_every_record:
            self._every_record_ttl[descriptor.name] = (table, cfg)
        else:
            self._every_record_ttl.pop(descriptor.name, None)
        return st

    def _migrate_on_register(self, descriptor, table: _Table) -> None:
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
        """``(ttl_meta, ts, ttl_ms, now)`` of :meth:`_Table.ttl_migrate`: to TTL config
        ``new_cfg`` stamped with its clock's current time, or (None) from the TTL config in
        ``old_meta`` (the checkpoint's), expiring at that config's current time."""
        if new_cfg is not None:
            return new_cfg.meta(), self.ttl_now(new_cfg), 1, 0
        old = StateTtlConfig.from_meta(old_meta["ttl"])
        return None, 0, old.ttl_ms, self.ttl_now(old)

    def _migrated(self, expired: int) -> None:
        """Bookkeeping after a TTL migration: the expired things it dropped, and snapshots are
        full until one taken from now on completes (base._snapshot_incremental)."""
        if expired:
            self._count_expired("migration", expired)
        self._ttl_migrated_at = self._last_snapshot_id

    def _ttl_state_classes(self) -> dict:
        """``{kind: class}`` of TTL-enabled states (the native backend swaps in kernel-backed
        value/reducing classes). Imported lazily: ttl_states imports this module."""
        from statecore.backends.ttl_states import TTL_STATE_CLASSES

        return TTL_STATE_CLASSES

    # ------------------------------------------------------------------ snapshot / restore
    def _encode_entry_key(self, table: _Table, kg: int, k) -> bytes:
        return S.encode_key(kg, self.max_parallelism, k[0], self._key_ser, k[1], table.ns_ser)

    def snapshot(self, incremental: bool = False) -> PythonSnapshot:
        self._check_open()
        incremental = self._snapshot_incremental(incremental)
        metas, data = [], {}
        for name, table in self._tables.items():
            metas.append(dict(table.meta))
            per_kg = {}
            if incremental:
                # Every recorded change is at or after the base (older ones were dropped).
                rows: dict[int, list] = {}
                for (kg, k) in table.changes:
                    stored = table.get(kg, k)
                    rows.setdefault(kg, []).append(
                        (self._encode_entry_key(table, kg, k),
                         None if stored is None else table.encode_value(stored)))
                groups = rows.items()
            else:
                groups = ((kg, [(self._encode_entry_key(table, kg, k), table.encode_value(v))
                                for k, v in g.items()]) for kg, g in table.data.items())
            filt = None if incremental else self._full_snapshot_ttl_filter(table)
            for kg, pairs in groups:
                pairs.sort(key=lambda p: p[0])
                keys = pa.array([p[0] for p in pairs], pa.binary())
                vals = pa.array([p[1] for p in pairs], pa.binary())
                if filt is not None:
                    keys, vals, n = filter_entries(*filt, keys, vals)
                    self._count_expired("full_snapshot", n)
                    if not len(keys):
                        continue
                per_kg[kg] = (keys, vals)
            data[name] = per_kg
        metas.append(self.timers.meta())
        data[TIMERS_STATE_NAME] = self.timers.snapshot_all()
        sid = self._next_snapshot_id()
        self._clock.now = sid
        snap = PythonSnapshot(self.max_parallelism, self.key_group_range, self.key_type,
                              self.assigner, metas, data, snapshot_id=sid, incremental=bool(incremental))
        snap.ttl_expired = self._take_ttl_delta()
        return snap

    def _complete_snapshot(self, snapshot_id: int) -> None:
        for table in self._tables.values():
            table.drop_changes_before(snapshot_id)

    def _ttl_config_of(self, table: _Table):
        """The TTL config in force for ``table``: the registered descriptor's, else the one
        recorded in its meta (restored, not registered yet), else None."""
        st = self._states.get(table.name)
        if st is not None:
            return st.descriptor.ttl_config
        return StateTtlConfig.from_meta(table.meta["ttl"]) if table.meta.get("ttl") else None

    def _full_snapshot_ttl_filter(self, table: _Table):
        """``(kind, fixed_width, ttl_ms, now)`` for :func:`statecore.ttl.filter_entries` when
        ``table`` has TTL with full-snapshot cleanup (now = the time of the snapshot), else None."""
        cfg = self._ttl_config_of(table)
        if cfg is None or not cfg.cleanup_full_snapshot:
            return None
        return (table.kind, table.value_ser.fixed_width, cfg.ttl_ms, self.ttl_now(cfg))

    def _table_for_restore(self, meta: dict) -> _Table:
        """The registered table for a snapshot's state meta (checked compatible), or a new
        unregistered one. Raises StateMigrationError on an unknown kind or a conflicting meta."""
        if meta["kind"] not in _KINDS:
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

    def _restore_migration(self, table: _Table, meta: dict):
        """None when the snapshot's state ``meta`` has ``table``'s TTL setting, else the
        ``(ttl_meta, ts, ttl_ms, now)`` converting its entries to the registered descriptor's
        (which requested the migration: _table_for_restore checked)."""
        if bool(meta.get("ttl")) == table.ttl:
            return None
        return self._ttl_migration_args(self._states[table.name].descriptor.ttl_config, meta)

    def restore(self, snapshot_like) -> None:
        self._check_open()
        base.check_snapshot_compatible(self, snapshot_like)
        metas = snapshot_like.state_metas()
        kgs = list(self.key_group_range.intersection(KeyGroupRange.of(snapshot_like.key_group_range)))
        # Decode everything first so that a malformed snapshot leaves the backend unchanged.
        staged = []
        migrated, expired = False, 0
        for meta in metas:
            if meta["kind"] == "timers":
                continue
            table = self._table_for_restore(meta)
            migration = self._restore_migration(table, meta)
            # A TTL migration reads the snapshot's format and converts to the table's.
            src = table if migration is None else _Table(meta)
            migrated = migrated or migration is not None
            rows = []
            for kg in kgs:
                keys, vals = snapshot_like.entries(meta["name"], kg)
                for (key, ns), vb in zip(self._entry_keys(table, kg, keys), vals.to_pylist()):
                    v = src.decode_value(vb)
                    if migration is not None:
                        ttl_meta, ts, ttl_ms, now = migration
                        v, n = _migrate_stored(table.kind, v, ttl_meta is not None, ts, ttl_ms, now)
                        expired += n
                        if v is None:
                            continue  # expired under the snapshot's TTL: not restored
                    rows.append((kg, (key, ns), v))
            staged.append((table, rows))
        timers = self.timers.stage_restore(snapshot_like)
        for table, rows in staged:
            self._tables.setdefault(table.name, table)
            for kg, k, v in rows:
                table.put(kg, k, v)
        self.timers.apply_restore(timers)
        # The restored state is the base: nothing before it is a change any more.
        self._contents_are_base()
        if migrated:
            self._migrated(expired)

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
        self._check_open()
        base.check_snapshot_compatible(self, changes)
        kgs = list(self.key_group_range.intersection(KeyGroupRange.of(changes.key_group_range)))
        staged = []
        for meta in changes.state_metas():
            if meta["kind"] == "timers":
                continue
            table = self._table_for_restore(meta)
            if self._restore_migration(table, meta) is not None:
                raise StateMigrationError(
                    f"state {meta['name']!r}: its TTL setting differs from the change set's; a "
                    "change set is applied as stored, so restore the version instead")
            staged.append((table, self._stage_change_set(table, changes, kgs)))
        timers = self.timers.stage_restore(changes)
        for table, parts in staged:
            self._tables.setdefault(table.name, table)
            for part in parts:
                self._apply_staged_changes(table, part)
        self.timers.replace_restore(kgs, timers)
        self._contents_are_base(applied_changes=True)

    def _stage_change_set(self, table: _Table, changes, kgs: list) -> list:
        """The checked parts of ``changes`` for ``table``'s state over key groups ``kgs``, each
        for :meth:`_apply_staged_changes`: here one per key group (:meth:`_stage_changes`)."""
        return [self._stage_changes(table, kg, *changes.entries(table.name, kg)) for kg in kgs]

    def _stage_changes(self, table: _Table, kg: int, keys: pa.Array, vals: pa.Array) -> list:
        """A change set's entries of ``kg`` checked and decoded: ``[(kg, (key, ns), value or
        None for a tombstone)]``."""
        return [(kg, k, None if vb is None else table.decode_value(vb))
                for k, vb in zip(self._entry_keys(table, kg, keys), vals.to_pylist())]

    def _apply_staged_changes(self, table: _Table, rows: list) -> None:
        for kg, k, v in rows:
            if v is None:
                table.remove(kg, k)
            else:
                table.put(kg, k, v)

    def _entry_keys(self, table: _Table, kg: int, keys: pa.Array) -> list:
        """``(key, namespace)`` of each encoded key of a snapshot's ``kg``; InvalidInputError
        when one carries another key group."""
        out = []
        for kb in keys.to_pylist():
            kg2, key, ns, _ = S.decode_key(kb, self.max_parallelism, self._key_ser, table.ns_ser)
            if kg2 != kg:
                raise InvalidInputError(f"entry {kb.hex()} of state {table.name!r} listed under key group {kg}")
            out.append((key, ns))
        return out

    def _contents_are_base(self, applied_changes: bool = False) -> None:
        """After a restore or (``applied_changes``) a change set: the current contents are the
        incremental base."""
        for table in self._tables.values():
            table.changes.clear()
        self._restored_is_base()

    # ------------------------------------------------------------------ accounting
    def num_entries(self) -> int:
        return sum(len(g) for t in self._tables.values() for g in t.data.values())

    def state_bytes(self) -> int:
        return sum(len(self._encode_entry_key(t, kg, k)) + len(t.encode_value(v))
                   for t in self._tables.values() for kg, g in t.data.items() for k, v in g.items())

    def close(self) -> None:
        super().close()
        self._tables.clear()
        self._states.clear()

    # ------------------------------------------------------------------ batch helpers
    def _batch_slots(self, state, keys, namespaces):
        arr = arrow_input.coerce_key_array(keys, self.key_type)
        ks = arrow_input.key_pylist(arr, self.key_type)
        cfg = state.descriptor.ttl_config
        if cfg is not None and cfg.cleanup_size:
            self._ttl_accessed(state._table, cfg, len(ks))  # one access per row
        nss = base.resolve_batch_namespaces(namespaces, state, len(ks))
        return [(self.key_group_of(k), (k, ns)) for k, ns in zip(ks, nss)]


class _PyState:
    # The slot of the batch row being applied (see _rows), else None: per-record code then
    # addresses the backend's current key.
    _row_slot = None

    def __init__(self, backend: PythonBackend, descriptor, namespace_type, table: _Table):
        base.State.__init__(self, backend, descriptor, namespace_type)
        self._table = table
        self._ser = table.value_ser

    def _slot(self):
        if self._row_slot is not None:
            return self._row_slot
        self.backend._check_open()
        key, kg = self.backend._require_key()
        return kg, (key, self._require_namespace())

    def _apply_rows(self, keys, namespaces, fn, *columns) -> list:
        """``[fn(*row) for each row]``, ``row`` = the row's items of ``columns``, with the row's
        (key, namespace) as the slot of the per-record methods meanwhile: the generic batch
        path, which applies a batch exactly as the same rows one at a time (TTL included)
        without touching the backend's current key."""
        slots = self.backend._batch_slots(self, keys, namespaces)
        out = []
        try:
            for i, slot in enumerate(slots):
                self._row_slot = slot
                out.append(fn(*(c[i] for c in columns)))
        finally:
            self._row_slot = None
        return out

    def _typed(self, what: str) -> pa.DataType:
        if self._ser.arrow_type is None:
            raise InvalidInputError(f"{what}: the batch API needs a typed value (not pickle) state")
        return self._ser.arrow_type

    def clear(self) -> None:
        kg, k = self._slot()
        self._table.remove(kg, k)

    def clear_batch(self, keys, namespaces=None) -> None:
        for kg, k in self.backend._batch_slots(self, keys, namespaces):
            self._table.remove(kg, k)

    def get_batch(self, keys, namespaces=None) -> pa.Array:
        if self._table.kind not in ("value", "reducing"):
            raise InvalidInputError(f"{self._table.kind} state has no get_batch")
        if self._ser.arrow_type is None:
            raise InvalidInputError("the batch API needs a typed value (not pickle) state")
        slots = self.backend._batch_slots(self, keys, namespaces)
        return pa.array([self._table.get(kg, k) for kg, k in slots], self._ser.arrow_type)


class _Value(_PyState, base.ValueState):
    def contains_batch(self, keys, namespaces=None) -> pa.Array:
        """A row reads as get_batch does (TTL visibility and cleanup on read included) and is
        true where that read returns a value (bool array, no nulls)."""
        return pc.is_valid(self.get_batch(keys, namespaces))

    def value(self):
        kg, k = self._slot()
        s = self._table.get(kg, k)
        return self.descriptor.default_value() if s is None else _from_stored(self._ser, s)

    def update(self, value) -> None:
        kg, k = self._slot()
        if value is None:
            self._table.remove(kg, k)
        else:
            self._table.put(kg, k, _to_stored(self._ser, value))

    def put_batch(self, keys, values, namespaces=None) -> None:
        arr = arrow_input.coerce_key_array(keys, self.backend.key_type)
        vals = self._ser.to_pylist(arrow_input.coerce_value_array(values, self._ser.name, len(arr)))
        slots = self.backend._batch_slots(self, arr, namespaces)
        for (kg, k), v in zip(slots, vals):
            if v is None:
                self._table.remove(kg, k)
            else:
                self._table.put(kg, k, _to_stored(self._ser, v))


class _List(_PyState, base.ListState):
    def get(self) -> list:
        kg, k = self._slot()
        return [_from_stored(self._ser, e) for e in self._table.get(kg, k) or ()]

    def _elements(self, values) -> list:
        if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
            raise InvalidInputError(f"expected an iterable of elements, got {type(values).__name__}")
        out = []
        for v in values:
            if v is None:
                raise InvalidInputError("list state elements must not be None")
            out.append(_to_stored(self._ser, v))
        return out

    def add(self, value) -> None:
        kg, k = self._slot()
        if value is None:
            raise InvalidInputError("cannot add None to a list state")
        e = _to_stored(self._ser, value)
        self._table.put(kg, k, (self._table.get(kg, k) or []) + [e])

    def add_all(self, values) -> None:
        kg, k = self._slot()
        es = self._elements(values)
        if es:
            self._table.put(kg, k, (self._table.get(kg, k) or []) + es)

    def update(self, values) -> None:
        kg, k = self._slot()
        es = self._elements(values)
        if es:
            self._table.put(kg, k, es)
        else:
            self._table.remove(kg, k)

    def append_batch(self, keys, values, namespaces=None) -> None:
        t = self._typed("append_batch")
        arr = arrow_input.coerce_key_array(keys, self.backend.key_type)
        name = self._ser.name
        vals = arrow_input.as_arrow_array(values, "values", lambda t: arrow_input.arrow_type_ok(name, t) or (
            (pa.types.is_list(t) or pa.types.is_large_list(t))
            and arrow_input.arrow_type_ok(name, t.value_type)))
        if len(vals) != len(arr):
            raise InvalidInputError(f"values have {len(vals)} rows but keys have {len(arr)}")
        if pa.types.is_list(vals.type) or pa.types.is_large_list(vals.type):
            arrow_input.check_arrow_type(vals.values, self._ser.name, "list elements")
            rows = [[] if r is None else r for r in self._ser.to_pylist(vals)]
            bad = sum(e is None for r in rows for e in r)
            if bad:
                raise InvalidInputError(f"values contain {bad} null list element(s); list "
                                        "state elements must not be null")
        else:
            arrow_input.check_arrow_type(vals, self._ser.name, f"values (or a list<{t}> array)")
            if vals.null_count:
                raise InvalidInputError(f"values contain {vals.null_count} null(s); list state "
                                        "elements must not be null")
            rows = [[v] for v in self._ser.to_pylist(vals)]
        for r in rows:  # validate every element before anything changes
            for e in r:
                _to_stored(self._ser, e)
        # One row = one add_all call: its elements share one TTL timestamp.
        self._apply_rows(arr, namespaces, lambda r: r and self.add_all(r), rows)

    def get_batch(self, keys, namespaces=None) -> pa.Array:
        t = self._typed("get_batch")
        return pa.array(self._apply_rows(keys, namespaces, self.get), pa.list_(t))


class _Map(_PyState, base.MapState):
    def __init__(self, *a):
        super().__init__(*a)
        self._uks = self._table.user_key_ser

    def _map(self):
        kg, k = self._slot()
        return self._table.get(kg, k) or {}

    def get(self, user_key):
        s = self._map().get(self._uks.serialize(user_key))
        return None if s is None else _from_stored(self._ser, s)

    def put(self, user_key, user_value) -> None:
        self.put_all([(user_key, user_value)])

    def put_all(self, mapping) -> None:
        kg, k = self._slot()
        items = mapping.items() if isinstance(mapping, dict) else mapping
        staged = [(self._uks.serialize(uk), _to_stored(self._ser, uv)) for uk, uv in items]
        if staged:
            m = dict(self._table.get(kg, k) or {})
            m.update(staged)
            self._table.put(kg, k, m)

    def contains(self, user_key) -> bool:
        return self._uks.serialize(user_key) in self._map()

    def remove(self, user_key) -> None:
        kg, k = self._slot()
        ukb = self._uks.serialize(user_key)
        m = self._table.get(kg, k)
        if m is None or ukb not in m:
            return
        m = dict(m)
        del m[ukb]
        if m:
            self._table.put(kg, k, m)
        else:
            self._table.remove(kg, k)

    def items(self) -> list:
        m = self._map()
        return [(self._uks.deserialize(uk), _from_stored(self._ser, m[uk])) for uk in sorted(m)]

    def keys(self) -> list:
        return [uk for uk, _ in self.items()]

    def values(self) -> list:
        return [uv for _, uv in self.items()]

    def is_empty(self) -> bool:
        return not self._map()

    def _user_keys(self, user_keys, length: int) -> list:
        if self._uks.name == "pickle":
            raise InvalidInputError("the batch API needs a typed user key (not pickle) map state")
        arr = arrow_input.as_arrow_array(user_keys, "user_keys",
                                  lambda t: arrow_input.arrow_type_ok(self._uks.name, t))
        if len(arr) != length:
            raise InvalidInputError(f"user_keys have {len(arr)} rows but keys have {length}")
        arrow_input.check_arrow_type(arr, self._uks.name, "user_keys")
        if arr.null_count:
            raise InvalidInputError(f"user_keys contain {arr.null_count} null(s); map user keys "
                                    "must not be null")
        return arr.to_pylist()

    def put_batch(self, keys, user_keys, values, namespaces=None) -> None:
        self._typed("put_batch")
        arr = arrow_input.coerce_key_array(keys, self.backend.key_type)
        uks = self._user_keys(user_keys, len(arr))
        vals = arrow_input.coerce_value_array(values, self._ser.name, len(arr))
        if vals.null_count:
            raise InvalidInputError(f"values contain {vals.null_count} null(s); use remove_batch "
                                    "to remove user keys")
        vals = self._ser.to_pylist(vals)
        for v in vals:  # validate every value before anything changes
            _to_stored(self._ser, v)
        self._apply_rows(arr, namespaces, self.put, uks, vals)

    def get_batch(self, keys, user_keys, namespaces=None) -> pa.Array:
        t = self._typed("get_batch")
        arr = arrow_input.coerce_key_array(keys, self.backend.key_type)
        uks = self._user_keys(user_keys, len(arr))
        return pa.array(self._apply_rows(arr, namespaces, self.get, uks), t)

    def contains_batch(self, keys, user_keys, namespaces=None) -> pa.Array:
        arr = arrow_input.coerce_key_array(keys, self.backend.key_type)
        uks = self._user_keys(user_keys, len(arr))
        return pa.array(self._apply_rows(arr, namespaces, self.contains, uks), pa.bool_())

    def remove_batch(self, keys, user_keys, namespaces=None) -> None:
        arr = arrow_input.coerce_key_array(keys, self.backend.key_type)
        uks = self._user_keys(user_keys, len(arr))
        self._apply_rows(arr, namespaces, self.remove, uks)


class _Reducing(_PyState, base.ReducingState):
    def get(self):
        kg, k = self._slot()
        s = self._table.get(kg, k)
        return None if s is None else _from_stored(self._ser, s)

    def _reduce(self, cur_stored, v):
        r = self.descriptor.reducer
        if r.name != "count":
            v = self._ser.check(v)
        acc = None if cur_stored is None else _from_stored(self._ser, cur_stored)
        try:
            new = r.add(acc, v)
        except InvalidInputError:
            raise
        except Exception as e:
            raise InvalidInputError(f"reducer {r.name!r} failed on {v!r}: {e}") from e
        return _to_stored(self._ser, new)

    def add(self, value) -> None:
        kg, k = self._slot()
        if value is None:
            return
        self._table.put(kg, k, self._reduce(self._table.get(kg, k), value))

    def add_batch(self, keys, values, namespaces=None) -> pa.Array:
        arr = arrow_input.coerce_key_array(keys, self.backend.key_type)
        vals = reducing_batch_values(self, values, len(arr))
        slots = self.backend._batch_slots(self, arr, namespaces)
        if self.descriptor.reducer.is_vectorized:
            staged, out = _fold_rounds(slots, vals, self.descriptor.reducer, self._ser,
                                       lambda s, _null: self._table.get(*s))
            for (kg, k), st in staged.items():
                self._table.put(kg, k, st)
            return pa.array(out, self._ser.arrow_type)
        staged, out = {}, []
        for (kg, k), v in zip(slots, vals):
            cur = staged[(kg, k)] if (kg, k) in staged else self._table.get(kg, k)
            if v is not None:
                cur = self._reduce(cur, v)
                staged[(kg, k)] = cur
            out.append(cur)
        for (kg, k), s in staged.items():
            self._table.put(kg, k, s)
        return pa.array(out, self._ser.arrow_type)


def reducing_batch_values(state, values, length: int) -> list:
    """Per-row Python values of a reducing state's ``add_batch`` (None for null rows): of the
    value type, or for ``count`` of any Arrow type, where only validity matters (1 per value,
    so no value needs a Python form: an extreme timestamp has no datetime)."""
    is_count = state.descriptor.reducer.name == "count"
    arr = arrow_input.coerce_value_array(values, state._ser.name, length, any_type=is_count)
    if is_count:
        return [1 if ok else None for ok in arr.is_valid().to_pylist()]
    return state._ser.to_pylist(arr)


def _fold_rounds(slots: list, vals: list, reducer, ser, acc_of):
    """add_batch with a vectorized reducer (``Reducer.vectorized``): the rows of each slot fold
    in row order, but round ``r`` (the ``r``-th row of every slot) goes to the reduce function
    as one pair of arrays. ``acc_of(slot, null_row)`` reads a slot's aggregate from the table
    (stored form or None) while the batch has not staged one. Returns ``(staged, out)``: the
    new aggregate per slot and the output per row; nothing is written here, so an error of the
    reduce function leaves the table as it was."""
    rounds: list = []
    seen: dict = {}
    for i, s in enumerate(slots):
        r = seen.get(s, 0)
        seen[s] = r + 1
        if r == len(rounds):
            rounds.append([])
        rounds[r].append(i)
    staged: dict = {}
    out = [None] * len(slots)
    for rows in rounds:
        pending, accs, values = [], [], []
        for i in rows:
            s, v = slots[i], vals[i]
            acc = staged[s] if s in staged else acc_of(s, v is None)
            if v is None:
                out[i] = acc
            elif acc is None:
                staged[s] = out[i] = ser.check(v)
            else:
                pending.append(i)
                accs.append(acc)
                values.append(ser.check(v))
        if pending:
            for i, x in zip(pending, reducer.fold_arrays(accs, values)):
                staged[slots[i]] = out[i] = ser.check(x)
    return staged, out


class _Aggregating(_PyState, base.AggregatingState):
    def get(self):
        kg, k = self._slot()
        s = self._table.get(kg, k)
        if s is None:
            return None
        return self.descriptor.aggregate_function.get_result(_from_stored(self._ser, s))

    def add(self, value) -> None:
        kg, k = self._slot()
        if value is None:
            return
        fn = self.descriptor.aggregate_function
        s = self._table.get(kg, k)
        acc = fn.create_accumulator() if s is None else _from_stored(self._ser, s)
        self._table.put(kg, k, _to_stored(self._ser, fn.add(value, acc)))

    def _results(self, out: list) -> pa.Array:
        t = self.descriptor.result_type
        try:
            return pa.array(out, t)
        except (pa.ArrowException, TypeError, ValueError) as e:
            raise InvalidInputError(
                f"aggregating state {self.name!r}: results do not form an Arrow array"
                + (f" of {t} (the descriptor's result_type)" if t is not None
                   else " (set result_type on the descriptor)")
                + f": {e}") from e

    def _fold_aggregate(self, slots: list, vals: list, acc_of):
        """Rows in order: a value row adds (``create_accumulator`` when there is none) and
        yields ``get_result``; a null row yields what ``get()`` returns. ``acc_of(slot,
        null_row)`` reads the stored accumulator while the batch has not staged one. Returns
        ``(staged stored accumulators, results)``; nothing is written, so a failing function
        leaves the table unchanged (InvalidInputError)."""
        fn = self.descriptor.aggregate_function
        staged, out = {}, []
        for s, v in zip(slots, vals):
            cur = staged[s] if s in staged else acc_of(s, v is None)
            if v is not None:
                # Accumulators go through their stored form row by row, so a function that
                # mutates its accumulator cannot change a result already produced.
                acc = fn.create_accumulator() if cur is None else _from_stored(self._ser, cur)
                try:
                    acc = fn.add(v, acc)
                except InvalidInputError:
                    raise
                except Exception as e:
                    raise InvalidInputError(
                        f"aggregate function of {self.name!r} failed on {v!r}: {e}") from e
                cur = staged[s] = _to_stored(self._ser, acc)
            out.append(None if cur is None else fn.get_result(_from_stored(self._ser, cur)))
        return staged, out

    def _batch_values(self, keys, values):
        arr = arrow_input.coerce_key_array(keys, self.backend.key_type)
        vals = arrow_input.as_arrow_array(values, "values")
        if len(vals) != len(arr):
            raise InvalidInputError(f"values have {len(vals)} rows but keys have {len(arr)}")
        return arr, vals.to_pylist()

    def add_batch(self, keys, values, namespaces=None) -> pa.Array:
        """``add`` per row (values of any Arrow type, handed to the function as Python values;
        a null row adds nothing) returning ``get_result`` after each row (null where there is
        no accumulator), as an array of the descriptor's ``result_type`` (else inferred).
        Rows of one key apply in row order; an error leaves the state unchanged."""
        arr, vals = self._batch_values(keys, values)
        slots = self.backend._batch_slots(self, arr, namespaces)
        staged, out = self._fold_aggregate(slots, vals, lambda s, _null: self._table.get(*s))
        results = self._results(out)
        for (kg, k), st in staged.items():
            self._table.put(kg, k, st)
        return results

    def get_batch(self, keys, namespaces=None) -> pa.Array:
        """``get()`` per row, as :meth:`add_batch` returns results."""
        return self._results(self._apply_rows(keys, namespaces, self.get))

    def clear_batch(self, keys, namespaces=None):
        for kg, k in self.backend._batch_slots(self, keys, namespaces):
            self._table.remove(kg, k)


PythonBackend._state_classes = {"value": _Value, "list": _List, "map": _Map, "reducing": _Reducing,
                                "aggregating": _Aggregating}

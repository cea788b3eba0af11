"""PythonBackend: the pure-Python reference backend and test oracle.

State lives in plain dicts (:class:`PythonTable`): per state, per key group, ``{(key, namespace):
stored}``, ``stored`` the stored form of :mod:`statecore.backends.states` (the canonical Python
value for typed values, the pickled bytes for ``pickle`` values, so a caller mutating an object
after ``update`` cannot change state, as with the native backend which serializes on write). A map
state keeps one entry per user key, ``{(key, namespace, serialized user key): stored user value}``,
and an index of the user keys of each (key, namespace) in insertion order; a list state one entry
per chunk of up to ``LIST_CHUNK_ELEMENTS`` elements, ``{(key, namespace, chunk sequence number
bytes): [stored element, ...]}``, and an index of each list's chunks (:class:`PythonTable`). The
state objects are the shared classes of :mod:`statecore.backends.states` and
:mod:`statecore.backends.ttl_states`; registration and restore checks are
:class:`~statecore.backends.table_backend.TableBackend`'s. Snapshots serialize
everything at snapshot time (O(entries), deliberately simple), so later writes never leak into
them. Semantics: see :mod:`statecore.backends.base`.

Change tracking (incremental snapshots): every table records ``changes[(kg, (key, namespace))] =
stamp`` on each put and on each removal of a present entry, where ``stamp`` is the id of the last
snapshot taken before the write (the backend's :class:`ChangeClock`). With base snapshot ``b``, the
changes are the records with ``stamp >= b``: those present now are listed with their value, the
absent ones as tombstones. Completing snapshot ``b`` drops the records older than ``b``; a restore
drops them all. This is the oracle for the native engine's versioned entries and removal log.
"""

from __future__ import annotations

import copy

import pyarrow as pa

from statecore import serializers as S
from statecore.backends import base
from statecore.backends.list_index import ListIndex, seq_bytes
from statecore.backends.states import STATE_CLASSES, StateTable
from statecore.backends.table_backend import TableBackend
from statecore.backends.ttl_states import TTL_STATE_CLASSES
from statecore.errors import InvalidInputError, StateError
from statecore.key_groups import KeyGroupRange
from statecore.operator_state import is_operator_state_meta
from statecore.serializers import LIST_CHUNK_ELEMENTS
from statecore.timers import TIMERS_STATE_NAME
from statecore.ttl import filter_entries, is_expired
from statecore.varint import read_varlen, write_varlen

__all__ = ["PythonBackend", "PythonSnapshot", "PythonTable", "ChangeClock"]


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
    """statecore.ttl.filter_expired_counted on the stored form of a TTL value (a value or map
    entry: ``(stored, ts)``; a list chunk: a list of those): ``(stored, 0)`` unchanged,
    ``(trimmed, n)`` or ``(None, n)``."""
    if kind == "list":
        for i, (_, ts) in enumerate(stored):
            if not is_expired(ts, ttl_ms, now):
                return (stored, 0) if i == 0 else (stored[i:], i)
        return None, len(stored)
    return (None, 1) if is_expired(stored[1], ttl_ms, now) else (stored, 0)


def _migrate_stored(kind: str, stored, add: bool, ts: int, ttl_ms: int, now: int):
    """The stored form of one value (a value or map entry; a list chunk: each of its
    elements) converted by a TTL migration (ttl.h ``migrate_value`` on the stored form):
    ``add`` wraps it as ``(stored, ts)``; otherwise it is dropped when expired under ``ttl_ms``
    at ``now``, else unwrapped. Returns ``(new, expired)``, ``new`` None when nothing remains
    (never when adding)."""
    if add:
        if kind == "list":
            return [(s, ts) for s in stored], 0
        return (stored, ts), 0
    if kind == "list":
        kept = [s for s, t in stored if not is_expired(t, ttl_ms, now)]
        return (kept or None), len(stored) - len(kept)
    return (None, 1) if is_expired(stored[1], ttl_ms, now) else (stored[0], 0)


class ChangeClock:
    """Snapshot epoch shared by a backend's tables: ``now`` = id of the last snapshot taken
    (the stamp of the changes recorded meanwhile)."""

    __slots__ = ("now",)

    def __init__(self):
        self.now = 0


class PythonTable(StateTable):
    """All entries of one state in dicts: ``data[key_group][(key, namespace)] = stored`` (slots
    are ``(key group, (key, namespace))``); a map state's entries are ``data[key_group][(key,
    namespace, user key bytes)] = stored user value``, one per user key, with ``maps[(key_group,
    (key, namespace))]`` = ``{user key bytes: None}`` the index of each map's user keys in
    insertion order; a list state's entries are ``data[key_group][(key, namespace, seq
    bytes)] = [stored element, ...]``, one per chunk (seq bytes: the chunk's sequence number, 8
    bytes big-endian), with ``lists[(key_group, (key, namespace))]`` its
    :class:`~statecore.backends.list_index.ListIndex`.
    Both indexes are kept by :meth:`put` and :meth:`remove`, so every path that writes entries
    -- TTL passes and restores included -- keeps them exact. With a ``clock``,
    ``changes[(key_group, entry key)]`` = stamp of the last write or removal (see module
    docstring). Also the reference codec of stored forms (:meth:`encode_value` /
    :meth:`decode_value`), which the native engine's conversions match byte for byte."""

    def __init__(self, meta: dict, clock: ChangeClock | None = None):
        super().__init__(meta)
        self.data: dict[int, dict] = {}
        self.clock = clock
        self.changes: dict[tuple, int] = {}
        self._ttl_cursor = None  # [key group, its keys as listed on entry, position]
        self.maps: dict[tuple, dict] = {}
        self.lists: dict[tuple, ListIndex] = {}
        # A map entry's stored form is a value state's (one user value, with TTL its stamp); a
        # list entry's is a chunk, a list of elements.
        self.entry_kind = "value" if self.kind == "map" else self.kind

    def group(self, kg: int) -> dict:
        g = self.data.get(kg)
        if g is None:
            g = self.data[kg] = {}
        return g

    def get(self, kg, k):
        g = self.data.get(kg)
        return None if g is None else g.get(k)

    def put(self, kg, k, stored):
        g = self.group(kg)
        if k not in g:
            if self.kind == "map":
                idx = self.maps.get((kg, k[:2]))
                if idx is None:
                    idx = self.maps[(kg, k[:2])] = {}
                idx[k[2]] = None
            elif self.kind == "list":
                li = self.lists.get((kg, k[:2]))
                if li is None:
                    li = self.lists[(kg, k[:2])] = ListIndex()
                li.insert(k[2])
        g[k] = stored
        if self.clock is not None:
            self.changes[(kg, k)] = self.clock.now

    def remove(self, kg, k):
        g = self.data.get(kg)
        if g is not None and k in g:
            del g[k]
            if not g:
                del self.data[kg]
            if self.kind == "map":
                idx = self.maps[(kg, k[:2])]
                del idx[k[2]]
                if not idx:
                    del self.maps[(kg, k[:2])]
            elif self.kind == "list":
                li = self.lists[(kg, k[:2])]
                del li.seqs[k[2]]
                if not li.seqs:
                    del self.lists[(kg, k[:2])]
            if self.clock is not None:
                self.changes[(kg, k)] = self.clock.now

    # ---- map state (StateTable.map_get ...): entry keys (key, namespace, user key bytes)
    def map_get(self, kg, k, ukb):
        g = self.data.get(kg)
        return None if g is None else g.get((*k, ukb))

    def map_put(self, kg, k, ukb, stored):
        self.put(kg, (*k, ukb), stored)

    def map_remove(self, kg, k, ukb):
        self.remove(kg, (*k, ukb))

    def map_items(self, kg, k) -> list:
        idx = self.maps.get((kg, k))
        if not idx:
            return []
        g = self.data[kg]
        return [(ukb, g[(*k, ukb)]) for ukb in idx]

    def map_size(self, kg, k) -> int:
        idx = self.maps.get((kg, k))
        return 0 if idx is None else len(idx)

    def map_clear(self, kg, k) -> None:
        idx = self.maps.get((kg, k))
        if idx:
            for ukb in list(idx):
                self.remove(kg, (*k, ukb))

    # ---- list state (StateTable.list_chunks ...): entry keys (key, namespace, seq bytes)
    def list_chunks(self, kg, k) -> list:
        li = self.lists.get((kg, k))
        if li is None:
            return []
        g = self.data[kg]
        return [(int.from_bytes(sb, "big"), g[(*k, sb)]) for sb in li.seqs]

    def list_append(self, kg, k, stored: list) -> None:
        if not stored:
            return
        li = self.lists.get((kg, k))
        if li is None:
            seq, cur = 0, []
        else:
            seq = li.last()
            cur = self.data[kg][(*k, seq_bytes(seq))]
        i = 0
        while i < len(stored):
            if len(cur) >= LIST_CHUNK_ELEMENTS:
                seq, cur = seq + 1, []
            take = stored[i:i + LIST_CHUNK_ELEMENTS - len(cur)]
            cur = cur + take  # a new list: a chunk is never changed in place
            self.put(kg, (*k, seq_bytes(seq)), cur)
            i += len(take)

    def list_put_chunk(self, kg, k, seq: int, stored: list) -> None:
        if stored:
            self.put(kg, (*k, seq_bytes(seq)), list(stored))
        else:
            self.remove(kg, (*k, seq_bytes(seq)))

    def list_size(self, kg, k) -> int:
        return sum(len(es) for _, es in self.list_chunks(kg, k))

    def list_clear(self, kg, k) -> None:
        li = self.lists.get((kg, k))
        if li is not None:
            for sb in list(li.seqs):
                self.remove(kg, (*k, sb))

    def drop_changes_before(self, stamp: int) -> None:
        """Forget the changes recorded before snapshot ``stamp`` (it became the base)."""
        self.changes = {ck: st for ck, st in self.changes.items() if st >= stamp}

    # ---- TTL cleanup passes (incremental and background; statecore.ttl)
    def ttl_cleanup_step(self, kgs: KeyGroupRange, min_entries: int, ttl_ms: int, now: int,
                         steps: int = 1):
        """``steps`` single steps one after the other (StateTable.ttl_cleanup_step; an empty
        range stops after the first). Returns the sums of :meth:`_ttl_cleanup_one_step`'s."""
        visited = expired = 0
        wrapped = False
        for _ in range(steps):
            cur = self._ttl_cursor
            from_start = cur is None or cur[0] not in kgs or cur == [kgs.start, None, 0]
            v, e, w = self._ttl_cleanup_one_step(kgs, min_entries, ttl_ms, now)
            visited, expired, wrapped = visited + v, expired + e, wrapped or w
            if w and v == 0 and from_start:
                break  # an empty range: the remaining steps would visit nothing too
        return visited, expired, wrapped

    def _ttl_cleanup_one_step(self, kgs: KeyGroupRange, min_entries: int, ttl_ms: int, now: int):
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
                new, n = _migrate_stored(self.entry_kind, stored, add, ts, ttl_ms, now)
                staged.append((kg, k, new))
                expired += n
        for kg, k, new in staged:
            if new is None:
                self.remove(kg, k)
            else:
                self.put(kg, k, new)
        self.set_ttl_meta(ttl_meta)
        return expired

    def ttl_cleanup_key_group(self, kg: int, ttl_ms: int, now: int) -> int:
        """Background cleanup of one whole key group; returns the expired things removed."""
        return sum(self._ttl_filter_one(kg, k, ttl_ms, now) for k in list(self.data.get(kg, ())))

    def _ttl_filter_one(self, kg: int, k, ttl_ms: int, now: int) -> int:
        cur = self.get(kg, k)
        if cur is None:
            return 0
        new, n = _filter_stored(self.entry_kind, cur, ttl_ms, now)
        if new is None:
            self.remove(kg, k)
        elif new is not cur:
            self.put(kg, k, new)
        return n

    def encode_value(self, stored) -> bytes:
        """Bytes of a stored value of this table's state (docs/formats.md "Values"; with TTL
        also "TTL suffix")."""
        ser, ttl = self.value_ser, self.ttl
        if self.kind == "list":
            # A chunk: its elements in the list-blob layout (docs/formats.md "List state").
            out = []
            for e in stored:
                s, ts = e if ttl else (e, None)
                b = _stored_bytes(ser, s)
                if not ser.fixed_width:
                    out.append(write_varlen(len(b)))
                out.append(b)
                if ttl:
                    out.append(_ts_bytes(ts))
            return b"".join(out)
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
                    n, pos = read_varlen(b, pos)
                end = pos + n + (8 if ttl else 0)
                if end > len(b):
                    raise InvalidInputError("truncated list element")
                s = _stored_from_bytes(ser, b[pos:pos + n])
                out.append((s, _ts_from(b, pos + n)) if ttl else s)
                pos = end
            return out
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
            raise InvalidInputError(
                f"key group {key_group} outside [0, {self.max_parallelism - 1}]")
        got = self._data[state_name].get(key_group)
        return _EMPTY if got is None else got

    def release(self) -> None:
        self._released = True
        self._data = {n: {} for n in self._data}


class PythonBackend(TableBackend):
    """The pure-Python reference backend (see module docstring and :mod:`..base`)."""

    state_classes = STATE_CLASSES
    ttl_state_classes = TTL_STATE_CLASSES

    def __init__(self, **options):
        super().__init__(**options)
        self._clock = ChangeClock()

    def _new_table(self, meta: dict) -> PythonTable:
        return PythonTable(meta, self._clock)

    # ------------------------------------------------------------------ snapshot / restore
    def _encode_entry_key(self, table: PythonTable, kg: int, k) -> bytes:
        kb = S.encode_key(kg, self.max_parallelism, k[0], self.key_serializer, k[1], table.ns_ser)
        # A map entry: the user key's bytes follow (docs/formats.md "Map state"); a list
        # element: its sequence number's (docs/formats.md "List state").
        return kb + k[2] if len(k) == 3 else kb

    def snapshot(self, incremental: bool = False) -> PythonSnapshot:
        self.check_open()
        incremental = self._snapshot_incremental(incremental)
        # Operator state is complete in every snapshot, incremental ones included.
        op_data = self.operator_state.snapshot_data(self.key_group_range, self.max_parallelism)
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
            filt = None if incremental else self.full_snapshot_ttl_filter(table)
            for kg, pairs in groups:
                pairs.sort(key=lambda p: p[0])
                keys = pa.array([p[0] for p in pairs], pa.binary())
                vals = pa.array([p[1] for p in pairs], pa.binary())
                if filt is not None:
                    keys, vals, n = filter_entries(*filt, keys, vals)
                    self.count_expired("full_snapshot", n)
                    if not len(keys):
                        continue
                per_kg[kg] = (keys, vals)
            data[name] = per_kg
        metas.append(self.timers.meta())
        data[TIMERS_STATE_NAME] = self.timers.snapshot_all()
        for m in self.operator_state.metas():
            metas.append(m)
            data[m["name"]] = op_data.get(m["name"], {})
        sid = self._next_snapshot_id()
        self._clock.now = sid
        snap = PythonSnapshot(self.max_parallelism, self.key_group_range, self.key_type,
                              self.assigner, metas, data, snapshot_id=sid,
                              incremental=bool(incremental))
        snap.ttl_expired = self._take_ttl_delta()
        snap.base_version = self.base_version if snap.incremental else None
        snap.base_commit_id = self.base_commit_id if snap.incremental else None
        return snap

    def _complete_snapshot(self, snapshot_id: int) -> None:
        for table in self._tables.values():
            table.drop_changes_before(snapshot_id)

    def restore(self, snapshot_like) -> None:
        self.check_open()
        base.check_snapshot_compatible(self, snapshot_like)
        metas = snapshot_like.state_metas()
        kgs = list(self.key_group_range.intersection(
            KeyGroupRange.of(snapshot_like.key_group_range)))
        # Decode everything first so that a malformed snapshot leaves the backend unchanged.
        staged = []
        migrated, expired = False, 0
        for meta in metas:
            if meta["kind"] == "timers" or is_operator_state_meta(meta):
                continue  # not keyed state: the timer service / operator_state restore them
            table = self._table_for_restore(meta)
            migration = self._restore_migration(table, meta)
            # A TTL migration reads the snapshot's format and converts to the table's.
            src = table if migration is None else PythonTable(meta)
            migrated = migrated or migration is not None
            rows = []
            for kg in kgs:
                keys, vals = snapshot_like.entries(meta["name"], kg)
                for k, vb in zip(self._entry_keys(table, kg, keys), vals.to_pylist()):
                    v = src.decode_value(vb)
                    if migration is not None:
                        ttl_meta, ts, ttl_ms, now = migration
                        v, n = _migrate_stored(table.entry_kind, v, ttl_meta is not None, ts,
                                               ttl_ms, now)
                        expired += n
                        if v is None:
                            continue  # expired under the snapshot's TTL: not restored
                    rows.append((kg, k, v))
            staged.append((table, rows))
        timers = self.timers.stage_restore(snapshot_like)
        for table, rows in staged:
            self._tables.setdefault(table.name, table)
            for kg, k, v in rows:
                table.put(kg, k, v)
        self.timers.apply_restore(timers)
        # The restored state is the base: nothing before it is a change any more.
        self._contents_are_base(version=base.checkpoint_version(snapshot_like),
                                commit_id=base.checkpoint_commit_id(snapshot_like))
        if migrated:
            self._migrated(expired)

    def _stage_changes(self, table: PythonTable, kg: int, keys: pa.Array, vals: pa.Array) -> list:
        """A change set's entries of ``kg`` checked and decoded: ``[(kg, (key, ns), value or
        None for a tombstone)]``."""
        return [(kg, k, None if vb is None else table.decode_value(vb))
                for k, vb in zip(self._entry_keys(table, kg, keys), vals.to_pylist())]

    def _apply_staged_changes(self, table: PythonTable, rows: list) -> None:
        for kg, k, v in rows:
            if v is None:
                table.remove(kg, k)
            else:
                table.put(kg, k, v)

    def _entry_keys(self, table: PythonTable, kg: int, keys: pa.Array) -> list:
        """The table's entry key of each encoded key of a snapshot's ``kg``: ``(key,
        namespace)``, for a map state ``(key, namespace, user key bytes)``; InvalidInputError
        when one carries another key group or does not parse."""
        out = []
        mp, ks, ns_ser = self.max_parallelism, self.key_serializer, table.ns_ser
        for kb in keys.to_pylist():
            if table.kind == "map":
                try:
                    kg2, key, ns, ukb = S.split_map_entry_key(kb, mp, ks, ns_ser,
                                                              table.user_key_ser)
                except InvalidInputError as exc:
                    raise InvalidInputError(f"state {table.name!r}, key group {kg}: map entry "
                                            f"key {kb.hex()}: {exc}") from None
                k = (key, ns, ukb)
            elif table.kind == "list":
                kg2, key, ns, seqb = S.split_list_entry_key(kb, mp, ks, ns_ser)
                k = (key, ns, seqb)
            else:
                kg2, key, ns, _ = S.decode_key(kb, mp, ks, ns_ser)
                k = (key, ns)
            if kg2 != kg:
                raise InvalidInputError(
                    f"entry {kb.hex()} of state {table.name!r} listed under key group {kg}")
            out.append(k)
        return out

    def _contents_are_base(self, applied_changes: bool = False, version=None,
                           commit_id=None) -> None:
        """After a restore or (``applied_changes``) a change set: the current contents are the
        incremental base (of checkpoint version ``version`` when known)."""
        for table in self._tables.values():
            table.changes.clear()
        self._restored_is_base(version, applied_changes, commit_id)

    def _key_namespaces(self, state_name: str, kgs: KeyGroupRange):
        data, ser = self._tables[state_name].data, self.key_serializer.serialize
        for kg in kgs:
            group = data.get(kg)
            if group:
                # Map and list states: one entry per user key / element, so (key, namespace)
                # pairs repeat.
                pairs = dict.fromkeys(k[:2] for k in group)
                yield kg, [(ser(key), key, ns) for key, ns in pairs]

    # ------------------------------------------------------------------ accounting
    def num_entries(self) -> int:
        return sum(len(g) for t in self._tables.values() for g in t.data.values())

    def state_bytes(self) -> int:
        return sum(len(self._encode_entry_key(t, kg, k)) + len(t.encode_value(v))
                   for t in self._tables.values() for kg, g in t.data.items() for k, v in g.items())

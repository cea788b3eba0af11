"""Operator state: non-keyed state of one parallel operator instance (Flink's
``OperatorStateStore``, its ``DefaultOperatorStateBackend``).

Three kinds, each registered by name on ``backend.operator_state``:

* even-split list state (:meth:`OperatorStateStore.get_list_state`, Flink ``getListState``,
  ``OperatorStateHandle.Mode.SPLIT_DISTRIBUTE``);
* union list state (:meth:`OperatorStateStore.get_union_list_state`, Flink
  ``getUnionListState``, ``Mode.UNION``);
* broadcast state (:meth:`OperatorStateStore.get_broadcast_state`, Flink
  ``getBroadcastState(MapStateDescriptor)``, ``Mode.BROADCAST``): a map meant to be identical on
  every instance.

Values are typed like keyed state values (:mod:`statecore.value_types`), broadcast user keys
like map-state user keys. The structures are small and per operator instance, so both backends
keep them in Python, in this module (the native backend included).

Snapshots and checkpoints: every state is a pseudo-state ``__operator__.<name>`` of the
snapshot (kind ``operator_list``, ``operator_union_list`` or ``operator_broadcast``), whose
entries all lie in the first key group of the writer's key-group range: the state is stored
once per writer, complete in every run, full or incremental (byte layout: docs/formats.md
"Operator state").

Restore and redistribution (:meth:`OperatorStateStore.restore`), with the old instances ("old
tasks") in task order -- the writers of a checkpoint version by key-group range, which is
operator index order -- and the new parallelism ``n`` and operator index ``i``, after Flink's
``RoundRobinOperatorStateRepartitioner``:

* even-split list: with an unchanged parallelism each task gets its own list back. Otherwise the
  lists of all old tasks are concatenated in old task order and cut into ``n`` contiguous parts,
  the first ``total % n`` parts holding ``total // n + 1`` elements and the rest ``total // n``:
  task ``i`` gets part ``i``. (Flink also rotates which task starts the larger parts from one
  state to the next of an operator to balance several states; here every state starts at task
  0, so the split of a state does not depend on the others.)
* union list: every task gets the concatenation of all old tasks' lists, in old task order
  (Flink unions also at an unchanged parallelism).
* broadcast: every task gets one old task's copy, that of old task ``i % m`` among the ``m``
  old tasks holding the state (Flink: each task reads its own copy, additional tasks read the
  old copies round robin). Copies are not compared: like Flink, the user keeps them equal.

A restoring task reads only what it needs: the element counts of every old task's lists come
from the checkpoint manifest (each element is one entry, counted per run), so an even-split
restore reads the runs holding its part only, a broadcast restore one run.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Iterable

import pyarrow as pa

from statecore import serializers as S
from statecore.descriptors import USER_KEY_TYPES, ListStateDescriptor, MapStateDescriptor
from statecore.errors import InvalidInputError, StateMigrationError

__all__ = [
    "OperatorStateStore",
    "OperatorListState",
    "BroadcastState",
    "OperatorStateWriter",
    "writers_of",
    "split_bounds",
    "list_entry_values",
    "broadcast_entry_items",
    "OPERATOR_STATE_PREFIX",
    "OPERATOR_STATE_KINDS",
    "LIST",
    "UNION_LIST",
    "BROADCAST",
    "is_operator_state_meta",
]

#: Prefix of the pseudo-state name of an operator state in snapshots and checkpoints.
OPERATOR_STATE_PREFIX = "__operator__."
#: Snapshot meta kinds of the three operator state kinds.
LIST, UNION_LIST, BROADCAST = "operator_list", "operator_union_list", "operator_broadcast"
OPERATOR_STATE_KINDS = (LIST, UNION_LIST, BROADCAST)
_WORDS = {LIST: "even-split list state", UNION_LIST: "union list state",
          BROADCAST: "broadcast state"}
# Not pa.array([]): pyarrow's first pa.array call imports pandas, which would make
# `import statecore` slow.
_EMPTY = (pa.nulls(0, pa.binary()), pa.nulls(0, pa.binary()))


def is_operator_state_meta(meta: dict) -> bool:
    """Whether a snapshot state meta describes an operator state (not keyed state)."""
    return meta.get("kind") in OPERATOR_STATE_KINDS


def _check_name(name) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidInputError(f"operator state name must be a non-empty string, got {name!r}")
    if name.startswith("__"):
        raise InvalidInputError(f"state names starting with '__' are reserved, got {name!r}")
    return name


def _check_int(value, what: str, lo: int, hi: int) -> int:
    if isinstance(value, bool):
        raise InvalidInputError(f"{what} must be an int, got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise InvalidInputError(f"{what} must be an int, got {value!r}") from None
    if not lo <= v <= hi:
        raise InvalidInputError(f"{what} must be in [{lo}, {hi}], got {v}")
    return v


def split_bounds(total: int, parallelism: int, index: int) -> tuple[int, int]:
    """``[lo, hi)``: the elements of a concatenated even-split list of ``total`` elements that
    task ``index`` of ``parallelism`` gets (module docstring: the first ``total % parallelism``
    tasks get one element more)."""
    base, rest = divmod(total, parallelism)
    lo = index * base + min(index, rest)
    return lo, lo + base + (1 if index < rest else 0)



def list_entry_values(prefix: bytes, keys: pa.Array, values: pa.Array) -> list:
    """The serialized elements of an operator list state's snapshot entries, in order.

    ``keys``/``values``: binary arrays of one writer's entries, ``prefix | seq`` (``seq`` 8 bytes
    big-endian, 0, 1, 2, ...) -> ``ser(element)`` (docs/formats.md "Operator state"). Raises
    InvalidInputError for a key that is not the next sequence number or a null value (the
    caller names the state and the file)."""
    out = []
    for i, (k, v) in enumerate(zip(keys.to_pylist(), values.to_pylist())):
        expected = prefix + i.to_bytes(8, "big")
        if k != expected:
            raise InvalidInputError(f"entry {i} has key {k.hex()}, expected sequence number {i} "
                                    f"({expected.hex()})")
        if v is None:
            raise InvalidInputError(f"entry {i} is a tombstone")
        out.append(v)
    return out


def broadcast_entry_items(prefix: bytes, keys: pa.Array, values: pa.Array) -> list:
    """``(ser(user key), ser(value))`` pairs of a broadcast state's snapshot entries.

    ``keys``/``values``: binary arrays of one writer's entries, ``prefix | ser(user key)`` ->
    ``ser(value)`` (docs/formats.md "Operator state"). Raises InvalidInputError for a key without
    the prefix or a null value (the caller names the state and the file)."""
    out = []
    for k, v in zip(keys.to_pylist(), values.to_pylist()):
        if not k.startswith(prefix) or v is None:
            raise InvalidInputError(f"malformed entry {k.hex()}")
        out.append((k[len(prefix):], v))
    return out


class _OperatorState:
    """Common part of the three kinds: name, kind, types, and the backend's open check."""

    def __init__(self, store: "OperatorStateStore", name: str, kind: str, value_type: str,
                 user_key_type: str | None = None):
        self._store = store
        self.name = name
        self.kind = kind
        self.value_type = value_type
        self.user_key_type = user_key_type
        self.value_serializer = S.value_serializer(value_type)
        self.user_key_serializer = None if user_key_type is None else S.key_serializer(
            user_key_type)
        #: False while the state was only restored, not yet asked for by name.
        self.registered = False

    def meta(self) -> dict:
        """The pseudo-state's snapshot meta (docs/formats.md "Operator state")."""
        m = {"name": OPERATOR_STATE_PREFIX + self.name, "kind": self.kind,
             "namespace_type": "void", "value_type": self.value_type}
        if self.user_key_type is not None:
            m["user_key_type"] = self.user_key_type
        return m

    def _check_open(self) -> None:
        self._store.check_open()

    def _value(self, v) -> Any:
        if v is None:
            raise InvalidInputError(f"{_WORDS[self.kind]} {self.name!r}: None is not a value "
                                    "(operator state stores no nulls)")
        return self.value_serializer.check(v)


class OperatorListState(_OperatorState):
    """An even-split or union list of one operator instance (Flink ``PartitionableListState``):
    ``get``/``add``/``add_all``/``update``/``clear``. Elements have the state's ``value_type``;
    None elements raise InvalidInputError (Flink rejects nulls), and so does an element of
    another type; a call that raises changes nothing. Calls after the backend is disposed raise
    StateError."""

    def __init__(self, store, name, kind, value_type):
        super().__init__(store, name, kind, value_type)
        self._elements: list = []

    def get(self) -> list:
        """A copy of the elements in list order (``[]`` when empty)."""
        self._check_open()
        return list(self._elements)

    def add(self, value) -> None:
        """Append one element."""
        self._check_open()
        self._elements.append(self._value(value))

    def add_all(self, values: Iterable) -> None:
        """Append every element of ``values`` in order (nothing when one is invalid)."""
        self._check_open()
        self._elements.extend(self._checked(values))

    def update(self, values: Iterable) -> None:
        """Replace the list by ``values`` (``[]`` clears)."""
        self._check_open()
        self._elements = self._checked(values)

    def clear(self) -> None:
        """Remove every element."""
        self._check_open()
        self._elements = []

    def _checked(self, values) -> list:
        if values is None or isinstance(values, (str, bytes, dict)):
            raise InvalidInputError(
                f"{_WORDS[self.kind]} {self.name!r}: expected an iterable of elements, got "
                f"{type(values).__name__}")
        try:
            items = list(values)
        except TypeError:
            raise InvalidInputError(
                f"{_WORDS[self.kind]} {self.name!r}: expected an iterable of elements, got "
                f"{type(values).__name__}") from None
        return [self._value(v) for v in items]

    def __len__(self) -> int:
        return len(self._elements)

    def entries(self, prefix: bytes) -> tuple[pa.Array, pa.Array]:
        """The snapshot entries: ``prefix | seq`` (8 bytes big-endian) -> ``ser(element)``."""
        ser = self.value_serializer
        keys = [prefix + i.to_bytes(8, "big") for i in range(len(self._elements))]
        return (pa.array(keys, pa.binary()),
                pa.array([ser.serialize(v) for v in self._elements], pa.binary()))

    def decode(self, prefix: bytes, keys: pa.Array, values: pa.Array, where: str) -> list:
        """Elements of snapshot entries (:meth:`entries`' layout); InvalidInputError naming
        ``where`` for a key that is not the next sequence number or a malformed value."""
        ser = self.value_serializer
        try:
            return [ser.deserialize(v) for v in list_entry_values(prefix, keys, values)]
        except InvalidInputError as exc:
            raise InvalidInputError(
                f"{where}: operator list state {self.name!r}: {exc}") from None

    def load(self, elements: list) -> None:
        self._elements = elements


class BroadcastState(_OperatorState):
    """A broadcast map of one operator instance (Flink ``BroadcastState`` /
    ``HeapBroadcastState``): ``get``/``put``/``put_all``/``remove``/``contains``/``items``/
    ``keys``/``values``/``clear``/``is_empty``. User keys have the descriptor's user key type
    (equal when their serialized bytes are, as map-state user keys), values its value type;
    None user keys or values raise InvalidInputError, as do ones of another type. Iteration is
    in insertion order; after a restore by ascending serialized user key. Calls after the
    backend is disposed raise StateError."""

    def __init__(self, store, name, value_type, user_key_type):
        super().__init__(store, name, BROADCAST, value_type, user_key_type)
        self._map: dict[bytes, tuple[Any, Any]] = {}  # ser(user key) -> (user key, value)

    def _key(self, user_key) -> tuple[bytes, Any]:
        if user_key is None:
            raise InvalidInputError(f"broadcast state {self.name!r}: None is not a user key")
        uk = self.user_key_serializer.check(user_key)
        return self.user_key_serializer.serialize(uk), uk

    def get(self, user_key):
        """The value of ``user_key``, None when absent."""
        self._check_open()
        got = self._map.get(self._key(user_key)[0])
        return None if got is None else got[1]

    def put(self, user_key, value) -> None:
        """Set the value of ``user_key`` (a present key keeps its place in the order)."""
        self._check_open()
        kb, uk = self._key(user_key)
        v = self._value(value)
        self._map[kb] = (uk, v)

    def put_all(self, mapping) -> None:
        """:meth:`put` of every pair of ``mapping`` (a dict, or an iterable of pairs), all or
        nothing."""
        self._check_open()
        pairs = mapping.items() if isinstance(mapping, dict) else mapping
        try:
            staged = [(*self._key(k), self._value(v)) for k, v in pairs]
        except (TypeError, ValueError) as exc:
            if isinstance(exc, InvalidInputError):
                raise
            raise InvalidInputError(f"broadcast state {self.name!r}: put_all expects a dict or "
                                    f"pairs: {exc}") from None
        for kb, uk, v in staged:
            self._map[kb] = (uk, v)

    def remove(self, user_key) -> None:
        """Remove ``user_key`` (no-op when absent)."""
        self._check_open()
        self._map.pop(self._key(user_key)[0], None)

    def contains(self, user_key) -> bool:
        """Whether ``user_key`` holds a value."""
        self._check_open()
        return self._key(user_key)[0] in self._map

    def items(self) -> list[tuple[Any, Any]]:
        """``[(user key, value)]`` in iteration order."""
        self._check_open()
        return [(uk, v) for uk, v in self._map.values()]

    def keys(self) -> list:
        """The user keys in iteration order."""
        self._check_open()
        return [uk for uk, _ in self._map.values()]

    def values(self) -> list:
        """The values in iteration order."""
        self._check_open()
        return [v for _, v in self._map.values()]

    def clear(self) -> None:
        """Remove every entry."""
        self._check_open()
        self._map = {}

    def is_empty(self) -> bool:
        """True when the map holds no entry."""
        self._check_open()
        return not self._map

    def __len__(self) -> int:
        return len(self._map)

    def entries(self, prefix: bytes) -> tuple[pa.Array, pa.Array]:
        """The snapshot entries: ``prefix | ser(user key)`` -> ``ser(value)``, by key bytes."""
        ser = self.value_serializer
        rows = sorted(self._map.items())
        return (pa.array([prefix + kb for kb, _ in rows], pa.binary()),
                pa.array([ser.serialize(v) for _, (_, v) in rows], pa.binary()))

    def decode(self, prefix: bytes, keys: pa.Array, values: pa.Array, where: str) -> dict:
        """``{ser(user key): (user key, value)}`` of snapshot entries (:meth:`entries`' layout);
        InvalidInputError naming ``where`` for a malformed key or value."""
        ser, kser = self.value_serializer, self.user_key_serializer
        try:
            return {kb: (kser.deserialize(kb), ser.deserialize(v))
                    for kb, v in broadcast_entry_items(prefix, keys, values)}
        except InvalidInputError as exc:
            raise InvalidInputError(f"{where}: broadcast state {self.name!r}: {exc}") from None

    def load(self, mapping: dict) -> None:
        self._map = dict(sorted(mapping.items()))


class OperatorStateWriter:
    """The operator state one old task wrote: ``metas`` (``{pseudo-state name: meta}``),
    ``max_parallelism``, ``key_group_range`` (the writer's ``(start, end)``; its entries are in
    ``first_key_group``, the start), ``count(name)`` (the
    entries of a pseudo-state: a list's length, a map's size) and ``entries(name)`` (its
    ``(keys, values)``, read on demand). ``counts``: known counts (a manifest's), or None to
    count by reading. ``read(name)`` returns the entries."""

    def __init__(self, metas: dict, max_parallelism: int, key_group_range: tuple[int, int],
                 read: Callable[[str], tuple], counts: dict | None = None, where: str = ""):
        self.metas = metas
        self.max_parallelism = max_parallelism
        self.key_group_range = (int(key_group_range[0]), int(key_group_range[1]))
        self.first_key_group = self.key_group_range[0]
        self.where = where
        self._read = read
        self._counts = counts
        self._cache: dict = {}

    def entries(self, name: str) -> tuple[pa.Array, pa.Array]:
        if name not in self.metas:
            return _EMPTY
        got = self._cache.get(name)
        if got is None:
            got = self._cache[name] = self._read(name)
        return got

    def count(self, name: str) -> int:
        if name not in self.metas:
            return 0
        if self._counts is not None:
            return int(self._counts.get(name, 0))
        return len(self.entries(name)[0])


def writers_of(snapshot_like) -> list[OperatorStateWriter]:
    """The old tasks whose operator state ``snapshot_like`` holds, in task order: a checkpoint
    reader's ``operator_state_writers()`` (one per run of the version's writers, by key-group
    range), else one writer for a backend snapshot (its entries in the first key group of its
    range; a writer without operator state still counts as an old task). A writer is its own
    list."""
    if isinstance(snapshot_like, OperatorStateWriter):
        return [snapshot_like]
    own = getattr(snapshot_like, "operator_state_writers", None)
    if own is not None:
        return own()
    metas = {m["name"]: m for m in snapshot_like.state_metas() if is_operator_state_meta(m)}
    kgr = snapshot_like.key_group_range
    return [OperatorStateWriter(metas, int(snapshot_like.max_parallelism), (kgr.start, kgr.end),
                                lambda name: snapshot_like.entries(name, kgr.start),
                                where=f"snapshot of key groups {kgr}")]


class OperatorStateStore:
    """The operator state of one backend (``backend.operator_state``; Flink
    ``OperatorStateStore``); see the module docstring. ``backend`` provides ``check_open()``.

    A name belongs to one state: asking for it with another kind raises InvalidInputError, with
    another value or user key type InvalidInputError as well -- StateMigrationError when the
    state was restored and not yet asked for (its stored type differs). Operator state has no
    TTL (InvalidInputError for a descriptor with one, as Flink)."""

    def __init__(self, backend):
        self._backend = backend
        self._states: dict[str, _OperatorState] = {}

    def check_open(self) -> None:
        """Raise StateError when the backend is disposed."""
        self._backend.check_open()

    # ------------------------------------------------------------------ registration
    def _get(self, name, kind: str, value_type, user_key_type=None):
        self.check_open()
        name = _check_name(name)
        vt = S.normalize_value_type(value_type)
        ukt = None
        if kind == BROADCAST:
            ukt = S.normalize_value_type(user_key_type)
            if ukt not in USER_KEY_TYPES:
                raise InvalidInputError(
                    f"broadcast state user key type {ukt!r} is not supported; use one of "
                    f"{', '.join(USER_KEY_TYPES)}")
        st = self._states.get(name)
        if st is None:
            st = (BroadcastState(self, name, vt, ukt) if kind == BROADCAST
                  else OperatorListState(self, name, kind, vt))
            st.registered = True
            self._states[name] = st
            return st
        if st.kind != kind:
            raise InvalidInputError(f"operator state {name!r} is registered as "
                                    f"{_WORDS[st.kind]}, not as {_WORDS[kind]}")
        if (st.value_type, st.user_key_type) != (vt, ukt):
            err = InvalidInputError if st.registered else StateMigrationError
            raise err(f"{_WORDS[kind]} {name!r} has value type {st.value_type!r}"
                      + (f" and user key type {st.user_key_type!r}" if ukt else "")
                      + f", asked for {vt!r}" + (f" and {ukt!r}" if ukt else ""))
        st.registered = True
        return st

    @staticmethod
    def _list_args(name, value_type):
        if isinstance(name, ListStateDescriptor):
            if name.ttl_config is not None:
                raise InvalidInputError(f"operator state {name.name!r}: operator state has no "
                                        "TTL")
            return name.name, name.value_type
        return name, value_type

    def get_list_state(self, name, value_type="pickle") -> OperatorListState:
        """The even-split list state ``name`` (or a ListStateDescriptor), registered on first
        use; ``value_type`` as a keyed state's (default pickle)."""
        n, vt = self._list_args(name, value_type)
        return self._get(n, LIST, vt)

    def get_union_list_state(self, name, value_type="pickle") -> OperatorListState:
        """The union list state ``name`` (or a ListStateDescriptor), registered on first use."""
        n, vt = self._list_args(name, value_type)
        return self._get(n, UNION_LIST, vt)

    def get_broadcast_state(self, descriptor) -> BroadcastState:
        """The broadcast state of a MapStateDescriptor (name, user key type, value type),
        registered on first use. InvalidInputError for another argument or one with TTL."""
        if not isinstance(descriptor, MapStateDescriptor):
            raise InvalidInputError(
                f"get_broadcast_state expects a MapStateDescriptor, got {descriptor!r}")
        if descriptor.ttl_config is not None:
            raise InvalidInputError(f"broadcast state {descriptor.name!r}: operator state has "
                                    "no TTL")
        return self._get(descriptor.name, BROADCAST, descriptor.value_type,
                         descriptor.user_key_type)

    def registered_state_names(self) -> list[str]:
        """Names of the list and union list states (registered or restored), sorted (Flink
        ``getRegisteredStateNames``)."""
        self.check_open()
        return sorted(n for n, s in self._states.items() if s.kind != BROADCAST)

    def registered_broadcast_state_names(self) -> list[str]:
        """Names of the broadcast states (registered or restored), sorted."""
        self.check_open()
        return sorted(n for n, s in self._states.items() if s.kind == BROADCAST)

    def has_kind(self, kind: str) -> bool:
        """Whether a state of ``kind`` (:data:`LIST`, :data:`UNION_LIST`, :data:`BROADCAST`)
        is registered or restored."""
        return any(s.kind == kind for s in self._states.values())

    # ------------------------------------------------------------------ snapshots
    def metas(self) -> list[dict]:
        """The pseudo-state metas of every state, by name."""
        return [self._states[n].meta() for n in sorted(self._states)]

    def snapshot_data(self, key_group_range, max_parallelism: int) -> dict:
        """``{pseudo-state name: {key group: (keys, values)}}`` of every state holding
        something, its entries in the first key group of ``key_group_range`` (copied now: later
        writes do not change them). InvalidInputError when a state holds something and the
        range is empty (such a writer cannot store operator state)."""
        out = {}
        prefix = None
        for name in sorted(self._states):
            st = self._states[name]
            if not len(st):
                continue
            if prefix is None:
                if key_group_range.is_empty():
                    raise InvalidInputError(
                        "operator state needs a non-empty key-group range to be snapshotted "
                        f"(it is stored in the range's first key group); {name!r} holds "
                        "entries")
                prefix = S.key_group_prefix(key_group_range.start, max_parallelism)
            out[OPERATOR_STATE_PREFIX + name] = {key_group_range.start: st.entries(prefix)}
        return out

    def clear(self) -> None:
        """Forget every state (the backend's dispose)."""
        self._states = {}

    # ------------------------------------------------------------------ restore
    def restore(self, sources, operator_index: int = 0, parallelism: int = 1) -> None:
        """Replace the operator state by what task ``operator_index`` of ``parallelism`` gets
        from ``sources`` (module docstring "Restore and redistribution"): a snapshot-like (a
        backend snapshot, a checkpoint reader: all writers of its version) or a list of them
        (old tasks in list order). States registered here keep their objects; a registered
        state the sources do not hold is emptied; restored states not registered yet become
        available by name.

        Raises InvalidInputError for a bad index or parallelism, sources that disagree on a
        state's meta, or malformed entries; StateMigrationError when a registered state has
        another kind or type than the stored one; CorruptCheckpointError from a checkpoint's
        data. Nothing changes when it raises."""
        self.apply_restore(self.stage_restore(sources, operator_index, parallelism))

    def stage_restore(self, sources, operator_index: int = 0, parallelism: int = 1) -> dict:
        """The first half of :meth:`restore`: read, check and redistribute without changing
        anything (so that a caller can restore keyed state in between); pass the result to
        :meth:`apply_restore`. Errors as :meth:`restore`."""
        self.check_open()
        p = _check_int(parallelism, "parallelism", 1, 1 << 31)
        i = _check_int(operator_index, "operator_index", 0, p - 1)
        srcs = list(sources) if isinstance(sources, (list, tuple)) else [sources]
        writers = [w for s in srcs for w in writers_of(s)]
        metas: dict[str, dict] = {}
        for w in writers:
            for name, m in w.metas.items():
                prev = metas.setdefault(name, m)
                if _stored(prev) != _stored(m):
                    raise InvalidInputError(
                        f"old tasks disagree on operator state {name!r}: {prev} vs {m}")
        staged: dict[str, tuple] = {}
        for pname, m in metas.items():
            name = pname[len(OPERATOR_STATE_PREFIX):]
            st = self._target(name, m)
            holding = [w for w in writers if pname in w.metas]
            if m["kind"] == BROADCAST:
                w = holding[i % len(holding)]
                staged[name] = (st, self._decode(st, w, pname))
                continue
            if m["kind"] == LIST and len(writers) == p:
                parts = [writers[i]] if pname in writers[i].metas else []
                lo, hi = 0, None
            elif m["kind"] == LIST:
                total = sum(w.count(pname) for w in holding)
                lo, hi = split_bounds(total, p, i)
                parts = holding
            else:
                parts, lo, hi = holding, 0, None
            elements, at = [], 0
            for w in parts:
                n = w.count(pname)
                if hi is not None and (at >= hi or at + n <= lo):
                    at += n
                    continue  # none of this writer's elements are ours: not read
                got = self._decode(st, w, pname)
                if len(got) != n:
                    raise InvalidInputError(
                        f"{w.where}: operator state {name!r} holds {len(got)} elements, its "
                        f"run lists {n}")
                a = 0 if hi is None else max(lo - at, 0)
                b = n if hi is None else min(hi - at, n)
                elements.extend(got[a:b])
                at += n
            staged[name] = (st, elements)
        return staged

    def apply_restore(self, staged: dict) -> None:
        """Replace the operator state by what :meth:`stage_restore` returned."""
        self.check_open()
        for name, (st, contents) in staged.items():
            st = self._states.setdefault(name, st)
            st.load(contents)
        for name, st in self._states.items():
            if name not in staged:
                st.load({} if st.kind == BROADCAST else [])

    def _target(self, name: str, meta: dict) -> _OperatorState:
        """The registered state ``name`` after checking it can hold ``meta``'s entries, or a
        new unregistered one of ``meta``'s kind and types."""
        kind, vt, ukt = meta["kind"], meta.get("value_type"), meta.get("user_key_type")
        st = self._states.get(name)
        if st is not None:
            if (st.kind, st.value_type, st.user_key_type) != (kind, vt, ukt):
                raise StateMigrationError(
                    f"operator state {name!r} is registered as {_WORDS[st.kind]} of "
                    f"{st.value_type!r}" + (f" by {st.user_key_type!r}" if st.user_key_type
                                             else "")
                    + f"; the restored one is {_WORDS.get(kind, kind)} of {vt!r}"
                    + (f" by {ukt!r}" if ukt else ""))
            return st
        try:
            if kind == BROADCAST:
                return BroadcastState(self, name, S.normalize_value_type(vt),
                                      S.normalize_value_type(ukt))
            return OperatorListState(self, name, kind, S.normalize_value_type(vt))
        except InvalidInputError as exc:
            raise InvalidInputError(f"restored operator state {name!r}: {exc}") from None

    @staticmethod
    def _decode(st: _OperatorState, w: OperatorStateWriter, pname: str):
        keys, values = w.entries(pname)
        prefix = S.key_group_prefix(w.first_key_group, w.max_parallelism)
        return st.decode(prefix, keys, values, w.where or "operator state")


def _stored(meta: dict) -> tuple:
    return meta.get("kind"), meta.get("value_type"), meta.get("user_key_type")

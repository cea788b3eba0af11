"""State descriptors (after Flink's ``StateDescriptor`` family) and built-in reducers.

A descriptor names a piece of keyed state and fixes its kind and the types it stores. Types are
value-type names (``"int32"``, ``"int64"``, ``"uint64"``, ``"float64"``, ``"bool"``,
``"timestamp[ms]"`` (any unit of s, ms, us, ns), ``"string"``, ``"binary"``,
``"fixed_size_binary[16]"``, ``"pickle"``) or pyarrow DataTypes (``pa.timestamp("ms")``,
``pa.binary(16)``, ...); see :mod:`statecore.value_types` for the bytes and the Python values.
:meth:`StateDescriptor.meta` is the JSON-able description written into snapshots; on restore,
:meth:`StateDescriptor.check_compatible` compares it with the restored meta and raises
:class:`~statecore.errors.StateMigrationError` when kind or types differ, or TTL is switched on or
off (Flink's ``StateMigrationException``) -- unless the descriptor requests that TTL migration with
:meth:`StateDescriptor.enable_ttl_migration` (:mod:`statecore.ttl` "Migration").
"""

from __future__ import annotations

import copy
from typing import Any

from statecore import serializers as S
from statecore.errors import InvalidInputError, StateMigrationError

# Exact types whose values cannot be mutated in place: default_value() hands them out uncopied.
_IMMUTABLE = frozenset({bool, int, float, str, bytes})

__all__ = [
    "StateDescriptor",
    "ValueStateDescriptor",
    "ListStateDescriptor",
    "MapStateDescriptor",
    "ReducingStateDescriptor",
    "AggregatingStateDescriptor",
    "AggregateFunction",
    "Reducer",
    "BUILTIN_REDUCERS",
    "USER_KEY_TYPES",
]

USER_KEY_TYPES = ("int32", "int64", "string", "binary", "pickle")
BUILTIN_REDUCERS = ("sum", "min", "max", "count", "first", "last")
_NUMERIC = ("int32", "int64", "uint64", "float64")

# Meta fields that must agree between a descriptor and restored state (others are informative).
_COMPAT_FIELDS = ("kind", "value_type", "user_key_type", "namespace_type")


def stored_format(meta: dict) -> tuple:
    """What of a state's ``meta`` decides how its entries are stored: the kind, the value, user
    key and namespace types and whether values carry the 8-byte TTL timestamp. Two metas with
    the same stored format can read each other's entries, so runs written under one stay
    valid under the other (a new TTL duration, cleanup strategy or reduce function)."""
    return tuple(meta.get(f) for f in _COMPAT_FIELDS) + (bool(meta.get("ttl")),)


def _check_name(name) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidInputError(f"state name must be a non-empty string, got {name!r}")
    if name.startswith("__"):
        raise InvalidInputError(f"state names starting with '__' are reserved, got {name!r}")
    return name


class StateDescriptor:
    """Base class: ``name`` (non-empty, not starting with ``__``), ``kind``, ``ttl_config``
    (None, or a :class:`statecore.ttl.StateTtlConfig` set by :meth:`enable_time_to_live`) and
    ``ttl_migration`` (bool, set by :meth:`enable_ttl_migration`; not part of :meth:`meta`)."""

    kind = ""
    ttl_migration = False  # also the default of descriptors unpickled from before the flag

    def __init__(self, name: str):
        self.name = _check_name(name)
        self.ttl_config = None
        self.ttl_migration = False

    def enable_time_to_live(self, ttl_config) -> "StateDescriptor":
        """Give the state a time-to-live (Flink ``StateDescriptor.enableTimeToLive``); returns
        self. Raises InvalidInputError unless ``ttl_config`` is a StateTtlConfig."""
        from statecore.ttl import StateTtlConfig

        if not isinstance(ttl_config, StateTtlConfig):
            raise InvalidInputError(f"expected a StateTtlConfig, got {ttl_config!r}")
        self.ttl_config = ttl_config
        return self

    def enable_ttl_migration(self) -> "StateDescriptor":
        """Allow restored state written with TTL switched the other way (TTL in the checkpoint
        but not in this descriptor, or the reverse) to be converted instead of raising
        StateMigrationError; returns self. Works in both directions, so it is a flag of the
        descriptor, not of the TTL config; it is not written into snapshots, and when nothing
        differs it does nothing.

        The backend converts the state when it is matched to this descriptor: by ``get_state``
        for state restored before, by ``restore`` for a state registered before. Off -> on:
        every value, list element and map entry gets the TTL clock's current time as its
        last-access time (``backend.ttl_now``: the processing-time clock, or for event-time
        TTL the current watermark -- the lowest int64 before the first one, which the first
        watermark re-stamps as it does writes), so migrated entries count as written at
        migration time. On -> off: what is expired under the checkpoint's TTL config at the
        clock's current time (ms) is dropped -- it was invisible there -- and counted as
        ``migration`` in ``backend.ttl_statistics()``; the rest loses its timestamp. A list
        loses its expired elements, a map its expired entries, one by one.

        The next snapshot of the backend is a full one even if an incremental one is asked for
        (until a snapshot taken after the migration completes): its base is in the old format.
        See :mod:`statecore.ttl` "Migration" for the errors and the cost."""
        self.ttl_migration = True
        return self

    def _meta(self, **fields) -> dict:
        m = {"name": self.name, "kind": self.kind, **fields}
        if self.ttl_config is not None:
            m["ttl"] = self.ttl_config.meta()
        return m

    def meta(self) -> dict:
        """JSON-able description: ``name``, ``kind``, ``value_type``, kind-specific fields and
        ``ttl`` (the TTL config's meta) when TTL is enabled."""
        raise NotImplementedError

    def check_compatible(self, meta: dict, namespace_type: str | None = None) -> None:
        """Raise StateMigrationError if restored state ``meta`` cannot be read with this
        descriptor: kind, value_type, user_key_type or namespace_type differ, or TTL is enabled
        on one side only (values with and without the 8-byte timestamp suffix are different
        formats, as in Flink) and this descriptor did not request the conversion with
        :meth:`enable_ttl_migration` -- with it, a TTL on/off difference passes here and the
        backend converts the state. Other TTL settings (time to live, update type, cleanup)
        may change between runs."""
        mine = dict(self.meta())
        if namespace_type is not None:
            mine["namespace_type"] = namespace_type
        for f in _COMPAT_FIELDS:
            if f in mine and f in meta and mine[f] != meta[f]:
                raise StateMigrationError(
                    f"state {self.name!r}: descriptor has {f}={mine[f]!r} but the restored "
                    f"state has {f}={meta[f]!r}"
                )
        if bool(mine.get("ttl")) != bool(meta.get("ttl")) and not self.ttl_migration:
            raise StateMigrationError(
                f"state {self.name!r}: the restored state was written with TTL "
                f"{'enabled' if meta.get('ttl') else 'disabled'} but the descriptor has it "
                f"{'enabled' if mine.get('ttl') else 'disabled'}; call "
                "descriptor.enable_ttl_migration() to convert the restored state")

    def __repr__(self):
        return f"{type(self).__name__}({self.meta()!r})"


class ValueStateDescriptor(StateDescriptor):
    """One value per (key, namespace). ``value()`` returns a copy of ``default`` when absent.

    Raises InvalidInputError if ``default`` is not None and not a valid ``value_type`` value.
    """

    kind = "value"

    def __init__(self, name: str, value_type="pickle", default: Any = None):
        super().__init__(name)
        self.value_type = S.normalize_value_type(value_type)
        self.serializer = S.value_serializer(self.value_type)
        self.default = None if default is None else self.serializer.check(default)

    def default_value(self) -> Any:
        """The default for an absent value: a deep copy, so a caller mutating it (a pickled
        list, say) cannot change later reads; immutable defaults (None, numbers, str, bytes) are
        returned as they are (a deep copy would cost more than the per-record read itself)."""
        d = self.default
        if d is None or type(d) in _IMMUTABLE:
            return d
        return copy.deepcopy(d)

    def meta(self) -> dict:
        """``{"name", "kind": "value", "value_type"}``, plus ``ttl`` when TTL is enabled."""
        return self._meta(value_type=self.value_type)


class ListStateDescriptor(StateDescriptor):
    """A list of elements per (key, namespace); ``element_type`` is stored as ``value_type``."""

    kind = "list"

    def __init__(self, name: str, element_type="pickle"):
        super().__init__(name)
        self.value_type = S.normalize_value_type(element_type)
        self.element_type = self.value_type
        self.serializer = S.value_serializer(self.value_type)

    def meta(self) -> dict:
        """``{"name", "kind": "list", "value_type"}`` (the element type), plus ``ttl`` when TTL
        is enabled."""
        return self._meta(value_type=self.value_type)


class MapStateDescriptor(StateDescriptor):
    """A map per (key, namespace). User keys: int32/int64/string/binary/pickle (serialized with
    the key serializers; equality of user keys is equality of their serialized bytes)."""

    kind = "map"

    def __init__(self, name: str, user_key_type="pickle", user_value_type="pickle"):
        super().__init__(name)
        t = S.normalize_value_type(user_key_type)
        if t not in USER_KEY_TYPES:
            raise InvalidInputError(
                f"map user key type {t!r} is not supported; use one of {', '.join(USER_KEY_TYPES)}"
            )
        self.user_key_type = t
        self.value_type = S.normalize_value_type(user_value_type)
        self.user_value_type = self.value_type
        self.user_key_serializer = S.key_serializer(t)
        self.serializer = S.value_serializer(self.value_type)

    def meta(self) -> dict:
        """``{"name", "kind": "map", "value_type", "user_key_type"}`` (``value_type``: the user
        value type), plus ``ttl`` when TTL is enabled."""
        return self._meta(value_type=self.value_type, user_key_type=self.user_key_type)


class Reducer:
    """A reduce function for ReducingState: ``add(acc, v)`` returns the new aggregate, with
    ``acc`` None for the first value. Built-ins: ``sum``, ``min``, ``max`` (first value is the
    value itself), ``count`` (number of non-None values added; first add gives 1), ``first``
    (the first value added is kept) and ``last`` (the latest value added). A custom Python
    callable ``f(a, b) -> c`` behaves like Flink's ``ReduceFunction``; :meth:`vectorized` makes
    one that works on Arrow arrays, called once per round of a batch instead of once per row."""

    #: Set by :meth:`vectorized`: ``fn`` takes and returns Arrow arrays.
    is_vectorized = False

    def __init__(self, spec):
        if isinstance(spec, Reducer):
            self.name, self.fn = spec.name, spec.fn
            self.is_vectorized = spec.is_vectorized
        elif isinstance(spec, str):
            if spec not in BUILTIN_REDUCERS:
                raise InvalidInputError(
                    f"unknown reducer {spec!r}; use one of {', '.join(BUILTIN_REDUCERS)} "
                    "or a callable"
                )
            self.name, self.fn = spec, None
        elif callable(spec):
            self.name, self.fn = "custom", spec
        else:
            raise InvalidInputError(f"reducer must be a built-in name or a callable, got {spec!r}")

    @classmethod
    def vectorized(cls, fn) -> "Reducer":
        """A reduce function over Arrow arrays: ``fn(accumulators, values) -> array``, both
        arguments of the state's value type, equal length, no nulls; the result has that
        length and type (castable) and no nulls: element ``i`` reduces ``accumulators[i]``
        with ``values[i]``. ``add_batch`` calls it once per *round* -- round ``r`` holds the
        ``r``-th non-null row of every key of the batch -- so a batch costs as many calls as
        its most repeated key has rows (one call when keys are distinct), and the rows of one
        key still fold in row order. ``add`` calls it with arrays of length 1. The state's
        value type must be typed (not pickle). Raises InvalidInputError unless ``fn`` is
        callable."""
        if not callable(fn):
            raise InvalidInputError(f"a vectorized reducer needs a callable, got {fn!r}")
        r = cls(fn)
        r.name, r.is_vectorized = "vectorized", True
        return r

    @property
    def builtin(self) -> bool:
        """True for the built-in reducers (:data:`BUILTIN_REDUCERS`), False for a callable or a
        :meth:`vectorized` one."""
        return self.fn is None

    def add(self, acc, v):
        """New aggregate after adding ``v`` (not None) to ``acc`` (None when absent)."""
        n = self.name
        if n == "count":
            return 1 if acc is None else acc + 1
        if acc is None:
            return v
        if n == "first":
            return acc
        if n == "last":
            return v
        if n == "sum":
            return acc + v
        if n == "min":
            return v if v < acc else acc
        if n == "max":
            return v if v > acc else acc
        if self.is_vectorized:
            return self.fold_arrays([acc], [v])[0]
        return self.fn(acc, v)

    def fold_arrays(self, accs: list, values: list) -> list:
        """The vectorized function over two equal-length lists of non-null Python values of
        the state's value type (``self.arrow_type``, set by the descriptor): the reduced values
        as a list of per-record values (ints for timestamps).
        Raises InvalidInputError when ``fn`` fails or returns a wrong array."""
        import pyarrow as pa

        t = self.arrow_type
        try:
            got = self.fn(pa.array(accs, t), pa.array(values, t))
        except InvalidInputError:
            raise
        except Exception as e:
            raise InvalidInputError(f"vectorized reducer failed: {type(e).__name__}: {e}") from e
        if isinstance(got, pa.ChunkedArray):
            got = got.combine_chunks()
        if not isinstance(got, pa.Array) or len(got) != len(accs):
            raise InvalidInputError(
                f"vectorized reducer must return an Arrow array of length {len(accs)}, got "
                f"{type(got).__name__}"
                + (f" of length {len(got)}" if isinstance(got, pa.Array) else ""))
        if got.type != t:
            try:
                got = got.cast(t)
            except Exception as e:
                raise InvalidInputError(
                    f"vectorized reducer returned {got.type}, not {t}: {e}") from e
        if got.null_count:
            raise InvalidInputError(f"vectorized reducer returned {got.null_count} null(s)")
        return S.value_serializer(t).to_pylist(got)


class ReducingStateDescriptor(StateDescriptor):
    """One aggregate per (key, namespace) folded with ``reducer`` on every ``add``.

    ``value_type`` defaults to int64 for ``count`` (the only allowed type for it) and to pickle
    otherwise; ``sum`` needs int32/int64/uint64/float64/pickle (an integer sum that overflows
    its type raises InvalidInputError and changes nothing); ``min``/``max`` any type but bool
    (fixed_size_binary and binary compare as bytes); ``first``/``last`` any type.
    Raises InvalidInputError on an unknown reducer or an unsupported type.
    """

    kind = "reducing"

    def __init__(self, name: str, reducer, value_type=None):
        super().__init__(name)
        self.reducer = Reducer(reducer)
        r = self.reducer.name
        if value_type is None:
            value_type = "int64" if r == "count" else "pickle"
        self.value_type = S.normalize_value_type(value_type)
        if r == "count" and self.value_type != "int64":
            raise InvalidInputError(f"reducer 'count' stores int64, not {self.value_type}")
        if r == "sum" and self.value_type.startswith("timestamp"):
            raise InvalidInputError(
                f"reducer 'sum' does not apply to {self.value_type} values (a sum of instants is "
                "no instant); use min, max, first, last or count, or sum an int64 state")
        if r == "sum" and self.value_type not in _NUMERIC + ("pickle",):
            raise InvalidInputError(
                f"reducer 'sum' needs a numeric value type, not {self.value_type}")
        if r in ("min", "max") and self.value_type == "bool":
            raise InvalidInputError(f"reducer {r!r} does not support bool values")
        self.serializer = S.value_serializer(self.value_type)
        if self.reducer.is_vectorized:
            if self.serializer.arrow_type is None:
                raise InvalidInputError("a vectorized reducer needs a typed value type, not pickle")
            self.reducer.arrow_type = self.serializer.arrow_type

    def meta(self) -> dict:
        """``{"name", "kind": "reducing", "value_type", "reducer"}`` (``reducer``: the built-in
        name, ``"custom"`` or ``"vectorized"``; informative, not checked on restore), plus
        ``ttl`` when TTL is enabled."""
        return self._meta(value_type=self.value_type, reducer=self.reducer.name)


class AggregateFunction:
    """Flink ``AggregateFunction``: subclass and implement the three methods, and ``merge``
    for merging windows.

    ``create_accumulator() -> acc``; ``add(value, acc) -> acc``; ``get_result(acc) -> result``;
    optionally ``merge(a, b) -> acc``, which ``AggregatingState.merge_namespaces`` needs.
    The accumulator is stored with the descriptor's ``accumulator_type`` serializer.
    """

    def create_accumulator(self):
        """A new accumulator, for a key and namespace without one (Flink
        ``createAccumulator``). The base class raises NotImplementedError."""
        raise NotImplementedError

    def add(self, value, accumulator):
        """The accumulator after adding ``value`` (a Python value, never None; Flink ``add``);
        may modify ``accumulator`` in place and return it. The base class raises
        NotImplementedError."""
        raise NotImplementedError

    def get_result(self, accumulator):
        """What reads return for ``accumulator`` (Flink ``getResult``): ``get()``, and the rows
        of ``add_batch``/``get_batch`` (of the descriptor's ``result_type``). The base class
        raises NotImplementedError."""
        raise NotImplementedError

    def merge(self, a, b):
        """One accumulator holding what the accumulators ``a`` and ``b`` hold (Flink
        ``merge``); may modify ``a`` in place and return it. Only
        ``AggregatingState.merge_namespaces`` (merging windows) calls it, with ``a`` the
        accumulator merged so far (the target's when it has one); a function that does not
        override it cannot merge namespaces (InvalidInputError there). The base class raises
        NotImplementedError."""
        raise NotImplementedError


class AggregatingStateDescriptor(StateDescriptor):
    """One accumulator per (key, namespace); ``get()`` returns ``get_result(acc)``.

    ``aggregate_function`` needs ``create_accumulator``, ``add`` and ``get_result`` methods
    (InvalidInputError otherwise). ``result_type``: the statecore type (int64, float64,
    string, ...) of the results that ``add_batch``/``get_batch`` return as an Arrow array;
    None infers it from the results (pyarrow's inference). Not part of the stored format."""

    kind = "aggregating"

    def __init__(self, name: str, aggregate_function, accumulator_type="pickle",
                 result_type=None):
        super().__init__(name)
        for m in ("create_accumulator", "add", "get_result"):
            if not callable(getattr(aggregate_function, m, None)):
                raise InvalidInputError(
                    f"aggregate_function must have a callable {m}() (see AggregateFunction)"
                )
        self.aggregate_function = aggregate_function
        self.value_type = S.normalize_value_type(accumulator_type)
        self.accumulator_type = self.value_type
        self.serializer = S.value_serializer(self.value_type)
        self.result_type = None
        if result_type is not None:
            self.result_type = S.value_serializer(S.normalize_value_type(result_type)).arrow_type
            if self.result_type is None:
                raise InvalidInputError("result_type must be an Arrow-typed value type, not pickle")

    def meta(self) -> dict:
        """``{"name", "kind": "aggregating", "value_type", "aggregate_function"}``
        (``value_type``: the accumulator type; ``aggregate_function``: the function's class
        name, informative, not checked on restore), plus ``ttl`` when TTL is enabled."""
        return self._meta(value_type=self.value_type,
                          aggregate_function=type(self.aggregate_function).__qualname__)
